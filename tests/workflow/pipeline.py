"""The workflow tests' tools: a temporary copy of the checkout with a tiny grid, Snakemake in it
(real runs, dry runs and the plan they print), "fresh clones", and the processes of a run.

The copy holds Snakefile, config.yaml, workflow/, src/, envs/ and the `profiles` link; its cells
and rules import the copy's src/ (PYTHONPATH). LMPERF_AUTO_DEVICE=cpu spares each dry run the
torch import that finding this machine's device takes (the workflow's own cache of that answer).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
# The GPU grid of the copies (the CPU grid adds nothing): two kinds, so that a change to one shows
# it leaves the other alone, and one cell that chooses our flash kernels.
TINY = {
    "e2e": {
        "batch_size": 2,
        "warmup_steps": 1,
        "measured_steps": 2,
        "trials": 1,
        "main": {"models": ["tiny"], "context_lengths": [16], "precisions": ["fp32", "bf16"]},
        "attention_compare": {
            "models": ["tiny"],
            "context_lengths": [16],
            "precisions": ["fp32"],
            "attentions": ["plain", "flash"],
        },
    },
    "precision": {"layer_norm": {"width": 64, "rows": 2}},
    "scaleout": {"gpus": [1, 2], "e2e": {"models": ["tiny"], "context_lengths": [16], "precisions": ["fp32", "bf16"]}},
}
E2E = ("tiny_ctx16_fp32_eager_w1", "tiny_ctx16_bf16_eager_w1", "tiny_ctx16_fp32_eager_w1_flash")
PRECISION = "precision__accumulation"  # the precision kind's one job (three records)
FIX = "delete it and rerun"  # what a message about a bad record tells the user to do


def e2e_jobs(*stems: str) -> set[str]:
    """The rules that measure these e2e records again: the trial, then its merge."""
    return {f"e2e__{s}{t}" for s in stems for t in ("__t0", "")}


def copy_checkout(dst: Path, grids: dict | None = None) -> Path:
    """The checkout's workflow in ``dst``, for device cpu, with ``grids`` (default: the tiny grid)."""
    dst.mkdir(parents=True)
    for name in ("Snakefile", "config.yaml", "workflow", "src", "envs"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, dst / name)
    os.symlink("workflow/profiles", dst / "profiles")
    config = yaml.safe_load((dst / "config.yaml").read_text())
    config.update(device="cpu", grids=grids or {"gpu": TINY, "cpu": {}})
    write_config(dst, config)
    return dst


def write_config(workdir: Path, config: dict) -> None:
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def config_edit(**changes):
    """An edit of config.yaml (for ``edited``): ``changes`` laid over the tiny grid's e2e settings."""

    def edit(text):
        config = yaml.safe_load(text)
        config["grids"]["gpu"]["e2e"].update(changes)
        return yaml.safe_dump(config, sort_keys=False)

    return edit


def run_env(workdir: Path, **extra) -> dict:
    drop = ("LMPERF_", "SNAKEMAKE_", "SLURM_", "CUDA_VISIBLE_DEVICES", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**env, "PYTHONPATH": str(workdir / "src"), "LMPERF_AUTO_DEVICE": "cpu", **extra}


def snakemake(workdir: Path, *args: str, umask: int = 0o022, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    """``snakemake --cores 2 ARGS`` in ``workdir``; stdout and stderr together in ``.stdout``."""
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", *args],
        cwd=workdir,
        env=run_env(workdir, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        preexec_fn=lambda: os.umask(umask),
    )


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout[-5000:]
    assert "Traceback" not in result.stdout, result.stdout[-5000:]
    return result.stdout


def refused(result: subprocess.CompletedProcess) -> str:
    """The output of a run that stopped before any job (nothing planned, nothing run)."""
    assert result.returncode != 0, result.stdout[-5000:]
    assert "Job stats" not in result.stdout and "Shell command" not in result.stdout, result.stdout[-5000:]
    return " ".join(result.stdout.split())  # messages wrap at the terminal's width


def plan(workdir: Path, *args: str, **env) -> dict[str, int]:
    """{rule: jobs} that ``snakemake -n all`` plans ({} when there is nothing to do)."""
    out = ok(snakemake(workdir, "-n", "all", "--quiet", "rules", *args, **env))
    if "Nothing to be done" in out:
        return {}
    block = out.split("Job stats:")[1].split("\n\n")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", block, re.M) if m[1] != "total"}


def cells(planned: dict) -> set[str]:
    """The cell jobs of a plan (a cell rule's name is its cell and record, joined by `__`)."""
    return {rule for rule in planned if "__" in rule}


def fresh_clone(done: Path, dst: Path) -> Path:
    """What `git clone` of a checkout holding these results gives: no .snakemake/ or logs/, and
    file times in checkout order (here shuffled: records may be newer than the tables)."""
    ignore = shutil.ignore_patterns(".snakemake", "logs", "__pycache__")
    shutil.copytree(done, dst, symlinks=True, ignore=ignore)
    files = [p for p in dst.rglob("*") if p.is_file() and not p.is_symlink()]
    random.Random(0).shuffle(files)
    start = time.time() - 3600
    for i, path in enumerate(files):
        os.utime(path, (start + i, start + i))
    return dst


@contextlib.contextmanager
def edited(path: Path, edit):
    """``edit`` (text -> text) applied to a file, then its text and time restored."""
    text, stat = path.read_text(), path.stat()
    path.write_text(edit(text))
    try:
        yield
    finally:
        path.write_text(text)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def record(path: Path, **provenance) -> dict:
    data = json.loads(path.read_text())
    data["provenance"].update(provenance)
    return data


def modes(root: Path, since: float = 0) -> set[str]:
    """'f 644' / 'd 755' for every file and directory under ``root`` changed since ``since``."""
    found = set()
    for path in [root, *root.rglob("*")]:
        stat = path.lstat()
        if stat.st_mtime >= since and not path.is_symlink():
            found.add(f"{'d' if path.is_dir() else 'f'} {stat.st_mode & 0o777:o}")
    return found


def _logs(pid: int) -> bool:
    try:
        return "/logs/" in os.readlink(f"/proc/{pid}/fd/2")
    except OSError:
        return False


class Run:
    """A Snakemake run in the background, in a process group of its own as a terminal's job; its
    processes are those whose environment holds its marker."""

    def __init__(self, workdir: Path, *args: str, preexec=None, **env):
        self.marker = f"LMPERF_TEST_RUN={secrets.token_hex(8)}"
        self.out = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "snakemake", "--cores", "2", *args],
            cwd=workdir,
            env=run_env(workdir, **dict([self.marker.split("=")]), **env),
            stdout=self.out,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=preexec,
            start_new_session=True,
        )

    def stop(self, signum: int) -> None:
        """``signum`` as a terminal (Ctrl-C, closing it) or a scheduler sends it: to the run's
        process group; SIGKILL to Snakemake alone."""
        (os.kill if signum == signal.SIGKILL else os.killpg)(self.process.pid, signum)

    def processes(self) -> dict[int, tuple[int, str]]:
        """{pid: (parent pid, command line)} of the run's live processes."""
        found = {}
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and self.marker.encode() in (proc / "environ").read_bytes():
                    parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    found[int(proc.name)] = (parent, (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except (OSError, ValueError, IndexError):
                pass  # gone meanwhile, or not ours to read
        return found

    def cell(self, timeout: float = 120) -> tuple[int, int]:
        """(warm parent, cell): once a cell forked from the run's warm parent runs (writes its job's log)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            found = self.processes()
            warm = [
                p for p, (parent, cmd) in found.items() if parent == self.process.pid and "lmperf.core.warm " in cmd
            ]
            forked = [pid for pid, (parent, _) in found.items() if warm and parent == warm[0] and _logs(pid)]
            if forked:
                return warm[0], forked[0]
            time.sleep(0.05)
        raise AssertionError(f"no cell forked from a warm parent:\n{self.output()[-5000:]}")

    def wait(self, timeout: float = 300) -> int:
        return self.process.wait(timeout)

    def output(self) -> str:
        self.out.seek(0)
        return self.out.read()

    def survivors(self, timeout: float = 15) -> dict:
        """The run's processes still alive ``timeout`` s after its Snakemake ended ({} when none)."""
        deadline = time.monotonic() + timeout
        while (left := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left
