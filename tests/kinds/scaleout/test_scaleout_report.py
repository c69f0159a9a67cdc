"""The scale-out check's report: each cell's verdict only beyond the noise, the counts its sentences
give, and main's outputs with and without a record."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lmperf.core.record import make_record
from lmperf.kinds.scaleout import report
from tests.kinds.records import provenance

REPO = Path(__file__).resolve().parents[3]
PROV = provenance("h200", "NVIDIA H200")


def row(name: str, one: float, two: float, interval: float | None = None) -> dict:
    """A per-cell row: training step ``one`` ms on 1 GPU, ``two`` on 2; the forward a third of it."""
    out = {"cell": name, "cuda_visible_devices_gpus2": "1"}
    for metric, scale in (("training_step_ms_median", 1.0), ("inference_forward_ms_median", 1 / 3)):
        for k, value in ((1, one), (2, two)):
            out[f"{metric}_gpus{k}"] = value * scale
            if interval is not None:
                out[f"{metric}_interval_gpus{k}"] = [value * scale * (1 - interval), value * scale * (1 + interval)]
                out[f"{metric}_trials_gpus{k}"] = 5
    return out


def record(rows: list[dict], walls=(60.0, 30.0)) -> dict:
    metrics = {
        "baseline_gpus": 1,
        "cells": len(rows),
        "wall_s": {"1": walls[0], "2": walls[1]},
        "against_baseline": {"2": {"gpus_used": ["0", "1"]}},
        "per_cell": rows,
        "host_gpus": ["0", "1"],
    }
    cell = {"grid": "e2e", "gpus": [1, 2], "models": ["small"], "context_lengths": [256], "precisions": ["fp32"]}
    return make_record("scaleout", cell, "ok", metrics, PROV)


@pytest.mark.parametrize(
    ("two", "interval", "verdict"),
    [
        (130.0, 0.01, "slower"),  # 1.3x slower, tight intervals
        (130.0, 0.2, "within noise"),  # the same change, intervals that overlap
        (77.0, 0.01, "faster"),
        (105.0, None, "within noise"),  # single runs: 5% is inside twice the margin
        (110.0, None, "slower"),  # single runs: 10% is outside it
    ],
)
def test_a_cell_differs_only_beyond_the_noise(two, interval, verdict):
    runs = report.runs_from(record([row("a", 100.0, two, interval)]))
    (run,) = runs
    assert {d.verdict for d in run.diffs} == {verdict}
    assert report.single_trials(runs) == (interval is None)
    assert run.diffs[0].change == pytest.approx(two / 100.0 - 1)


def test_the_sentences_count_the_cells_and_where_the_differing_ones_are():
    rows = [row("s1", 10.0, 13.0), row("s2", 12.0, 12.1), row("s3", 14.0, 11.0)]
    rows += [row("l1", 100.0, 101.0), row("l2", 200.0, 199.0), row("l3", 300.0, 330.0)]
    (run,) = report.runs_from(record(rows, walls=(60.0, 40.0)))
    assert run.speedup == pytest.approx(1.5) and run.efficiency == pytest.approx(0.75)
    short, long = run.halves("training_step_ms_median")
    assert [d.cell for d in short] == ["s1", "s2", "s3"] and [d.cell for d in long] == ["l1", "l2", "l3"]
    text = report.run_text(run)
    assert "1.50×, 75% of the ideal 2×" in text
    assert (
        "The training step of 3 of 6 cells is within the noise of its 1-GPU time and 3 differ "
        "(2 slower, 1 faster on 2 GPUs; 2 of them among the 3 cells with the shortest times)"
    ) in text
    assert "change by 1.0% in the median, the 3 shortest by 21.4%" in text
    same = report.runs_from(record([row("a", 100.0, 101.0), row("b", 50.0, 49.0)]))[0]
    assert "of all 2 cells is within the noise" in report.run_text(same)


def test_main_on_the_committed_record_writes_its_outputs_and_references_its_figure(tmp_path):
    path = REPO / "results" / "h200" / "scaleout" / "e2e.json"
    grid = {"gpus": [1, 2], "e2e": {"models": ["small"], "context_lengths": [256], "precisions": ["fp32"]}}
    argv = ["--device", "h200", "--out", str(tmp_path), "--grid", json.dumps(grid), "--records", str(path)]
    assert report.main(argv) == 0
    for out in report.outputs(grid):
        assert (tmp_path / out).stat().st_size > 0, out
    text = (tmp_path / "sections" / "scale_out.md").read_text()
    assert f"](../../results/h200/{report.FIGURE})" in text and f"(../../results/h200/{report.CSV})" in text
    committed = json.loads(path.read_text())["metrics"]
    csv = (tmp_path / report.CSV).read_text().splitlines()
    assert len(csv) == 1 + 2 * committed["cells"]  # a row per cell and compared time
    assert re.search(r"took [\d.]+ s against [\d.]+ s one at a time", text)


def test_main_without_a_record_says_how_to_run_it_writes_its_outputs_and_an_unsupported_one_its_reason(tmp_path):
    assert report.main(["--device", "h100", "--out", str(tmp_path), "--grid", "{}"]) == 0
    assert all((tmp_path / out).exists() for out in report.outputs({}))
    text = (tmp_path / "sections" / "scale_out.md").read_text()
    assert text.count("\n") == 1 and "not measured on `h100`" in text and "scaleout --resources gpu=2" in text
    assert report.FIGURE not in text  # written (empty) but not linked
    # an unsupported record gives its reason
    r = make_record("scaleout", {"grid": "e2e"}, "unsupported", {}, PROV, "this host has 1 GPU(s); the check needs 2")
    text = report.section([r], "h100")
    assert "not measured on `h100`: this host has 1 GPU(s); the check needs 2. Run" in text
