"""The flash grid: jobs from the shipped grids (records where record_path puts them, implementations by the
names of the one attention registry), bad values named, committed records at their cells' paths."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from lmperf import attention
from lmperf.core import config
from lmperf.core.record import load_record
from lmperf.kinds.flash import grid

REPO = Path(__file__).resolve().parents[3]
CONFIG = yaml.safe_load((REPO / "config.yaml").read_text())


@pytest.mark.parametrize("device", ["cpu", "h100"])
def test_jobs_of_the_shipped_grids(device):
    jobs = grid.jobs(config.grid(config.validate(copy.deepcopy(CONFIG)), device)["flash"], device)
    assert sorted(j.cell for j in jobs) == ["flash_benchmark"] * 3 + ["flash_correctness"] * 2 + ["flash_leaderboard"]
    for job in jobs:
        for path, cell in job.records.items():
            assert path == grid.record_path(device, "flash", cell) == job.output.format(**cell)
            assert path.startswith(f"results/{device}/flash/")
        assert set(job.settings.get("implementations", [])) <= set(attention.IMPLEMENTATIONS)
        assert job.trials == (1 if job.cell == "flash_correctness" else (2 if device == "cpu" else 3))
    bench = [j for j in jobs if j.cell == "flash_benchmark"]
    assert {j.settings["sdpa_backend"] for j in bench if j.settings["precision"] != "bf16"} == {"EFFICIENT_ATTENTION"}


def test_the_schema_names_the_registry():
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())["definitions"]
    for part in ("flash_benchmarking", "flash_leaderboard"):
        assert set(schema[part]["properties"]["implementations"]["items"]["enum"]) == set(attention.IMPLEMENTATIONS)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (("correctness", "shapes"), [[2, 64]], "grids.gpu.flash.correctness.shapes[0] = [2, 64]"),
        (("benchmarking", "implementations"), ["flash_triton"], "implementations[0] = 'flash_triton'"),
        (("benchmarking", "sdpa_backends"), {"fp32": "FLASH"}, "grids.gpu.flash.benchmarking.sdpa_backends.fp32"),
        (("leaderboard", "rep_ms"), 0, "grids.gpu.flash.leaderboard.rep_ms = 0"),
    ],
)
def test_bad_values_fail_naming_the_key(key, value, expected):
    bad = copy.deepcopy(CONFIG)
    bad["grids"]["gpu"]["flash"][key[0]][key[1]] = value
    assert any(expected in line for line in config.errors(bad)), config.errors(bad)


@pytest.mark.parametrize("device", ["h100", "h200"])
def test_committed_records_lie_where_their_cells_say(device):
    paths = sorted((REPO / "results" / device / "flash").glob("*.json"))
    for path in paths:
        record = load_record(path)
        assert grid.record_path(device, "flash", record["cell"]) == str(path.relative_to(REPO))
