"""`python -m lmperf.cells <kind> [args…]`: the one way rules start a cell.

Runs ``lmperf.cells.<kind>.main(argv)`` in a fresh process per cell. By default that process is
forked from a per-user server that has already imported torch, triton and the cell modules (and
never initialised CUDA), which saves the seconds of imports every cell would otherwise pay; see
``lmperf.cells.forkserver``. This client stays light (no torch): it hands the server its
stdin/stdout/stderr, working directory, environment and arguments, forwards signals to the
child and exits with the child's code. The child is killed if this client dies.

It runs the cell in this process instead (as before the server existed) when
``LMPERF_FORKSERVER=0``, under SLURM, where Unix sockets or fd passing are missing, or when
anything about the server fails before the cell starts.
"""

from __future__ import annotations

import os
import sys

from lmperf.cells.forkserver import run_in_process, run_via_server
from lmperf.cells.lifetime import die_with_parent


def use_forkserver(env=os.environ) -> bool:
    if env.get("LMPERF_FORKSERVER", "1").lower() in ("0", "false", "no", "off"):
        return False
    if env.get("SLURM_JOB_ID"):  # a batch job is its own fresh process on its own node
        return False
    import socket

    return sys.platform.startswith("linux") and hasattr(socket, "send_fds") and hasattr(socket, "AF_UNIX")


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # this process is Snakemake's child (rules `exec` it): it goes when Snakemake goes
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        print("usage: python -m lmperf.cells <kind> [args…]", file=sys.stderr)
        return 2
    if use_forkserver():
        code = run_via_server(argv)
        if code is not None:
            return code
    return run_in_process(argv)


if __name__ == "__main__":
    sys.exit(main())
