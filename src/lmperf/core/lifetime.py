"""A process that dies with its parent, and its age (no torch here: the runner's light client uses it)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys


def die_with_parent(signum: int = signal.SIGTERM, parent: int | None = None) -> None:
    """Have the kernel send ``signum`` to this process when its parent dies (Linux; elsewhere a no-op).

    Without it a cell outlives a killed Snakemake and keeps holding its GPU while the rerun starts
    the same cell again. If the parent is already gone (the race between fork and prctl), exit now:
    ``parent`` is its pid as a forked child knows it (the forking process's, taken before the fork;
    by default the parent now, which misses a parent that died before this call).
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid() if parent is None else parent
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)


def proc_age_s() -> float | None:
    """Seconds since this process started, from /proc; None where there is none."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")
