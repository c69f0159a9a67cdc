"""One report-only build of the committed GPU records, shared by the page and HTML tests: a temporary
copy of the checkout (workflow, code, the records of every device in DEVICES) where Snakemake builds
each device's report as a reader would (`--config device=<d> report_only=true`: no cell runs), the
front page's device last."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lmperf.report.common import record_paths

REPO = Path(__file__).resolve().parents[2]
DEVICES = ("h100", "h200")  # the committed records; the first is the front page's device


def copy_checkout(dst: Path) -> None:
    """The workflow, the code and the committed records of DEVICES with their verify results."""
    for name in ("Snakefile", "config.yaml", "workflow", "src", "envs"):
        source = REPO / name
        copy = shutil.copytree if source.is_dir() else shutil.copy2
        copy(source, dst / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if source.is_dir() else {}))
    for device in DEVICES:
        verify_runs = (REPO / "results" / device / "verify").glob("*.json")  # `snakemake verify` writes them
        for path in [*map(Path, record_paths(REPO / "results" / device)), *verify_runs]:
            (dst / path.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dst / path.relative_to(REPO))


def snakemake(work: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(work / "src")}
    run = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=work, env=env, capture_output=True, text=True)
    assert run.returncode == 0, f"snakemake {' '.join(args)} failed:\n{run.stderr[-4000:]}"


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Path:
    """The checkout copy after a report-only `all` for every device: results/<device>/{figures,tables,
    sections} and report/<device>/answers.md, and the front page report/answers.md."""
    missing = [d for d in DEVICES if not record_paths(REPO / "results" / d)]
    if missing:
        pytest.skip(f"no committed records under results/{missing[0]}/")
    work = tmp_path_factory.mktemp("reports") / "checkout"
    work.mkdir()
    copy_checkout(work)
    for device in reversed(DEVICES):
        snakemake(work, "--cores", "2", "all", "--config", f"device={device}", "report_only=true")
    return work
