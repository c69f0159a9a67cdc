"""bench/grid_run.sh: one device call of a grid re-measure, run here on the CPU grid.

A git repository holding a copy of the pipeline, its manifest written by scripts/code_manifest.py,
then the runner as a device call runs it (OUT set, a cell record as target): it must refuse code
that is not the manifest's commit, start no cell after its drain time, and otherwise return the
record it measured, stamped with the manifest's commit, in the tar parts it leaves in OUT.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORD = "results/cpu/e2e/tiny_ctx32_fp32_eager_w0.json"

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or shutil.which("bash") is None, reason="needs git and bash"
)


def git(repo: Path, *args: str) -> str:
    who = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True, env={**os.environ, **who}
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("Snakefile", "workflow", "src", "envs", "config.yaml", "pyproject.toml", "scripts"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, repo / name)
    (repo / "bench").mkdir()
    shutil.copy(ROOT / "bench" / "grid_run.sh", repo / "bench" / "grid_run.sh")
    os.symlink("workflow/profiles", repo / "profiles")
    (repo / ".gitignore").write_text("__pycache__/\n*.egg-info/\n.snakemake/\nlogs/\n/.gpu/\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "pipeline")
    done = subprocess.run(
        [sys.executable, "scripts/code_manifest.py", "write", ".gpu/manifest"], cwd=repo, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return repo


def grid_run(
    repo: Path, out: Path, drain_s: int, limit_s: int, *targets: str, **extra_env: str
) -> subprocess.CompletedProcess:
    out.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "OUT": str(out),
        # the cells' `python` is this interpreter, whose lmperf is the copy's
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(repo / "src"),
        "LMPERF_FORKSERVER": "0",
        "GRID_RUN_MIN_TAIL_S": "60",  # the CPU cell takes seconds
    }
    env.pop("LMPERF_GIT_COMMIT", None)
    env.update(extra_env)
    return subprocess.run(
        ["bash", "bench/grid_run.sh", "cpu", str(drain_s), str(limit_s), *targets],
        cwd=repo,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def returned(out: Path) -> dict[str, bytes]:
    """The files in the tar parts the call left in OUT, by path."""
    parts = sorted(out.glob("new.tgz.part-*"))
    blob = out / "joined.tgz"
    blob.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(blob) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_code_that_is_not_the_manifests_commit_measures_nothing(repo: Path, tmp_path: Path) -> None:
    cell = repo / "src" / "lmperf" / "cells" / "e2e.py"
    cell.write_text(cell.read_text() + "\n# edited after the manifest\n")
    done = grid_run(repo, tmp_path / "out", 60, 120, RECORD)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "nothing measured" in done.stderr
    assert not (tmp_path / "out" / "snakemake.log").exists()
    assert not (repo / RECORD).exists()


def test_after_the_drain_time_no_cell_starts(repo: Path, tmp_path: Path) -> None:
    done = grid_run(repo, tmp_path / "out", 0, 120, RECORD)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (repo / RECORD).exists()
    log = (repo / "logs" / "cpu" / "e2e" / "tiny_ctx32_fp32_eager_w0.log").read_text()
    assert "drain: not starting -m lmperf.cells e2e" in log
    assert "0 of them records" in done.stdout


def test_a_measured_record_comes_back_with_the_manifests_commit(repo: Path, tmp_path: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    done = grid_run(repo, tmp_path / "out", 120, 240, RECORD)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 of them records" in done.stdout, done.stdout
    files = returned(tmp_path / "out")
    assert RECORD in files
    provenance = json.loads(files[RECORD])["provenance"]
    assert provenance["git_commit"] == head
    assert provenance["git_dirty"] is False
    assert (tmp_path / "out" / "snakemake.log").exists()


@pytest.mark.parametrize(
    ("drain_s", "limit_s", "extra", "says"),
    [
        (70, 130, {"GRID_RUN_MIN_TAIL_S": "150"}, "LIMIT_S - DRAIN_S is 60 s, under 150 s"),
        ("7m", 130, {}, "must be whole seconds"),
    ],
)
def test_a_limit_too_close_to_the_drain_is_refused_before_anything_runs(
    repo: Path, tmp_path: Path, drain_s, limit_s, extra, says
) -> None:
    done = grid_run(repo, tmp_path / "out", drain_s, limit_s, RECORD, **extra)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr
    assert not (tmp_path / "out" / "snakemake.log").exists()
    assert not (repo / "logs").exists()
