"""The one cell runner: ``python -m lmperf [--budget-s S] <cell> [args…]``, a fresh process per cell.

Every rule starts its cell this way. The cell runs in a process of its own (warm-up 0 means a
cold process, and an out-of-memory error stays inside its cell), started fast: when the run's
warm parent is there (``lmperf.core.warm``, started by the Snakemake run itself, living only as
long as that run), this light client (no torch) hands it the cell's argv, working directory,
environment and standard streams, and the parent forks the cell from a process that has already
imported torch. Otherwise (no warm parent: SLURM jobs, ``LMPERF_WARM=0``, a test calling the
runner by hand) the cell runs here, importing everything itself.

Either way:
- the cell is Snakemake's job: when this client is stopped (SIGINT, SIGTERM, SIGHUP) or dies
  (kill -9), the cell is killed, with every process it started;
- a cell that runs past ``--budget-s`` (the rule's ``runtime`` resource) is killed and the job
  fails, saying so in its log;
- the run's limits (ulimit, nice, cgroup) apply: the warm parent is the run's own child.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys
import time

from lmperf.core.lifetime import die_with_parent, proc_age_s
from lmperf.kinds import CELLS

ENV_SOCKET = "LMPERF_WARM_SOCKET"  # the warm parent's abstract socket name, set by the run
ENV_START = "LMPERF_PROCESS_START"  # "<pid>:<epoch s>": the client's start, for the forked cell's age
KILLED_BY_BUDGET = 124


def cell_main(cell: str):
    """The ``main(argv)`` of cell ``cell`` (a name of ``lmperf.kinds.CELLS``)."""
    if cell not in CELLS:
        raise SystemExit(f"unknown cell {cell!r}; known: {', '.join(sorted(CELLS))}")
    return importlib.import_module(CELLS[cell]).main


def run_here(argv: list[str]) -> int:
    """Run the cell in this process."""
    main = cell_main(argv[0])
    sys.argv = [argv[0], *argv[1:]]
    return main(argv[1:]) or 0


def _connect(name: str) -> socket.socket | None:
    """A connection to the run's warm parent, checked to be this user's; None when there is none."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect("\0" + name)
    except OSError:
        sock.close()
        return None
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if uid != os.getuid():
        sock.close()
        raise SystemExit(f"the warm parent's socket {name!r} belongs to uid {uid}, not to this user: refusing it")
    return sock


def run_forked(sock: socket.socket, argv: list[str], budget_s: float | None) -> int:
    """Have the warm parent fork the cell; wait for its exit status, at most ``budget_s``."""
    start = os.environ.get(ENV_START, "")  # honoured only when it names this process (a wrapper that exec'd it)
    if start.partition(":")[0] != str(os.getpid()):
        start = f"{os.getpid()}:{time.time() - (proc_age_s() or 0.0)}"
    env = dict(os.environ, **{ENV_START: start})
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": env}).encode()
    socket.send_fds(sock, [struct.pack("!I", len(request)) + request], [0, 1, 2])
    deadline = None if budget_s is None else time.monotonic() + budget_s
    stop = _stop_signals()
    try:
        while True:
            wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            ready, _, _ = select.select([sock, stop], [], [], wait)
            if sock in ready:
                reply = sock.recv(64)
                if not reply:
                    print("lmperf: the warm parent went away; the cell was killed", file=sys.stderr)
                    return 1
                return int(reply.decode())
            if stop in ready:
                signum = os.read(stop, 1)[0]
                return 128 + signum  # closing the socket (below) has the parent kill the cell
            if deadline is not None and time.monotonic() >= deadline:
                print(f"lmperf: the cell ran past its budget of {budget_s:.0f} s: killed", file=sys.stderr)
                return KILLED_BY_BUDGET
    finally:
        sock.close()


def _stop_signals() -> int:
    """A pipe that SIGINT, SIGTERM and SIGHUP write their number to (select wakes on it)."""
    read, write = os.pipe()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda s, _f: os.write(write, bytes([s])))
    return read


def _budget_alarm(budget_s: float | None) -> None:
    """In-process runs: past its budget the cell ends with code 124, saying so as the forked path
    does (a budget of 0 ends it at once there too; setitimer would read 0 as no limit). A cell
    stuck in C code, where no Python handler runs, is ended 10 s later by faulthandler's thread."""

    def killed(*_):
        print(f"lmperf: the cell ran past its budget of {budget_s:.0f} s: killed", file=sys.stderr, flush=True)
        os._exit(KILLED_BY_BUDGET)

    if budget_s is not None:
        signal.signal(signal.SIGALRM, killed)
        signal.setitimer(signal.ITIMER_REAL, max(budget_s, 1e-6))
        faulthandler.dump_traceback_later(budget_s + 10, exit=True)


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # rules `exec` the client: it is Snakemake's child and goes when Snakemake goes
    parser = argparse.ArgumentParser(prog="python -m lmperf", description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=None, help="kill the cell past this many seconds")
    parser.add_argument("cell", choices=sorted(CELLS), help="which cell to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the cell's own arguments")
    options = parser.parse_args(sys.argv[1:] if argv is None else argv)
    argv = [options.cell, *options.args]
    name = os.environ.get(ENV_SOCKET)
    sock = _connect(name) if name else None
    if sock is not None:
        return run_forked(sock, argv, options.budget_s)
    _budget_alarm(options.budget_s)
    return run_here(argv)
