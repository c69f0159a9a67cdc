"""A cell's process lifetime: it dies with the Snakemake that started it (no torch here: the fork
server's light client uses it too)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys


def forked_cell() -> bool:
    """True in a cell forked by the fork server (its parent is the server, which ends it when the
    client goes away; see lmperf.cells.forkserver)."""
    pid, _, _ = os.environ.get("LMPERF_PROCESS_START", "").partition(":")
    return pid == str(os.getpid())


def die_with_parent() -> None:
    """Have the kernel end this process when its parent (the Snakemake that started it) dies.

    Without it a cell outlives a killed Snakemake and keeps holding its GPU while the rerun starts
    the same cell again. Rules start cells with `exec`, so the parent is Snakemake itself, not a
    shell. Linux only (prctl PR_SET_PDEATHSIG); elsewhere nothing changes.
    """
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
