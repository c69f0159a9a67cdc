"""The memory report end to end: its outputs and layout on committed and synthetic records, what a CPU says,
and the one wording check of (c)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmperf.kinds.memory import grid as memory_grid
from lmperf.kinds.memory import report

from .records import cell, record, training

REPO = Path(__file__).resolve().parents[3]
GRID = {"models": ["2.7B"], "context_lengths": [128, 512], "precisions": ["fp32", "bf16"], "batch_size": 4}
GRID |= {"reference_model": "2.7B", "reference_context_length": 512}


def _run(out: Path, device: str, grid: dict, paths: list) -> str:
    argv = ["--device", device, "--out", str(out), "--grid", json.dumps(grid), "--records", *map(str, paths)]
    assert report.main(argv) == 0
    section = (out / "sections" / "memory_profiling.md").read_text()
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert written == set(report.outputs(grid)) | {"sections/memory_profiling.md"}
    assert "\n\n\n" not in section and section.endswith("\n") and not section.endswith("\n\n")
    return section


@pytest.mark.skipif(not (REPO / "results/h100/memory").is_dir(), reason="no committed H100 memory records")
def test_main_on_committed_records_references_every_timeline(tmp_path):
    paths = [REPO / memory_grid.record_path("h100", "memory", c) for c in report.grid_cells(GRID)]
    section = _run(tmp_path / "h100", "h100", GRID, paths)
    assert all(f"### ({part})" in section for part in "abcde")
    for figure in (p for p in report.outputs(GRID) if p.startswith("figures/")):
        assert f"](../../results/h100/{figure})" in section, figure
    assert "_Source: 8 records in `results/h100/memory/`" in section


def test_cpu_report_says_once_what_is_not_measured_and_without_records_that_there_are_none(tmp_path):
    grid = GRID | {"models": ["tiny"], "context_lengths": [32]}
    paths = [tmp_path / f"{c['precision']}_{c['mode']}.json" for c in report.grid_cells(grid)]
    for path, c in zip(paths, report.grid_cells(grid)):
        path.write_text(json.dumps(record(c | {"batch_size": 4}, {}, "unsupported", "needs CUDA", device="cpu")))
    section = _run(tmp_path / "cpu", "cpu", grid, paths)
    assert section.startswith("Not measured on a CPU") and "### (a)" not in section
    assert "figures/" not in section  # the timelines are written (empty) but not linked
    assert "4 · 512 · 2560 · 4 bytes = 20,971,520 bytes" in section  # (d) needs no history
    assert _run(tmp_path / "h200", "h200", {}, []).startswith("Memory was not measured on this device (`h200`)")


def test_c_golden_text(tmp_path):
    """The one wording check of (c): bf16 raises end-of-forward memory where its weight copies, 2 bytes ×
    (32 (4·2560² + 3·2560·10240) + 10000·2560) = 6.30 GiB, outweigh the activation bytes it saves."""
    rises = {(128, "fp32"): 5000.0, (128, "bf16"): 9600.0, (512, "fp32"): 29000.0, (512, "bf16"): 25000.0}
    step = dict(start=39_000.0, gradients=12_000.0, transient=12_000.0)
    records = [
        record(cell(c, p), training(forward_rise=r, saved_for_backward_mib=r, **step)) for (c, p), r in rises.items()
    ]
    answer = report.section_c(report.F.steps(records)).split("\n\n")[1]
    assert answer == (
        "bf16 leaves 1 of 2 peaks within 2% of fp32's; it lowers the full-step peak at context 512 by 5.9% (66.41 → "
        "62.50 GiB). It raises end-of-forward memory at context 128 (42.97 → 47.46 GiB): the bf16 copies of the "
        "matmul weights autograd saves for backward (6.30 GiB) outweigh the activation bytes bf16 saves (1.81 GiB). "
        "It lowers end-of-forward memory at context 512 (66.41 → 62.50 GiB): the activation bytes bf16 saves (10.20 "
        "GiB) outweigh the bf16 copies of the matmul weights autograd saves for backward (6.30 GiB)."
    )
