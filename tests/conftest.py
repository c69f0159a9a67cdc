"""Shared test fixtures: the repository root, a fresh random seed per test, and the CPU grid's jobs
of a kind with their records redirected into a temporary folder."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture
def fresh_seed() -> int:
    """A different seed every run, printed so a failure can be reproduced."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    random.seed(seed)
    return seed


def cpu_grid() -> dict:
    """config.yaml's CPU grid, validated, defaults filled in."""
    from lmperf.core import config

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    config.validate(cfg)
    return config.grid(cfg, "cpu")


def redirect(job, root: Path):
    """``job`` with its record paths and output template moved under ``root`` (same relative paths)."""
    return dataclasses.replace(
        job,
        records={str(root / path): cell for path, cell in job.records.items()},
        output=str(root / job.output),
    )


def cpu_jobs(kind: str, root: Path, **grid_changes) -> list:
    """The CPU grid's jobs of ``kind`` (its grid slice updated with ``grid_changes``), writing under ``root``."""
    from lmperf.kinds import grid_module

    grid = {**cpu_grid()[kind], **grid_changes}
    return [redirect(job, root) for job in grid_module(kind).jobs(grid, "cpu")]


def run_job(job, cwd: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``job`` through the runner in a fresh process (as the workflow does); raises on failure."""
    command = [sys.executable, "-m", "lmperf", job.cell, "--device", "cpu", "--job", job.argument()]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise AssertionError(f"{job.cell} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result
