"""The fork server behind `python -m lmperf`: same records, exit codes, signals, stale code, fallback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

SLEEPER = textwrap.dedent('''
    """Test-only cell (exists only in the test's copy of lmperf)."""
    import os
    import sys
    import time


    def main(argv):
        what = argv[0]
        if what == "exit":
            print("to stdout", flush=True)
            print("to stderr", file=sys.stderr, flush=True)
            return int(argv[1])
        if what == "sleep":
            open(argv[1], "w").write(str(os.getpid()))
            time.sleep(float(argv[2]))
            return 0
        if what == "exec":
            if not os.environ.get("SLEEPER_EXECED"):
                os.environ["SLEEPER_EXECED"] = "1"
                print(f"before exec {os.getpid()}", flush=True)
                os.execv(sys.executable, [sys.executable, "-m", "lmperf.cells.sleeper", *argv])
            from lmperf.core.cell import process_age_s
            print(f"after exec {os.getpid()} age {process_age_s():.3f}", flush=True)
            return int(argv[1])
        if what == "where":
            print(json.dumps({"cwd": os.getcwd(), "marker": os.environ.get("MARKER"), "argv": sys.argv}))
            return 0
        if what == "gc":
            import gc
            print(gc.get_freeze_count())
            return 0
        if what == "inductor":
            import torch
            print(json.dumps({
                "preloaded": "torch._inductor.compile_fx" in sys.modules,
                "is_available_restored": torch.cuda.is_available.__qualname__ == "is_available",
                "cuda_initialized": torch.cuda.is_initialized(),
            }))
            return 0
        if what == "version":
            print("v1")
            return 0
        raise RuntimeError(f"unknown {what}")


    import json  # noqa: E402

    if __name__ == "__main__":
        sys.exit(main(sys.argv[1:]))
''')


@pytest.fixture
def tree(tmp_path):
    """A copy of lmperf with a test-only cell, its own server directory, and a cleanup of the servers."""
    src = tmp_path / "src"
    shutil.copytree(SRC / "lmperf", src / "lmperf", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "lmperf" / "cells" / "sleeper.py").write_text(SLEEPER)
    env = dict(
        os.environ,
        PYTHONPATH=str(src),
        LMPERF_FORKSERVER_DIR=str(tmp_path / "servers"),
        LMPERF_FORKSERVER_IDLE_S="30",
        LMPERF_FORKSERVER="1",
    )
    env.pop("SLURM_JOB_ID", None)
    yield {"src": src, "env": env, "dir": tmp_path / "servers", "tmp": tmp_path}
    for pid in servers(tmp_path / "servers"):
        os.kill(pid, signal.SIGTERM)


def servers(directory: Path) -> list[int]:
    """Pids of fork servers listening in this directory (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"lmperf.core.forkserver" in cmdline and any(str(directory).encode() in c for c in cmdline):
                found.append(int(entry.name))
    return found


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cells(args, env, **kw):
    return subprocess.run(
        [sys.executable, "-m", "lmperf.cells", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        **kw,
    )


def test_exit_codes_and_output_are_relayed_by_a_forked_child(tree):
    for code in (0, 3):
        result = cells(["sleeper", "exit", str(code)], tree["env"])
        assert result.returncode == code
        assert result.stdout == "to stdout\n" and "to stderr" in result.stderr
    assert len(servers(tree["dir"])) == 1  # one server served both, started by the first
    server = servers(tree["dir"])[0]
    result = cells(["sleeper", "where"], dict(tree["env"], MARKER="m1"), cwd=tree["tmp"])
    seen = json.loads(result.stdout)
    assert seen["cwd"] == str(tree["tmp"]) and seen["marker"] == "m1"
    assert seen["argv"] == ["lmperf.cells.sleeper", "where"]
    assert cells(["nosuch"], tree["env"]).returncode == 2
    failing = cells(["sleeper", "oops"], tree["env"])
    assert failing.returncode == 1 and "RuntimeError: unknown oops" in failing.stderr
    assert servers(tree["dir"]) == [server]


def test_an_execv_restart_keeps_pid_output_and_exit_code(tree):
    result = cells(["sleeper", "exec", "5"], tree["env"])
    assert result.returncode == 5
    before, after = result.stdout.splitlines()
    assert before.split()[2] == after.split()[2]  # the same process, replaced
    assert 0 < float(after.split()[4]) < 60  # age counts from the client's start, across the exec


@pytest.mark.parametrize("how", ["kill", "interrupt"])
def test_the_child_dies_with_its_client(tree, how):
    pidfile = tree["tmp"] / "child.pid"
    client = subprocess.Popen(
        [sys.executable, "-m", "lmperf.cells", "sleeper", "sleep", str(pidfile), "60"],
        env=tree["env"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline and client.poll() is None
        time.sleep(0.05)
    child = int(pidfile.read_text())
    assert child != client.pid and alive(child)
    client.send_signal(signal.SIGKILL if how == "kill" else signal.SIGINT)
    client.wait(timeout=30)
    if how == "interrupt":
        assert client.returncode == -signal.SIGINT  # the child died of the interrupt, the client too
        assert "KeyboardInterrupt" in client.stderr.read().decode()
    deadline = time.monotonic() + 10
    while alive(child):
        assert time.monotonic() < deadline, "child outlived its client"
        time.sleep(0.05)
    assert len(servers(tree["dir"])) == 1  # the server itself carries on


def test_changed_sources_start_a_fresh_server(tree):
    assert cells(["sleeper", "version"], tree["env"]).stdout == "v1\n"
    (old,) = servers(tree["dir"])
    path = tree["src"] / "lmperf" / "cells" / "sleeper.py"
    path.write_text(path.read_text().replace('print("v1")', 'print("v2")'))
    fresh = cells(["sleeper", "version"], tree["env"])
    assert fresh.stdout == "v2\n" and "in-process" not in fresh.stderr
    deadline = time.monotonic() + 10
    while old in servers(tree["dir"]):
        assert time.monotonic() < deadline, "the stale server kept running"
        time.sleep(0.05)
    assert len(servers(tree["dir"])) == 1


def test_an_idle_server_exits(tree):
    assert cells(["sleeper", "exit", "0"], dict(tree["env"], LMPERF_FORKSERVER_IDLE_S="1")).returncode == 0
    deadline = time.monotonic() + 20
    while servers(tree["dir"]):
        assert time.monotonic() < deadline, "the idle server kept running"
        time.sleep(0.1)
    assert not list(tree["dir"].glob("*.sock"))


def test_fallback_runs_in_process_without_a_server(tree):
    for env in (dict(tree["env"], LMPERF_FORKSERVER="0"), dict(tree["env"], SLURM_JOB_ID="1")):
        result = cells(["sleeper", "where"], env)
        assert result.returncode == 0 and json.loads(result.stdout)["argv"] == ["lmperf.cells.sleeper", "where"]
    assert servers(tree["dir"]) == []
    # a server that cannot start (here: its directory is not private) falls back too
    tree["dir"].mkdir(mode=0o755)
    os.chmod(tree["dir"], 0o755)
    result = cells(["sleeper", "exit", "4"], tree["env"])
    assert result.returncode == 4 and "running in-process" in result.stderr
    assert servers(tree["dir"]) == []


def test_a_server_that_cannot_start_is_not_retried_for_the_same_sources(tree):
    (tree["src"] / "lmperf" / "cells" / "boom.py").write_text('raise RuntimeError("no server today")\n')
    first = cells(["sleeper", "exit", "6"], tree["env"])
    assert first.returncode == 6 and "no server today" in first.stderr and "not retried" in first.stderr
    second = cells(["sleeper", "exit", "7"], tree["env"])
    assert second.returncode == 7 and "no server today" not in second.stderr and second.stdout == "to stdout\n"
    (tree["src"] / "lmperf" / "cells" / "boom.py").unlink()  # the sources change: try again
    third = cells(["sleeper", "exit", "0"], tree["env"])
    assert third.returncode == 0 and third.stderr == "to stderr\n" and len(servers(tree["dir"])) == 1


def test_records_match_an_in_process_run(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(SRC), LMPERF_FORKSERVER_DIR=str(tmp_path / "servers"))
    env.pop("SLURM_JOB_ID", None)
    args = [
        "e2e",
        "--device",
        "cpu",
        "--model",
        "tiny",
        "--context-length",
        "16",
        "--warmup-steps",
        "1",
        "--measured-steps",
        "2",
    ]
    records = {}
    try:
        for mode in ("0", "1"):
            out = tmp_path / f"{mode}.json"
            result = cells([*args, "--output", str(out)], dict(env, LMPERF_FORKSERVER=mode), cwd=SRC.parent)
            assert result.returncode == 0, result.stderr
            records[mode] = json.loads(out.read_text())
        assert len(servers(tmp_path / "servers")) == 1
    finally:
        for pid in servers(tmp_path / "servers"):
            os.kill(pid, signal.SIGTERM)
    a, b = records["0"], records["1"]
    assert {k: a[k] for k in ("kind", "cell", "status", "reason")} == {
        k: b[k] for k in ("kind", "cell", "status", "reason")
    }
    assert set(a["metrics"]) == set(b["metrics"])
    timing = ("_ms", "_s", "tokens_per_s", "tflops", "mfu", "samples")
    for key, value in a["metrics"].items():
        if not any(t in key for t in timing):
            assert b["metrics"][key] == value, key
    clocks = ("start_time", "process_start_time", "process_age_s")
    assert {k: v for k, v in a["provenance"].items() if k not in clocks} == {
        k: v for k, v in b["provenance"].items() if k not in clocks
    }
    for record in (a, b):
        age = record["provenance"]["process_age_s"]
        assert (
            0
            < record["metrics"]["process_start_to_first_step_s"]
            <= record["metrics"]["process_start_to_first_measured_step_s"]
            <= age
            < 120
        )


CUDA_LIKE_IMPORT = textwrap.dedent('''
    """Test-only module: at import, starts a thread named as the CUDA driver's (as cuInit would)."""
    import ctypes
    import threading
    import time

    started = threading.Event()


    def _driver_like_thread():
        ctypes.CDLL(None).prctl(15, b"cuda-EvtHandlr")  # PR_SET_NAME
        started.set()
        time.sleep(3600)


    threading.Thread(target=_driver_like_thread, daemon=True).start()
    started.wait()
''')


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names come from /proc")
def test_a_server_whose_imports_start_cuda_names_the_module_and_cells_still_run(tree):
    (tree["src"] / "lmperf" / "cells" / "driverlike.py").write_text(CUDA_LIKE_IMPORT)
    result = cells(["sleeper", "exit", "3"], tree["env"])
    assert result.returncode == 3 and result.stdout == "to stdout\n"
    assert "importing lmperf.cells.driverlike initialised CUDA" in result.stderr
    assert servers(tree["dir"]) == []


def test_a_forked_cell_finds_the_preloaded_objects_frozen(tree):
    """The server freezes what it imported (gc.freeze): a cell's collections skip it; in-process, nothing is."""
    forked = cells(["sleeper", "gc"], tree["env"])
    in_process = cells(["sleeper", "gc"], dict(tree["env"], LMPERF_FORKSERVER="0"))
    assert forked.returncode == 0 and in_process.returncode == 0
    assert int(forked.stdout) > 10_000 and int(in_process.stdout) == 0


def test_a_forked_cell_finds_inductor_preloaded_and_cuda_untouched(tree):
    """The server imports Inductor's front end (PRELOAD_CUDA_ANSWERED) with torch.cuda.is_available
    answered for it, then puts the real one back; in-process, nothing has imported Inductor yet."""
    forked = cells(["sleeper", "inductor"], tree["env"])
    in_process = cells(["sleeper", "inductor"], dict(tree["env"], LMPERF_FORKSERVER="0"))
    assert forked.returncode == 0 and in_process.returncode == 0, forked.stderr + in_process.stderr
    assert json.loads(forked.stdout) == {"preloaded": True, "is_available_restored": True, "cuda_initialized": False}
    assert json.loads(in_process.stdout)["preloaded"] is False


def test_cuda_availability_is_asked_of_a_fresh_process_only_where_a_driver_is(tmp_path, monkeypatch):
    import torch

    from lmperf.core import forkserver

    monkeypatch.setattr(forkserver, "NVIDIA_DRIVER_DEVICE", tmp_path / "missing")
    assert forkserver._cuda_available_in_a_fresh_process() is False
    (tmp_path / "nvidiactl").touch()
    monkeypatch.setattr(forkserver, "NVIDIA_DRIVER_DEVICE", tmp_path / "nvidiactl")
    asked = forkserver._cuda_available_in_a_fresh_process()
    assert isinstance(asked, subprocess.Popen)
    assert forkserver._answer(asked) is torch.cuda.is_available()


def test_cuda_answered_answers_inside_and_restores(monkeypatch):
    import torch

    from lmperf.core import forkserver

    real = torch.cuda.is_available
    for answer in (True, False):
        with forkserver._cuda_answered(answer):
            assert torch.cuda.is_available() is answer
        assert torch.cuda.is_available is real
    with pytest.raises(KeyError), forkserver._cuda_answered(True):
        raise KeyError("an import failing inside")
    assert torch.cuda.is_available is real


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names come from /proc")
def test_a_server_whose_answered_import_starts_cuda_restarts_without_it(tree):
    """Should an import of PRELOAD_CUDA_ANSWERED initialise CUDA all the same, the server replaces
    itself with one that leaves those imports to the cells: cells still fork from it."""
    (tree["src"] / "lmperf" / "driverlike.py").write_text(CUDA_LIKE_IMPORT)
    server = tree["src"] / "lmperf" / "cells" / "forkserver.py"
    text = server.read_text()
    line = 'PRELOAD_CUDA_ANSWERED = ("torch._inductor.compile_fx",)'
    assert line in text
    server.write_text(text.replace(line, 'PRELOAD_CUDA_ANSWERED = ("lmperf.driverlike", "torch._inductor.compile_fx")'))
    result = cells(["sleeper", "inductor"], tree["env"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"preloaded": False, "is_available_restored": True, "cuda_initialized": False}
    assert len(servers(tree["dir"])) == 1  # forked from the restarted server, not run in-process
    log = "".join(p.read_text() for p in tree["dir"].glob("*.log"))
    assert "importing lmperf.driverlike initialised CUDA" in log and "restarting without" in log
    assert not list(tree["dir"].glob("*.failed"))


@pytest.mark.parametrize("code", ["import sys; sys.exit(3)", "print('no answer')"])
def test_a_subprocess_without_an_answer_leaves_inductor_to_the_cells(code, capsys):
    from lmperf.core import forkserver

    asked = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert forkserver._answer(asked) is None
    assert "asking torch.cuda.is_available() in a subprocess failed" in capsys.readouterr().err
    assert forkserver._answer(False) is False and forkserver._answer(True) is True
