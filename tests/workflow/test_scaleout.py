"""The scale-out check (`snakemake scaleout`, not part of `all`) with two simulated GPUs on a CPU
(LMPERF_NUM_GPUS=2 LMPERF_GPUS_PER_CELL=1): the same e2e cells once on one GPU and once on two,
each run in a fresh copy of the workflow, compared in one record; and its comparison itself."""

from __future__ import annotations

import json

import pytest

from lmperf.core.record import load_record
from lmperf.kinds import grid_module
from lmperf.kinds.scaleout import cell as scaleout

from .pipeline import TINY, ok, snakemake

RECORD = "results/cpu/scaleout/e2e.json"


def simulated(tmp_path, gpus: int) -> dict:
    return dict(LMPERF_NUM_GPUS=str(gpus), LMPERF_GPUS_PER_CELL="1", LMPERF_GPU_LOCK_DIR=str(tmp_path / "locks"))


def test_two_simulated_gpus_run_two_cells_at_once_each_on_its_own(copy, tmp_path):
    ok(snakemake(copy, "scaleout", "--cores", "4", "--resources", "gpu=2", **simulated(tmp_path, 2)))
    record = load_record(copy / RECORD)
    assert record["status"] == "ok", record["reason"]
    m = record["metrics"]
    assert m["cells"] == 2 and set(m["wall_s"]) == {"1", "2"}
    # the one-GPU run kept both cells on GPU 0; in the two-GPU run they ran one per GPU
    assert {row["cuda_visible_devices_gpus1"] for row in m["per_cell"]} == {"0"}
    assert m["against_baseline"]["2"]["gpus_used"] == ["0", "1"]
    assert m["against_baseline"]["2"]["training_step_cells_compared"] == 2
    for k in (1, 2):  # each run's Snakemake output is kept
        assert "steps (100%) done" in (copy / f"logs/cpu/scaleout/gpus{k}.log").read_text()


def test_a_host_with_too_few_gpus_gets_an_unsupported_record(copy, monkeypatch):
    monkeypatch.chdir(copy)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for key, value in simulated(copy, 1).items():
        monkeypatch.setenv(key, value)
    (job,) = grid_module("scaleout").jobs(TINY["scaleout"], "cpu")
    assert scaleout.main(["--device", "cpu", "--job", job.argument()]) == 0
    record = load_record(copy / RECORD)
    assert record["status"] == "unsupported"
    assert "has 1 GPU(s)" in record["reason"] and "needs 2" in record["reason"]


def rows(times: dict[str, float], gpus: dict[str, str] | None = None) -> dict[str, dict]:
    return {
        name: {
            "status": "ok",
            "training_step_ms_median": t,
            "inference_forward_ms_median": t / 3,
            "cuda_visible_devices": (gpus or {}).get(name, "0"),
        }
        for name, t in times.items()
    }


def test_compare_gives_the_speedup_and_the_cells_agreement():
    one = rows({"a": 100.0, "b": 200.0, "c": 50.0})
    two = rows({"a": 110.0, "b": 190.0, "c": 50.0}, gpus={"a": "0", "b": "1", "c": "0"})
    two["c"]["training_step_ms_median"] = None  # e.g. out of memory in that run: not compared
    entry = scaleout.compare({1: 30.0, 2: 20.0}, {1: one, 2: two})["against_baseline"]["2"]
    assert entry["speedup"] == pytest.approx(1.5) and entry["efficiency"] == pytest.approx(0.75)
    assert entry["gpus_used"] == ["0", "1"] and entry["training_step_cells_compared"] == 2
    # +10% and -5%: median of |.| 7.5%, max 10%
    assert entry["training_step_abs_rel_diff_median"] == pytest.approx(0.075)
    assert entry["training_step_abs_rel_diff_max"] == pytest.approx(0.10)
    with pytest.raises(RuntimeError, match="other cells"):
        scaleout.compare({1: 1.0, 2: 1.0}, {1: rows({"a": 1.0, "b": 1.0}), 2: rows({"a": 1.0})})


def test_each_run_gets_a_valid_config_of_only_its_cells(repo_root, tmp_path):
    import yaml

    from lmperf.core import config as lmconfig

    config = yaml.safe_load((repo_root / "config.yaml").read_text())
    grid = {"models": ["small"], "context_lengths": [256], "precisions": ["bf16"]}
    sub = lmconfig.validate(json.loads(json.dumps(scaleout.run_config(config, "h200", grid))))
    assert sub["device"] == "h200" and list(sub["grids"]["gpu"]) == ["e2e"]
    assert sub["grids"]["gpu"]["e2e"]["main"] == grid
    assert sub["grids"]["gpu"]["e2e"]["measured_steps"] == config["grids"]["gpu"]["e2e"]["measured_steps"]
    with pytest.raises(RuntimeError, match="the 1-GPU run failed"):  # no Snakefile there
        scaleout.run_pipeline(tmp_path, 1, tmp_path / "log.txt", tmp_path / "locks")
