"""The attention kind in the pipeline: config validation and the jobs a dry run plans."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lmperf.core import config as lmconfig

TINY = {
    "implementations": ["plain", "compiled", "sdpa"],
    "head_dims": [8, 16],
    "sequence_lengths": [16, 32],
    "batch_size": 2,
    "precision": "fp32",
    "warmup_passes": 1,
    "measured_passes": 2,
    "min_measured_passes": 1,
    "max_phase_seconds": 1.0,
    "max_warmup_seconds": 0.5,
    "compile_dynamic": True,
}


@pytest.fixture
def config(repo_root):
    return yaml.safe_load((repo_root / "config.yaml").read_text())


def test_shipped_attention_grids(config):
    gpu, cpu = config["grids"]["gpu"]["attention"], config["grids"]["cpu"]["attention"]
    assert lmconfig.errors(config) == []
    # the course's grid, plus the lengths that find the out-of-memory boundary
    assert gpu["batch_size"] == 8 and gpu["precision"] == "fp32"
    assert gpu["head_dims"] == [16, 32, 64, 128]
    assert set(gpu["sequence_lengths"]) >= {256, 1024, 4096, 8192, 16384, 32768, 65536}
    assert gpu["measured_passes"] == 100
    assert set(cpu) == set(gpu) and cpu["implementations"] == gpu["implementations"]


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("implementations", ["plain", "fused"], "grids.gpu.attention.implementations[1] = 'fused'"),
        ("head_dims", [16, 0], "grids.gpu.attention.head_dims[1] = 0: 0 is less than the minimum of 1"),
        ("sequence_lengths", [], "grids.gpu.attention.sequence_lengths = []"),
        ("precision", "fp8", "grids.gpu.attention.precision = 'fp8'"),
        ("max_phase_seconds", 0, "grids.gpu.attention.max_phase_seconds = 0"),
        ("compile_dynamic", "yes", "grids.gpu.attention.compile_dynamic = 'yes'"),
        ("repeats", 3, "unknown key grids.gpu.attention.repeats"),
    ],
)
def test_bad_attention_values_fail_naming_the_key(config, key, value, expected):
    bad = copy.deepcopy(config)
    bad["grids"]["gpu"]["attention"][key] = value
    assert any(expected in line for line in lmconfig.errors(bad)), lmconfig.errors(bad)


def _dry_run(work: Path, target: str) -> tuple[dict, str]:
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", "-n", "-p", target],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    block = result.stdout.split("Job stats:")[1].split("\n\n")[0]
    counts = {
        m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", block, re.M) if m.group(1) != "total"
    }
    return counts, result.stdout


def test_one_job_per_implementation_and_flash_is_a_config_edit(tmp_path, repo_root, config):
    for name in ("Snakefile", "workflow", "src", "envs"):
        src = repo_root / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    config["device"] = "cpu"
    config["grids"]["cpu"]["attention"] = TINY
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    counts, out = _dry_run(tmp_path, "results/cpu/sections/pytorch_attention.md")
    assert counts == {"attention_cells": 3, "attention_report": 1}
    assert "--implementation sdpa --precision fp32" in out
    assert "--output 'results/cpu/attention/sdpa_fp32_d{head_dim}_n{seq_len}.json'" in out
    assert "--head-dims 8 16 --sequence-lengths 16 32" in out
    # adding our FlashAttention to the grid is one more job, nothing else
    config["grids"]["cpu"]["attention"] = TINY | {"implementations": [*TINY["implementations"], "flash"]}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    counts, out = _dry_run(tmp_path, "results/cpu/sections/pytorch_attention.md")
    assert counts == {"attention_cells": 4, "attention_report": 1}
    assert "results/cpu/attention/flash_fp32_d16_n32.json" in out
