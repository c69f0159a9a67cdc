"""A pre-imported parent that forks one fresh process per cell (per-cell start-up without the imports).

Importing torch, triton and the cell modules takes seconds; every cell used to pay them. The
server pays them once: it imports everything a cell needs but never initialises CUDA, listens
on a per-user Unix socket and, for each request of ``python -m lmperf.cells`` (the client, in
``__main__``), forks a child that takes the client's stdin/stdout/stderr (passed as file
descriptors), working directory, environment and argv, runs ``lmperf.cells.<kind>.main`` and
exits. A cell still has a process of its own, CUDA context and allocator included.

- The client forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to the child's process group and exits with
  the child's status; if the client dies (killed, Snakemake stopped), the server kills the child.
- Stale code never runs: the client sends a hash of ``src/lmperf`` (paths, sizes, mtimes); a server
  started from other sources stops listening, lets its running children finish and exits, and
  the client starts a fresh one. Interpreter, ``PYTHONPATH``, lmperf's location and the
  variables read at import time (``TORCH*``, ``TRITON*``, ``OMP_*``, …) pick the socket, so
  differing set-ups get different servers.
- The server exits after ``LMPERF_FORKSERVER_IDLE_S`` (default 120) seconds without a cell.
- What the server imported is frozen (``gc.freeze``) before it forks: a cell's full garbage
  collections skip those ~300k objects (a full collection over them takes ~0.1 s, a stall that
  could land inside a measured step) and leave the shared pages unwritten.
- Cells measure start-up from the client's start: the child carries it in ``LMPERF_PROCESS_START``
  (``<pid>:<epoch seconds>``, read by ``lmperf.device.process_age_s``; an ``os.execv``
  restart keeps the pid and so the start).

Socket, lock and server log: ``$LMPERF_FORKSERVER_DIR`` (default ``/tmp/lmperf-forkserver-<uid>``).
This module imports nothing heavy at module level: the client imports it too.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

LMPERF_DIR = Path(__file__).resolve().parents[1]
IMPORT_ENV_PREFIXES = (
    "TORCH",
    "PYTORCH",
    "TRITON",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "CUBLAS",
    "CUDA_MODULE_LOADING",
    "CUDA_VISIBLE_DEVICES",  # what torch.cuda.is_available() answers, which the server asks once (_preload)
    "LD_",
    "PYTHON",
)
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
# imported by the server before any cell: what every cell needs, and torch.compile's front end (dynamo)
# that the compiled cells would otherwise import each time (seconds). None of it may initialise CUDA; `_preload`
# checks after every import and names the one that did.
PRELOAD = ("torch", "triton", "numpy", "jsonschema", "torch._dynamo")
# Imported after PRELOAD and the cell modules with torch.cuda.is_available answered without CUDA
# (`_cuda_answered`): Inductor's back end, which `layer.compile()` imports in a compiled cell (a compiled
# cell's start to its first step took 2.2 s longer than an eager one's in the H100's records). Imported
# as it is, it initialises CUDA: bench/preload_probe.py on an H100 (torch 2.11) names
# torch._inductor.runtime.benchmarking, whose module level (read on that machine) picks the benchmarker
# with `config.use_experimental_benchmarker and torch.cuda.is_available()`, and is_available starts the
# driver (PYTORCH_NVML_BASED_CUDA_CHECK=1 or not). Answered with what a fresh process of this
# interpreter and environment gets (asked in a subprocess), the import picks the benchmarker the cell
# would have picked itself and leaves CUDA alone. (TORCHINDUCTOR_USE_EXPERIMENTAL_BENCHMARKER=0 would
# also leave it alone, but by picking another benchmarker for Inductor's kernel choices.) Should another
# torch initialise CUDA in this import all the same, the server restarts without it
# (`_restart_without_answered`). Checked on CPU only so far; bench/inductor_preload_check.sh is the
# check on a GPU (bench/grid_time_notes.md).
PRELOAD_CUDA_ANSWERED = ("torch._inductor.compile_fx",)
# set by a server that restarts itself without PRELOAD_CUDA_ANSWERED (`_restart_without_answered`)
WITHOUT_ANSWERED_ENV = "LMPERF_FORKSERVER_WITHOUT_ANSWERED"
# present wherever the NVIDIA driver is loaded: without it torch.cuda.is_available() is False
NVIDIA_DRIVER_DEVICE = Path("/dev/nvidiactl")


# ---------------------------------------------------------------------------------------------
# Shared by client and server


def source_hash(root: Path = LMPERF_DIR) -> str:
    """Hash of every Python file's path, size and mtime under lmperf: changes when any source does."""
    digest = hashlib.sha1()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                st = os.stat(path)
                digest.update(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def server_key(env=os.environ) -> str:
    """What a server fixes at start (interpreter, import path, import-time variables): one socket each."""
    parts = [sys.executable, str(LMPERF_DIR)]
    parts += [f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(IMPORT_ENV_PREFIXES)]
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()[:16]


def server_dir(env=os.environ) -> Path:
    return Path(env.get("LMPERF_FORKSERVER_DIR") or f"/tmp/lmperf-forkserver-{os.getuid()}")


def process_start_epoch() -> float:
    """Wall-clock time this process started (from /proc; now where /proc is missing)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        return time.time() - (uptime_s - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def _send_json(sock: socket.socket, obj: dict) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


class _Lines:
    """Newline-delimited JSON messages from a stream socket."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer = sock, b""

    def read(self) -> dict | None:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


# ---------------------------------------------------------------------------------------------
# Client


NOT_KINDS = {"common", "forkserver", "__main__"}  # modules of lmperf.cells that are no cell


def run_in_process(argv: list[str]) -> int:
    """Import the cell module and call its ``main`` here."""
    import importlib

    kind, rest = argv[0], argv[1:]
    if kind in NOT_KINDS:
        print(f"unknown cell kind {kind!r}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(f"lmperf.cells.{kind}")
    except ModuleNotFoundError as error:
        if error.name != f"lmperf.cells.{kind}":
            raise
        print(f"unknown cell kind {kind!r}", file=sys.stderr)
        return 2
    sys.argv = [f"lmperf.cells.{kind}", *rest]
    return module.main(rest) or 0


def _note(message: str) -> None:
    print(f"[lmperf.cells] {message}", file=sys.stderr, flush=True)


def _std_fds() -> list[int]:
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        return sock
    except OSError:
        sock.close()
        return None


def _start_server(directory: Path, path: Path, digest: str) -> socket.socket | None:
    """Start a detached server and wait until it listens; None if it died or took too long."""
    import subprocess

    with open(path.with_suffix(".log"), "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "lmperf.cells.forkserver", str(path), digest],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            cwd=str(directory),
            close_fds=True,
        )
    deadline = time.monotonic() + float(os.environ.get("LMPERF_FORKSERVER_START_S", "120"))
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = path.with_suffix(".log").read_bytes()[-2000:].decode(errors="replace")
            _note(
                f"fork server exited with {process.returncode} while starting (not retried until the sources "
                f"change; {path.with_suffix('.failed')}):\n{tail}"
            )
            path.with_suffix(".failed").write_text(digest)
            return None
        sock = _connect(path)
        if sock is not None:
            return sock
        time.sleep(0.02)
    _note("fork server did not listen in time")
    return None


def _request(sock: socket.socket, argv: list[str], digest: str, start: float) -> None:
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "hash": digest, "start": start}
    data = json.dumps(request).encode()
    fds = _std_fds()
    socket.send_fds(sock, [len(data).to_bytes(8, "big") + data], fds)


def _spawn(argv: list[str]) -> tuple[socket.socket, _Lines, int] | None:
    """Connect (starting a server if none listens), send the request, return (socket, reader, child pid)."""
    import fcntl

    start = process_start_epoch()
    directory = server_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = directory.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        _note(f"{directory} is not private to this user; running in-process")
        return None
    digest = source_hash()
    path = directory / f"{server_key()}.sock"
    failed = path.with_suffix(".failed")
    if failed.exists() and failed.read_text() == digest:
        return None  # a server from these sources could not start: run in-process without trying again
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one client at a time talks to (or starts) the server
        for _attempt in range(3):
            sock = _connect(path) or _start_server(directory, path, digest)
            if sock is None:
                return None
            _request(sock, argv, digest, start)
            reader = _Lines(sock)
            reply = reader.read()
            if reply and "pid" in reply:
                return sock, reader, int(reply["pid"])
            sock.close()
            if not reply or reply.get("status") != "stale":
                _note(f"fork server answered {reply!r}; running in-process")
                return None
            # A server from older sources: it has stopped listening; start a fresh one.
        return None


def run_via_server(argv: list[str]) -> int | None:
    """Run the cell in a child of the fork server; its exit code, or None where the server failed
    before the cell started (the caller then runs it in-process)."""
    child = {"pid": None}
    pending: list[int] = []

    def forward(signum, _frame):
        if child["pid"] is None:
            pending.append(signum)
            return
        try:
            os.killpg(child["pid"], signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    try:
        spawned = _spawn(argv)
    except Exception as exc:  # noqa: BLE001 - any failure before the cell starts: run it in-process
        _note(f"fork server unavailable ({type(exc).__name__}: {exc}); running in-process")
        spawned = None
    if spawned is None:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if pending:
            os.kill(os.getpid(), pending[0])
        return None
    sock, reader, child["pid"] = spawned
    for signum in pending:
        forward(signum, None)
    while True:
        try:
            reply = reader.read()
            break
        except InterruptedError:
            continue
    sock.close()
    if reply is None or "exit_status" not in reply:
        _note("fork server went away before the cell finished")
        return 1
    code = os.waitstatus_to_exitcode(reply["exit_status"])
    if code < 0:  # killed by a signal: end the same way
        for s in previous:
            signal.signal(s, signal.SIG_DFL)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


# ---------------------------------------------------------------------------------------------
# Server


def _cuda_threads() -> list[str]:
    """Names of this process's threads that the CUDA driver started (cuInit starts them)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/comm") as f:
            names.append(f.read().strip())
    return [name for name in names if name.startswith("cuda")]


def _cuda_available_in_a_fresh_process() -> subprocess.Popen | bool:
    """What torch.cuda.is_available() answers in a fresh process of this interpreter and environment:
    False where no NVIDIA driver is loaded (no ``NVIDIA_DRIVER_DEVICE``), else a started subprocess
    that prints it (read with `_answer`), so that this process's driver stays uninitialised and the
    subprocess's import of torch runs beside this one's."""
    if not NVIDIA_DRIVER_DEVICE.exists():
        return False
    return subprocess.Popen(
        [sys.executable, "-c", "import torch; print(int(torch.cuda.is_available()))"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _answer(asked: subprocess.Popen | bool) -> bool | None:
    """The answer of `_cuda_available_in_a_fresh_process`; None, with a note in the server's log, where
    the subprocess could not give one."""
    if isinstance(asked, bool):
        return asked
    out, err = asked.communicate()
    lines = out.strip().splitlines()
    if asked.returncode != 0 or not lines or lines[-1] not in ("0", "1"):
        print(f"asking torch.cuda.is_available() in a subprocess failed:\n{err[-2000:]}", file=sys.stderr, flush=True)
        return None
    return lines[-1] == "1"


@contextlib.contextmanager
def _cuda_answered(available: bool):
    """torch.cuda.is_available returns ``available`` inside, without asking the driver."""
    import torch

    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: available
    try:
        yield
    finally:
        torch.cuda.is_available = real


def _preload() -> None:
    """Import what the cells need; raise, naming the module, if an import initialised CUDA.

    Loading libcuda is fine (torch links it); initialising the driver is not: cuInit starts the
    driver's threads (cuda-EvtHandlr, cuda00001400006, …), and a forked child could not use it.
    """
    import importlib
    import pkgutil

    answered = () if os.environ.get(WITHOUT_ANSWERED_ENV) else PRELOAD_CUDA_ANSWERED
    asked = _cuda_available_in_a_fresh_process() if answered else False

    import lmperf.cells

    names = list(PRELOAD)
    names += [
        f"lmperf.cells.{info.name}"
        for info in pkgutil.iter_modules(lmperf.cells.__path__)
        if info.name not in ("__main__", "forkserver")
    ]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            if name.startswith("lmperf."):
                raise
            continue
        _check_cuda_untouched(name)
    available = _answer(asked) if answered and "torch" in sys.modules else None
    if available is None:
        if not isinstance(asked, bool) and asked.poll() is None:
            asked.kill()
            asked.wait()
        return  # the cells import Inductor themselves
    with _cuda_answered(available):
        for name in answered:
            try:
                importlib.import_module(name)
            except ImportError:
                continue  # a torch without it: the cells that compile will say so
            try:
                _check_cuda_untouched(name)
            except RuntimeError as exc:
                _restart_without_answered(exc)


def _restart_without_answered(why: Exception) -> None:
    """An import of PRELOAD_CUDA_ANSWERED initialised CUDA all the same (another torch than the one
    bench/preload_probe.py saw): this process cannot fork usable children, so it replaces itself (the
    driver goes with the old image) with a server that leaves those imports to the cells. Its children
    get the clients' environments, without the variable that says so."""
    print(f"{why}\nrestarting without {', '.join(PRELOAD_CUDA_ANSWERED)}", file=sys.stderr, flush=True)
    os.environ[WITHOUT_ANSWERED_ENV] = "1"
    os.execv(sys.executable, [sys.executable, "-m", "lmperf.cells.forkserver", *sys.argv[1:]])


def _check_cuda_untouched(name: str) -> None:
    threads = _cuda_threads()
    if threads or ("torch" in sys.modules and sys.modules["torch"].cuda.is_initialized()):
        raise RuntimeError(
            f"importing {name} initialised CUDA (driver threads {threads}); forked children could not use it. "
            "Leave it out of the server's imports (lmperf.cells.forkserver.PRELOAD, PRELOAD_CUDA_ANSWERED, "
            "or the cell modules' module-level imports)."
        )


def _child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the client's process and run the cell. Never returns."""
    code = 1
    try:
        os.setsid()  # its own process group: signals and kills reach the cell and its children
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        # the client's streams, buffered as the interpreter would for them (line-buffered on a terminal)
        sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115 - they live as long as the process
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ["LMPERF_PROCESS_START"] = f"{os.getpid()}:{request['start']!r}"
        if sys.path and sys.path[0] == _SERVER_PATH0:  # `python -m` puts the working directory first
            sys.path[0] = request["cwd"]
        try:
            code = run_in_process(list(request["argv"]))
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            import traceback

            traceback.print_exc()
            _flush_and_run_atexit()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:  # noqa: BLE001 - as the interpreter would: traceback, exit 1
            import traceback

            traceback.print_exc()
            code = 1
        _flush_and_run_atexit()
    finally:
        os._exit(code if isinstance(code, int) else 1)


def _flush_and_run_atexit() -> None:
    import atexit

    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed or broken stream: nothing left to flush
                stream.flush()


def _receive_request(conn: socket.socket) -> tuple[dict, list[int]]:
    conn.settimeout(10)
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
    if len(data) < 8:
        raise ValueError("short request")
    size = int.from_bytes(data[:8], "big")
    body = data[8:]
    while len(body) < size:
        chunk = conn.recv(min(1 << 20, size - len(body)))
        if not chunk:
            raise ValueError("truncated request")
        body += chunk
    conn.settimeout(None)
    return json.loads(body), list(fds)


def _kill(pid: int) -> None:
    """SIGKILL a child's process group (the cell and what it started), or the child alone."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def serve(path: Path, idle_s: float) -> int:
    import fcntl
    import selectors

    digest = source_hash()  # before the imports: any later edit makes this server stale
    _preload()
    # Move everything imported so far out of the collector's reach: a child's full collections then
    # walk only its own objects (torch and the preload hold ~300k objects, ~0.1 s per full collection,
    # a stall inside a measured step), and collections no longer write to the shared pages (no
    # copy-on-write of the parent's heap).
    gc.collect()
    gc.freeze()
    if path.exists():
        path.unlink()  # a dead server's socket; the starting client holds the lock
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    bound_inode = path.stat().st_ino
    print(f"fork server {os.getpid()} listening on {path} (sources {digest[:12]})", file=sys.stderr, flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, ("listen", None))
    children: dict[int, dict] = {}  # pid -> {"conn", "pidfd"}
    listening, last_active = True, time.monotonic()
    use_pidfd = hasattr(os, "pidfd_open")

    def stop_listening():
        nonlocal listening
        if not listening:
            return
        selector.unregister(listener)
        listener.close()
        try:
            if path.stat().st_ino == bound_inode:
                path.unlink()
        except FileNotFoundError:
            pass
        listening = False

    def reap(pid: int, status: int):
        child = children.pop(pid)
        if child["pidfd"] is not None:
            selector.unregister(child["pidfd"])
            os.close(child["pidfd"])
        if child["conn"] is not None:
            try:
                _send_json(child["conn"], {"exit_status": status})
            except OSError:
                pass
            selector.unregister(child["conn"])
            child["conn"].close()

    while True:
        events = selector.select(timeout=0.5 if use_pidfd else 0.05)
        for key, _mask in events:
            what, pid = key.data
            if what == "listen":
                conn, _ = listener.accept()
                try:
                    request, fds = _receive_request(conn)
                except (OSError, ValueError) as exc:
                    print(f"bad request: {exc}", file=sys.stderr, flush=True)
                    conn.close()
                    continue
                if request.get("hash") != digest or source_hash() != digest:
                    for fd in fds:
                        os.close(fd)
                    stop_listening()  # before answering: the client's next connect must find no socket
                    _send_json(conn, {"status": "stale"})
                    conn.close()
                    print("sources changed: no longer listening", file=sys.stderr, flush=True)
                    continue
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                child_pid = os.fork()
                if child_pid == 0:
                    selector.close()
                    if listening:
                        listener.close()
                    for other in children.values():
                        if other["conn"] is not None:
                            other["conn"].close()
                        if other["pidfd"] is not None:
                            os.close(other["pidfd"])
                    conn.close()
                    _child(request, fds)
                for fd in fds:
                    os.close(fd)
                pidfd = None
                if use_pidfd:
                    try:
                        pidfd = os.pidfd_open(child_pid)
                    except OSError:
                        use_pidfd = False
                children[child_pid] = {"conn": conn, "pidfd": pidfd}
                if pidfd is not None:
                    selector.register(pidfd, selectors.EVENT_READ, ("exit", child_pid))
                selector.register(conn, selectors.EVENT_READ, ("client", child_pid))
                try:
                    _send_json(conn, {"pid": child_pid})
                except OSError:
                    pass  # the client is gone already: its EOF below kills the child
            elif what == "client":  # the client never sends after its request: EOF means it died
                child = children.get(pid)
                try:
                    gone = not key.fileobj.recv(4096)
                except OSError:
                    gone = True
                if gone and child is not None:
                    _kill(pid)
                    selector.unregister(child["conn"])
                    child["conn"].close()
                    child["conn"] = None
            elif what == "exit":
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    reap(pid, status)
        if not use_pidfd:
            for pid in list(children):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    reap(pid, status)
        if children or events:
            last_active = time.monotonic()
            continue
        if not listening:
            return 0  # stale and drained
        if time.monotonic() - last_active > idle_s:
            with open(path.with_suffix(".lock"), "w") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a client is connecting right now
                stop_listening()
            return 0


_SERVER_PATH0 = None


def main(argv: list[str] | None = None) -> int:
    global _SERVER_PATH0
    argv = list(sys.argv[1:] if argv is None else argv)
    path = Path(argv[0])
    _SERVER_PATH0 = sys.path[0] if sys.path else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the cells, not for us
    return serve(path, float(os.environ.get("LMPERF_FORKSERVER_IDLE_S", "120")))


if __name__ == "__main__":
    sys.exit(main())
