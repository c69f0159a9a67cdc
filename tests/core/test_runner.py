"""The runner (``python -m lmperf``) and the run's warm parent (``python -m lmperf.core.warm NAME``):
a cell forked from the parent runs as the client would run it, lives only as long as its client,
its budget and its parent, and under the run's limits. The cells are the precision kind's (fast);
a job summing 10**9 increments stands for a cell that runs too long."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import secrets
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cpu_jobs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the warm parent needs Linux")
NICE = 3  # the run's nice increment and open-files limit, set on the warm parent
NOFILE = min(999, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 1)


@pytest.fixture(scope="module")
def warm():
    """A warm parent under the run's limits, listening under a random name, once ready."""

    def apply_limits():
        os.nice(NICE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    name = f"lmperf-test-{secrets.token_hex(8)}"
    argv, null = [sys.executable, "-m", "lmperf.core.warm", name], subprocess.DEVNULL
    parent = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=null, stdin=null, preexec_fn=apply_limits)
    ready, _, _ = select.select([parent.stdout], [], [], 120)
    assert ready and parent.stdout.readline() == b"ready\n", "the warm parent did not start"
    yield parent, name
    parent.kill()
    parent.wait()


def precision_job(root: Path, **settings):
    job = cpu_jobs("precision", root)[0]
    return dataclasses.replace(job, settings={**job.settings, **settings})


def slow_job(root: Path):
    return precision_job(root, probes=["accumulation"], accumulation={"steps": 10**9, "increment": 0.01})


def client(job, name: str | None, *options: str, start_epoch: float | None = None, **popen):
    """The runner's client for ``job``, forking from warm parent ``name`` (None: in-process). With
    ``start_epoch``, a shell that execs it names its start (``LMPERF_PROCESS_START``)."""
    env = {k: v for k, v in os.environ.items() if k != "LMPERF_WARM_SOCKET"}
    env.update({"LMPERF_WARM_SOCKET": name} if name else {}, **popen.pop("env", {}))
    argv = [sys.executable, "-m", "lmperf", *options, job.cell, "--device", "cpu", "--job", job.argument()]
    if start_epoch is not None:
        argv = ["sh", "-c", f'LMPERF_PROCESS_START="$$:{start_epoch}" exec "$@"', "sh", *argv]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int(stat_fields(int(entry.name))[1]) == pid:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_until(condition, what: str, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)
    return value


def alive(pid: int) -> bool:
    try:
        return stat_fields(pid)[0] != "Z"
    except OSError:
        return False


def the_cell(parent) -> int:
    """The one cell the warm parent has forked, once it leads a process group of its own."""

    def cell():
        found = children(parent.pid)
        try:  # field 5 of /proc/PID/stat: the process group
            return found[0] if len(found) == 1 and stat_fields(found[0])[2] == str(found[0]) else None
        except OSError:
            return None

    return wait_until(cell, "the warm parent forked the cell")


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command's name: state, ppid, pgrp, …"""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def test_a_forked_cell_runs_with_the_clients_env_cwd_streams_and_start(tmp_path, warm):
    """The record lands under the client's working directory, names the commit in the client's
    environment and counts its age from the client's start (here named by the shell that exec'd the
    client: a forked cell is another process, which must still count from there)."""
    job = dataclasses.replace(precision_job(Path("."), probes=["accumulation"]), output="out/{probe}.json")
    env = {"LMPERF_GIT_COMMIT": "c" * 40, "LMPERF_GIT_DIRTY": "0"}
    proc = client(job, warm[1], start_epoch=1700000000.0, cwd=tmp_path, env=env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "[precision] {'probe': 'accumulation'} -> ok" in err  # the cell's stderr is the client's
    provenance = json.loads((tmp_path / "out" / "accumulation.json").read_text())["provenance"]
    assert provenance["git_commit"] == "c" * 40 and provenance["git_dirty"] is False
    assert provenance["process_start_time"] == "2023-11-14T22:13:20.000+00:00"


def test_the_clients_exit_code_is_the_cells(tmp_path, warm):
    job = precision_job(tmp_path)
    no_values = dataclasses.replace(job, settings={k: v for k, v in job.settings.items() if k != "accumulation"})
    proc = client(no_values, warm[1])
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" in err and "accumulation" in err.splitlines()[-1]
    env = {k: v for k, v in os.environ.items() if k != "LMPERF_WARM_SOCKET"}
    argv = [sys.executable, "-m", "lmperf", "precision", "--device", "cpu"]
    no_job = subprocess.run(
        argv, env={**env, "LMPERF_WARM_SOCKET": warm[1]}, capture_output=True, text=True, timeout=60
    )
    assert no_job.returncode == 2 and "the following arguments are required: --job" in no_job.stderr


def test_a_cell_runs_under_the_runs_limits_and_dies_with_its_client(tmp_path, warm):
    parent, name = warm
    proc = client(slow_job(tmp_path), name)
    cell = the_cell(parent)
    assert int(stat_fields(cell)[16]) == os.nice(0) + NICE  # field 19 of /proc/PID/stat: nice
    limits = Path(f"/proc/{cell}/limits").read_text()
    assert any(line.startswith("Max open files") and line.split()[3] == str(NOFILE) for line in limits.splitlines())
    proc.kill()  # as `kill -9` of the job: no clean-up code runs in the client
    proc.wait()
    wait_until(lambda: not alive(cell), "the cell died with its client")


def test_a_cell_past_its_budget_is_killed_with_everything_in_its_process_group_forked_or_not(tmp_path, warm):
    parent, name = warm
    proc = client(slow_job(tmp_path), name, "--budget-s", "2")
    cell = the_cell(parent)
    # a process the cell started: in the cell's process group
    started = subprocess.Popen(["sleep", "600"], preexec_fn=lambda: os.setpgid(0, cell))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 124 and "past its budget of 2 s" in err
    assert started.wait(timeout=30) == -signal.SIGKILL
    wait_until(lambda: not alive(cell), "the cell was killed")
    # run in process, past its budget, a cell ends the same way
    proc = client(slow_job(tmp_path), None, "--budget-s", "1")  # no warm parent: SLURM jobs, LMPERF_WARM=0
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 124 and "past its budget of 1 s" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user to connect needs root")
def test_a_connection_from_another_user_is_refused(tmp_path, warm):
    """Another user (nobody) sends a well-formed request: the parent closes the connection unanswered
    and forks nothing (answered, the reply would be the cell's exit status)."""
    job = precision_job(tmp_path, probes=["accumulation"])
    request = json.dumps({"argv": [job.cell, "--device", "cpu", "--job", job.argument()], "cwd": "/", "env": {}})
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user: only sockets and os calls from here on
        try:
            os.setgid(65534)
            os.setuid(65534)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect("\0" + warm[1])
            sock.settimeout(60)
            try:
                socket.send_fds(sock, [struct.pack("!I", len(request)) + request.encode()], [0, 1, 2])
                reply = sock.recv(64)
            except (BrokenPipeError, ConnectionResetError):  # closed before or after the request
                reply = b""
            os.write(write, b"reply:" + reply)
        except BaseException as error:
            os.write(write, repr(error).encode())
        finally:
            os._exit(0)
    os.close(write)
    reply = b""
    while chunk := os.read(read, 64):
        reply += chunk
    os.waitpid(pid, 0)
    assert reply == b"reply:"  # closed without an exit status
    assert children(warm[0].pid) == [] and not list(tmp_path.rglob("*.json"))


def test_killing_the_warm_parent_kills_the_cell_and_fails_the_client(tmp_path, warm):
    """Last in this file: it kills the module's warm parent."""
    parent, name = warm
    proc = client(slow_job(tmp_path), name)
    cell = the_cell(parent)
    parent.kill()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "the warm parent went away" in err
    wait_until(lambda: not alive(cell), "the cell died with the warm parent")
