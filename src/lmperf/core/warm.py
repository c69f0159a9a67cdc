"""The run's warm parent: a process that has imported torch and the cells, and forks each cell.

Started by the Snakemake run (``onstart`` in workflow/rules/common.smk) as its own child, so the
run's limits (ulimit, nice, cgroup) are its limits and its cells', and it dies with the run
(PR_SET_PDEATHSIG). It listens on an abstract Unix socket whose random name only the run's
environment holds (nothing on disk, nothing under /tmp), accepts connections only from its own
user (SO_PEERCRED), and for each request of ``lmperf.core.runner``'s client forks one cell:

- the cell gets the client's standard streams, working directory, environment and argv, and a
  process group of its own (so everything it starts is killed with it);
- when the cell exits, the client gets its exit status; when the client goes (its job stopped
  or killed), the cell's process group is killed; when this parent dies, the cell gets SIGKILL.

It never initialises CUDA (a forked child could not use it): it imports torch and the cell
modules only, and checks that no import started CUDA.

    python -m lmperf.core.warm NAME     (NAME: the socket's name, without the leading NUL)
"""

from __future__ import annotations

import importlib
import io
import json
import os
import selectors
import signal
import socket
import struct
import sys

from lmperf.core.lifetime import die_with_parent
from lmperf.core.runner import ENV_START
from lmperf.kinds import CELLS

# torch._dynamo: every AdamW construction imports it (about 2-5 s); Inductor stays out (its import
# asks CUDA whether it is there, which a forked child could not use: docs/decisions/inductor-preload.md)
PRELOAD = ("torch", "torch._dynamo", "torch.profiler", "triton", "numpy", "jsonschema")
MAX_REQUEST_BYTES = 1 << 22


def preload() -> None:
    """Import torch and every cell module, none of which may initialise CUDA."""
    for name in (*PRELOAD, *CELLS.values()):
        try:
            importlib.import_module(name)
        except ImportError as error:
            if name.startswith("lmperf."):
                raise
            print(f"lmperf.core.warm: {name} not imported ({error})", file=sys.stderr)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise RuntimeError("an import initialised CUDA: forked cells could not use it")


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("client closed the connection mid-request")
        data += chunk
    return data


def read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request: a length-prefixed JSON object {argv, cwd, env} and the client's three std fds."""
    head, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
    if len(head) < 4:
        head += _recv_exact(conn, 4 - len(head))
    (length,) = struct.unpack("!I", head)
    if length > MAX_REQUEST_BYTES or len(fds) != 3:
        raise ValueError(f"malformed request ({length} bytes, {len(fds)} descriptors)")
    request = json.loads(_recv_exact(conn, length))
    if not (
        isinstance(request, dict)
        and isinstance(request.get("argv"), list)
        and all(isinstance(a, str) for a in request["argv"])
        and isinstance(request.get("cwd"), str)
        and isinstance(request.get("env"), dict)
    ):
        raise ValueError("malformed request")
    return request, fds


def _child(request: dict, fds: list[int], parent: int) -> None:
    """In the forked cell: take on the client's streams, directory and environment; run the cell;
    never return into the parent's loop."""
    code = 1
    try:
        code = _run_cell(request, fds, parent)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if not isinstance(exit_.code, int) and exit_.code is not None:
            print(exit_.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _run_cell(request: dict, fds: list[int], parent: int) -> int:
    die_with_parent(signal.SIGKILL, parent)  # the parent's pid from before the fork: it may be gone already
    os.setpgid(0, 0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    # the process's own streams, on the client's descriptors, line-buffered (stderr written through)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False), write_through=True)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # the cell's age counts from its client's start: lmperf.core.device.process_age_s honours the
    # client's start only under the pid it names, which must now be the cell's
    client_start = os.environ.get(ENV_START, "").partition(":")[2]
    if client_start:
        os.environ[ENV_START] = f"{os.getpid()}:{client_start}"
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        sys.modules["torch"].set_num_threads(int(threads))
    from lmperf.core.runner import run_here

    return run_here(request["argv"])


def serve(name: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}  # cell pid -> its client's connection
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: os.write(wake_w, b"."))
    selector.register(wake_r, selectors.EVENT_READ)
    print(f"lmperf.core.warm: ready (pid {os.getpid()})", file=sys.stderr, flush=True)
    print("ready", flush=True)  # the run waits for this line (workflow/rules/common.smk)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # nobody reads the pipe after that line
    os.close(devnull)
    while True:
        for key, _ in selector.select(timeout=5.0):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                _accept(conn, selector, children)
            elif key.fileobj == wake_r:
                os.read(wake_r, 4096)
            else:  # a client closed its connection (stopped or killed) before its cell ended
                _kill_cell_of(key.fileobj, children)
        _reap(selector, children)


def _accept(conn, selector, children) -> None:
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    if uid != os.getuid():
        conn.close()
        return
    try:
        conn.settimeout(10)
        request, fds = read_request(conn)
    except (OSError, ValueError, ConnectionError) as error:
        print(f"lmperf.core.warm: bad request: {error}", file=sys.stderr, flush=True)
        conn.close()
        return
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _child(request, fds, parent)
    try:
        os.setpgid(pid, pid)  # here too: the cell's group exists before the child runs, to be killed with it
    except OSError:
        pass  # the child has set it itself, or is gone
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    selector.register(conn, selectors.EVENT_READ)


def _kill_cell_of(conn, children) -> None:
    for pid, c in list(children.items()):
        if c is conn:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _reap(selector, children) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        try:
            os.killpg(pid, signal.SIGKILL)  # what the cell left behind goes with it
        except (ProcessLookupError, PermissionError):
            pass
        selector.unregister(conn)
        try:
            code = os.waitstatus_to_exitcode(status)
            conn.sendall(str(code if code >= 0 else 128 - code).encode())
        except OSError:
            pass
        conn.close()


def main() -> None:
    die_with_parent(signal.SIGKILL)
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m lmperf.core.warm NAME")
    preload()
    serve(sys.argv[1])


if __name__ == "__main__":
    main()
