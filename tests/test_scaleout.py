"""The scale-out check: runs compared, simulated GPUs on CPU end to end, unsupported hosts, report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lmperf.core import config as lmconfig
from lmperf.core.record import load_record
from lmperf.kinds.scaleout import cell as scaleout
from lmperf.kinds.scaleout import report as scaleout_report

REPO = Path(__file__).resolve().parents[1]


def rows(times: dict[str, float], gpus: dict[str, str] | None = None) -> dict[str, dict]:
    return {
        name: {
            "status": "ok",
            "training_step_ms_median": t,
            "inference_forward_ms_median": t / 3,
            "cuda_visible_devices": (gpus or {}).get(name, "0"),
            "start_time": None,
        }
        for name, t in times.items()
    }


def test_compare_speedup_and_agreement():
    one = rows({"a": 100.0, "b": 200.0, "c": 50.0})
    two = rows({"a": 110.0, "b": 190.0, "c": 50.0}, gpus={"a": "0", "b": "1", "c": "0"})
    m = scaleout.compare({1: 30.0, 2: 20.0}, {1: one, 2: two})
    entry = m["against_baseline"]["2"]
    assert entry["speedup"] == pytest.approx(1.5) and entry["efficiency"] == pytest.approx(0.75)
    assert entry["gpus_used"] == ["0", "1"]
    # +10%, -5%, 0%: median 0, median of |.| 5%, max 10%
    assert entry["training_step_rel_diff_median"] == pytest.approx(0.0)
    assert entry["training_step_abs_rel_diff_median"] == pytest.approx(0.05)
    assert entry["training_step_abs_rel_diff_max"] == pytest.approx(0.10)
    assert entry["training_step_cells_compared"] == 3
    a = next(r for r in m["per_cell"] if r["cell"] == "a")
    assert a["training_step_ms_median_gpus1"] == 100.0 and a["training_step_ms_median_rel_diff_gpus2"] == pytest.approx(
        0.1
    )


def test_compare_refuses_runs_with_other_cells():
    with pytest.raises(RuntimeError, match="other cells"):
        scaleout.compare({1: 1.0, 2: 1.0}, {1: rows({"a": 1.0, "b": 1.0}), 2: rows({"a": 1.0})})


def test_compare_skips_cells_without_a_time():
    one, two = rows({"a": 100.0, "b": 100.0}), rows({"a": 120.0, "b": 100.0})
    two["b"]["training_step_ms_median"] = None  # e.g. out of memory in that run
    entry = scaleout.compare({1: 2.0, 2: 1.0}, {1: one, 2: two})["against_baseline"]["2"]
    assert entry["training_step_cells_compared"] == 1
    assert entry["training_step_abs_rel_diff_max"] == pytest.approx(0.2)


def test_run_config_is_a_valid_config_of_only_those_cells():
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    grid = {"models": ["small"], "context_lengths": [256], "precisions": ["bf16"]}
    sub = scaleout.run_config(config, "h200", grid)
    lmconfig.validate(sub)
    assert sub["device"] == "h200" and list(sub["grids"]["gpu"]) == ["e2e"]
    assert sub["grids"]["gpu"]["e2e"]["main"] == grid
    assert sub["grids"]["gpu"]["e2e"]["measured_steps"] == config["grids"]["gpu"]["e2e"]["measured_steps"]
    assert sub["grids"]["cpu"] == config["grids"]["cpu"]


def test_cli_refusals(tmp_path):
    with pytest.raises(SystemExit):
        scaleout.parse_args(
            [
                "--output",
                "x.json",
                "--device",
                "cpu",
                "--gpus",
                "2",
                "--models",
                "tiny",
                "--context-lengths",
                "16",
                "--precisions",
                "fp32",
                "--log-dir",
                str(tmp_path),
            ]
        )


def small_config(tmp_path: Path) -> Path:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["grids"]["cpu"]["e2e"].update(warmup_steps=1, measured_steps=2, batch_size=2)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_check(tmp_path: Path, num_gpus: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LMPERF_NUM_GPUS": num_gpus, "LMPERF_GPUS_PER_CELL": "1", "LMPERF_GPU_WAIT_S": "120"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    command = [
        sys.executable,
        "-m",
        "lmperf.kinds.scaleout.cell",
        "--output",
        str(tmp_path / "out" / "e2e.json"),
        "--device",
        "cpu",
        "--gpus",
        "1",
        "2",
        "--models",
        "tiny",
        "--context-lengths",
        "16",
        "--precisions",
        "fp32",
        "bf16",
        "--config",
        str(small_config(tmp_path)),
        "--workflow-dir",
        str(REPO),
        "--log-dir",
        str(tmp_path / "logs"),
        "--work-dir",
        str(tmp_path / "work"),
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def test_simulated_two_gpus_end_to_end(tmp_path):
    result = run_check(tmp_path, "2")
    assert result.returncode == 0, result.stderr
    record = load_record(tmp_path / "out" / "e2e.json")
    assert record["status"] == "ok", record["reason"]
    m = record["metrics"]
    assert m["cells"] == 2 and set(m["wall_s"]) == {"1", "2"}
    # the one-GPU run kept every cell on GPU 0; the two cells of the two-GPU run ran at once, one per GPU
    assert {r["cuda_visible_devices_gpus1"] for r in m["per_cell"]} == {"0"}
    assert m["against_baseline"]["2"]["gpus_used"] == ["0", "1"]
    assert m["against_baseline"]["2"]["training_step_cells_compared"] == 2
    for k in (1, 2):  # each run's Snakemake output is kept
        assert "steps (100%) done" in (tmp_path / "logs" / f"gpus{k}.log").read_text()
    # only the cells ran: no report in the copies
    assert not list((tmp_path / "work").glob("gpus*/report/*.md"))

    text = scaleout_report.section([record], "cpu", "results/cpu/scaleout/e2e.json")
    assert "### 2 GPUs against 1" in text and "speed-up of" in text
    assert f"{m['against_baseline']['2']['speedup']:.2f}×" in text


def test_host_with_too_few_gpus_gets_an_unsupported_record(tmp_path):
    result = run_check(tmp_path, "1")
    assert result.returncode == 0, result.stderr
    record = load_record(tmp_path / "out" / "e2e.json")
    assert record["status"] == "unsupported"
    assert "has 1 GPU(s)" in record["reason"] and "needs 2" in record["reason"]
    text = scaleout_report.section([record], "cpu")
    assert "Not measured" in text and "has 1 GPU(s)" in text


def test_failing_run_fails_loudly_with_its_log(tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()  # no Snakefile there: snakemake fails
    with pytest.raises(RuntimeError, match="the 1-GPU run failed"):
        scaleout.run_pipeline(workdir, 1, tmp_path / "log.txt", tmp_path / "locks")


def test_report_without_a_record_says_how_to_run_it(tmp_path):
    assert scaleout_report.main(["--device", "h200", "--sections-dir", str(tmp_path)]) == 0
    text = (tmp_path / "scale_out.md").read_text()
    assert "Not measured on `h200`" in text and "scaleout --resources gpu=2" in text


def test_all_never_runs_the_check_and_the_scaleout_target_does(tmp_path):
    work = tmp_path / "copy"
    scaleout.prepare(work, yaml.safe_load((REPO / "config.yaml").read_text()) | {"device": "cpu"}, REPO)

    def dry_run(target: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "snakemake", "-n", "--cores", "2", target],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    assert "scaleout_cell" not in dry_run("all")
    assert "rule scaleout_cell:" in dry_run("scaleout")
