"""The flash report end to end: the interface the workflow calls (SECTIONS, ALSO_READS, outputs, main),
on committed H100 records and on none; every declared output written, every figure referenced."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from lmperf.kinds.flash import report

REPO = Path(__file__).resolve().parents[3]
H100 = REPO / "results" / "h100" / "flash"
GRID = {
    "correctness": {"implementations": ["pytorch", "triton"]},
    "benchmarking": {"precisions": ["bf16"], "implementations": ["plain", "flash", "sdpa"]},
    "leaderboard": {"implementations": ["flash", "sdpa_flash", "sdpa_cudnn"]},
}


def _run(tmp_path: Path, records: list[Path], grid: dict, device: str = "h100") -> dict[str, str]:
    argv = ["--device", device, "--out", str(tmp_path), "--grid", json.dumps(grid), "--records", *map(str, records)]
    assert report.main(argv) == 0
    return {name: (tmp_path / "sections" / f"{name}.md").read_text() for name in report.SECTIONS}


def _linked(sections: dict[str, str], device: str) -> set[str]:
    """Paths under --out that the sections link to (from report/<device>/answers.md)."""
    found = set()
    for text in sections.values():
        found |= set(re.findall(rf"\(\.\./\.\./results/{device}/((?:tables|figures)/[\w.]+)\)", text))
    return found


@pytest.mark.skipif(not H100.is_dir(), reason="no committed H100 flash records")
def test_main_on_committed_records_writes_and_references_every_output(tmp_path):
    records = [*H100.glob("correctness_*.json"), H100 / "leaderboard.json", *H100.glob("bench_*_bf16_d64_*.json")]
    sections = _run(tmp_path, records, GRID)
    outputs = report.outputs(GRID)
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.*") if "sections" not in p.parts}
    assert written == set(outputs) == _linked(sections, "h100")  # every output written and shown, every link a file
    for name, text in sections.items():
        assert text.endswith("\n") and not text.endswith("\n\n") and "\n\n\n" not in text, name
        assert "bench/" not in text and "flash_triton" not in text, name
    assert "5.364 ms on an H100 (the course's figure" in sections["leaderboard"]
    # the CSVs: one row per benchmark record, per correctness entry
    csv = pd.read_csv(tmp_path / "tables" / "flash_benchmarking.csv")
    assert len(csv) == 30 and set(csv.implementation) == {"plain", "flash", "sdpa"}
    correctness = pd.read_csv(tmp_path / "tables" / "flash_correctness.csv")
    assert len(correctness) == 252 and set(correctness.status) == {"ok"}


def test_a_device_without_the_kind_writes_one_line_per_section(tmp_path):
    assert report.outputs({}) == []
    sections = _run(tmp_path, [], {}, "cpu")
    assert sorted(p.name for p in tmp_path.rglob("*.*")) == sorted(f"{name}.md" for name in report.SECTIONS)
    assert sections["flash_benchmarking"] == "FlashAttention-2 was not measured on `cpu`.\n"
    assert sections["flash_forward"] == "FlashAttention-2 correctness was not measured on `cpu`.\n"
    assert sections["leaderboard"] == "The leaderboard configuration was not measured on `cpu`.\n"
    # with the kind in its grid: the declared figures are written without timings, but not shown
    sections = _run(tmp_path / "grid", [], GRID, "cpu")
    assert not {p for p in report.outputs(GRID) if p.startswith("figures/")} & _linked(sections, "cpu")
    assert all((tmp_path / "grid" / p).is_file() for p in report.outputs(GRID))
