"""Runs that are stopped, starved or shared (issue 49 §2, §4, §5, §7), and the warm parent that forks
their cells: the same command resumes after any stop, no cell outlives its run, a cell past its
budget is killed, the run's limits reach its cells, nothing lives under /tmp or answers another
user, modes follow the umask, and another device's report-only run leaves the front page alone.

The runs re-measure the precision kind (one fast job) in copies of the one real run."""

from __future__ import annotations

import json
import os
import pwd
import re
import resource
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from .pipeline import PRECISION, Run, ok, plan, record, snakemake

# the run's limits, set on Snakemake itself: a nice increment and an open-files limit
NICE, NOFILE = 3, min(777, resource.getrlimit(resource.RLIMIT_NOFILE)[1])


def under_limits():
    os.nice(NICE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def nice_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def open_files(pid: int) -> set[str]:
    try:
        return {os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()}
    except FileNotFoundError:
        return set()  # a short-lived child (uname, …) gone meanwhile


def check_warm_parent(copy: Path, run: Run, warm: int, cell: int) -> None:
    """The cell is forked from the run's warm parent, under the run's limits; what lmperf started
    (the warm parent, the cell and its client) holds no file under /tmp outside the checkout and
    no socket with a name on disk; a second run of the same checkout is refused meanwhile."""
    assert nice_of(cell) == nice_of(run.process.pid) >= NICE
    assert re.search(rf"^Max open files\s+{NOFILE}\s", Path(f"/proc/{cell}/limits").read_text(), re.M)
    ours = [pid for pid, (_, command) in run.processes().items() if " lmperf" in command]
    assert {warm, cell} < set(ours)  # and the client
    opened = {f for pid in ours for f in open_files(pid)}
    unix = {line.split()[6]: line.split()[7:] for line in Path("/proc/net/unix").read_text().splitlines()[1:]}
    named = [unix.get(f[8:-1]) for f in opened if f.startswith("socket:[")]
    assert not [path for path in named if path and not path[0].startswith("@")], named
    tmp = [f for f in opened if f.startswith(tempfile.gettempdir()) and not f.startswith(str(copy))]
    assert not tmp, tmp
    second = snakemake(copy, "all")
    assert second.returncode != 0 and "LockException" in second.stdout, second.stdout[-3000:]


def test_the_same_command_resumes_after_any_stop_and_no_cell_outlives_its_run(copy):
    shutil.rmtree(copy / "results/cpu/precision")
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL):
        run = Run(copy, "all", preexec=under_limits)
        warm, cell = run.cell()
        os.kill(cell, signal.SIGSTOP)  # a cell that hangs, until its run is stopped
        if signum == signal.SIGINT:
            check_warm_parent(copy, run, warm, cell)
        run.stop(signum)
        run.wait()
        assert run.survivors() == {}, f"alive after {signum.name} to Snakemake:\n{run.output()[-3000:]}"
    out = ok(snakemake(copy, "all"))  # no --unlock, no --rerun-incomplete
    assert "LockException" not in out and plan(copy) == {}


def test_a_cell_past_its_budget_is_killed_and_its_job_fails_saying_so(copy):
    shutil.rmtree(copy / "results/cpu/precision")
    run = Run(copy, "all", "--set-resources", f"{PRECISION}:runtime=0")
    assert run.wait() != 0 and f"Error in rule {PRECISION}" in run.output()
    assert "the cell ran past its budget of 0 s: killed" in (copy / f"logs/cpu/{PRECISION}.log").read_text()
    assert not list(copy.glob("results/cpu/precision/*.json")) and run.survivors() == {}


def test_under_umask_077_everything_a_fresh_clones_run_writes_is_private_alike(pipeline, clone):
    """A fresh clone rebuilds its aggregates (once) and here the precision cell; under umask 077
    everything it writes, directories too, is closed to others alike. Records are not rewritten."""
    for path in (
        "results/cpu/precision",
        "results/cpu/tables",
        "results/cpu/figures",
        "results/cpu/sections",
        "report",
    ):
        shutil.rmtree(clone / path)
    before = set(clone.rglob("*"))
    ok(snakemake(clone, "all", umask=0o077))
    written = {p for p in clone.rglob("*") if p not in before and ".snakemake" not in p.parts}
    assert {p.parent.name for p in written} >= {"precision", "tables", "sections", "cpu", "report", "logs"}
    assert {f"{'d' if p.is_dir() else 'f'} {p.stat().st_mode & 0o777:o}" for p in written} == {"f 600", "d 700"}
    assert plan(clone) == {}
    for path in clone.glob("results/cpu/e2e/*.json"):
        assert path.read_bytes() == (pipeline / path.relative_to(clone)).read_bytes()


def test_a_report_only_run_for_another_device_leaves_the_front_page_to_its_device(copy):
    """h200's report-only run writes report/h200/ only; the front page (h100's by default) is
    written by h200's runs only once the config names h200 as its device. Other devices' folders and
    records with odd names are read as data."""
    for path in (copy / "results/cpu").glob("*/*.json"):
        for device, name in (("h200", path.name), ("h300", f"y; touch pwned {path.name}")):
            dst = copy / "results" / device / path.parent.name / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(json.dumps(record(path, device_slug=device)))
    shutil.copytree(copy / "results/h300", copy / "results/h 400; touch pwned")
    (copy / "report/answers.md").write_text("h100's front page\n")
    ours = {p: p.stat().st_mtime_ns for p in [*copy.glob("results/cpu/**/*"), *copy.glob("report/cpu/*")]}
    report_only = ("all", "--config", "device=h200", "report_only=true")
    ok(snakemake(copy, *report_only))
    assert (copy / "report/h200/answers.md").stat().st_size > 0
    assert (copy / "report/answers.md").read_text() == "h100's front page\n"
    assert {p: p.stat().st_mtime_ns for p in ours} == ours  # the CPU run's files as they were
    ok(snakemake(copy, *report_only, "front_page_device=h200"))
    assert (copy / "report/answers.md").read_text() != "h100's front page\n"
    assert not list(copy.rglob("pwned"))


# Another user, who can see the warm parent's socket name (/proc/net/unix), asks it to run a cell
# writing into the attacker's folder; prints the cell's exit status, or `refused`.
ATTACK = r"""
import json, socket, struct, sys
name, out = sys.argv[1:]
job = {"settings": {"probes": ["accumulation"], "accumulation": {"steps": 10, "increment": 0.01}}, "output": out + "/{probe}.json"}
request = json.dumps({"argv": ["precision", "--device", "cpu", "--job", json.dumps(job)], "cwd": out, "env": {}}).encode()
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect("\0" + name)
try:
    socket.send_fds(sock, [struct.pack("!I", len(request)) + request], [0, 1, 2])
    sock.settimeout(60)
    print(sock.recv(64) or "refused")
except (BrokenPipeError, ConnectionResetError):
    print("refused")
"""


@pytest.fixture
def other_user():
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("needs root, useradd and setpriv to create a second local user")
    name = f"lmperf-probe-{os.getpid()}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False)


def test_another_user_can_neither_redirect_nor_use_the_warm_parent(copy, other_user):
    """§2: the old fork server's predictable folder, planted as a link to the attacker's folder, is
    never used; the real warm parent refuses the attacker's request; the run completes."""
    shutil.rmtree(copy / "results/cpu/precision")
    attacker = Path(tempfile.mkdtemp(prefix="lmperf-attacker-"))
    os.chown(attacker, other_user.pw_uid, other_user.pw_gid)
    planted = Path(tempfile.gettempdir(), f"lmperf-forkserver-{os.getuid()}")
    as_attacker = ["setpriv", f"--reuid={other_user.pw_uid}", f"--regid={other_user.pw_gid}", "--clear-groups"]
    try:
        if not planted.exists():
            subprocess.run([*as_attacker, "ln", "-s", str(attacker), str(planted)], check=True)
        run = Run(copy, "all")
        warm, cell = run.cell()
        os.kill(cell, signal.SIGSTOP)  # the run goes on until the attack is over
        name = Path(f"/proc/{warm}/cmdline").read_bytes().split(b"\0")[-2].decode()
        attack = subprocess.run(
            [*as_attacker, "/usr/bin/python3", "-c", ATTACK, name, str(attacker)],
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert attack.stdout.strip() == "refused", attack.stdout + attack.stderr
        os.kill(cell, signal.SIGCONT)
        assert run.wait() == 0, run.output()[-3000:]
        assert list(attacker.iterdir()) == []
        assert (copy / "results/cpu/precision/accumulation.json").exists()
    finally:
        if planted.is_symlink() and planted.readlink() == attacker:
            planted.unlink()
        shutil.rmtree(attacker)
