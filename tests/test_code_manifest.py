"""scripts/code_manifest.py: a GPU machine's copy checked against the commit its records will name.

Each test builds a small git repository, so the manifest is compared with git's own view of the
commit (``git rev-parse``, ``git hash-object``), not with the script's reimplementation of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "code_manifest.py"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo: Path, *args: str) -> str:
    who = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    env = {**os.environ, **who}
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True, env=env)
    return done.stdout.strip()


def manifest(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=repo, capture_output=True, text=True)


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / "src" / "pkg" / "cell.py").write_text("MEASURE = 1\n")
    (repo / "config.yaml").write_text("grid: [1, 2]\n")
    (repo / "results").mkdir()
    (repo / "results" / "a.json").write_text("{}\n")
    git(repo, "init", "-q")
    commit_all(repo, "code")
    return repo


def test_manifest_lists_the_commits_code_files_with_gits_blob_ids(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    done = manifest(repo, "write", ".m")
    assert done.returncode == 0, done.stderr
    assert (repo / ".m" / "commit").read_text().strip() == head
    rows = dict(line.split(" ", 1)[::-1] for line in (repo / ".m" / "manifest.txt").read_text().splitlines())
    # code paths only: results/ is not code
    assert set(rows) == {"src/pkg/cell.py", "config.yaml"}
    for path, blob in rows.items():
        assert blob == git(repo, "hash-object", path)
    assert manifest(repo, "check", ".m").returncode == 0


def test_check_fails_on_a_changed_or_an_added_code_file(repo: Path) -> None:
    assert manifest(repo, "write", ".m").returncode == 0
    (repo / "src" / "pkg" / "cell.py").write_text("MEASURE = 2\n")
    changed = manifest(repo, "check", ".m")
    assert changed.returncode == 1
    assert "differs: src/pkg/cell.py" in changed.stderr

    (repo / "src" / "pkg" / "cell.py").write_text("MEASURE = 1\n")
    (repo / "src" / "pkg" / "new.py").write_text("X = 1\n")
    added = manifest(repo, "check", ".m")
    assert added.returncode == 1
    assert "not in the commit: src/pkg/new.py" in added.stderr

    (repo / "src" / "pkg" / "new.py").unlink()
    (repo / "src" / "pkg" / "__pycache__").mkdir()
    (repo / "src" / "pkg" / "__pycache__" / "cell.cpython-312.pyc").write_bytes(b"\0")
    assert manifest(repo, "check", ".m").returncode == 0  # bytecode is no code


def test_an_earlier_commit_checks_while_only_records_changed_since(repo: Path) -> None:
    measured_from = git(repo, "rev-parse", "HEAD")
    (repo / "results" / "b.json").write_text("{}\n")
    commit_all(repo, "records only")
    done = manifest(repo, "write", ".m", measured_from[:10])
    assert done.returncode == 0, done.stderr
    assert (repo / ".m" / "commit").read_text().strip() == measured_from
    assert manifest(repo, "check", ".m").returncode == 0

    (repo / "config.yaml").write_text("grid: [1, 2, 3]\n")
    commit_all(repo, "a grid value")
    assert manifest(repo, "write", ".m", measured_from).returncode == 0
    moved = manifest(repo, "check", ".m")
    assert moved.returncode == 1
    assert "differs: config.yaml" in moved.stderr


def test_refuses_what_is_no_commit_and_bad_usage(repo: Path) -> None:
    nosuch = manifest(repo, "write", ".m", "no-such-ref")
    assert nosuch.returncode == 2
    assert "not a commit here: no-such-ref" in nosuch.stderr
    assert not (repo / ".m").exists()
    for args in (["write"], ["check", ".m", "HEAD"], ["verify", ".m"]):
        bad = manifest(repo, *args)
        assert bad.returncode != 0
        assert "usage:" in bad.stderr
