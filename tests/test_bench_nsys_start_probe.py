"""bench/nsys_start_probe.py: the stage ages it reads from its child, the medians and nsys's extra
it reports, and a clear stop where nsys is missing (no CUDA or nsys here)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("nsys_start_probe", ROOT / "bench/nsys_start_probe.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def _ages(base: float) -> dict[str, float]:
    return {stage: base + i for i, stage in enumerate(probe.STAGES)}


def test_parse_ages_reads_the_line_among_others():
    out = "warming\nAGES torch_imported=1.5000 cuda_ready=2.2500 step_done=4.0000\nbye\n"
    assert probe.parse_ages(out) == {"torch_imported": 1.5, "cuda_ready": 2.25, "step_done": 4.0}


def test_parse_ages_without_the_line_raises_with_the_output():
    with pytest.raises(RuntimeError, match="no AGES line") as raised:
        probe.parse_ages("Traceback (most recent call last): boom")
    assert "boom" in str(raised.value)


def test_summary_takes_medians_per_mode_and_the_difference():
    runs = [
        {"mode": "plain", "wall_s": 3.0, "ages": _ages(1.0)},
        {"mode": "plain", "wall_s": 9.0, "ages": _ages(5.0)},  # an outlier: the median of 3 ignores it
        {"mode": "plain", "wall_s": 4.0, "ages": _ages(2.0)},
        {"mode": "nsys", "wall_s": 10.0, "ages": _ages(4.0)},
        {"mode": "nsys", "wall_s": 12.0, "ages": _ages(6.0)},
    ]
    summary = probe.summarize(runs)
    assert summary["plain"]["runs"] == 3 and summary["nsys"]["runs"] == 2
    assert summary["plain"]["median_s"]["torch_imported"] == 2.0
    assert summary["plain"]["median_s"]["capture_stopped"] == 2.0 + len(probe.STAGES) - 1
    assert summary["plain"]["median_s"]["wall_s"] == 4.0
    assert summary["nsys"]["median_s"]["cuda_ready"] == 6.0  # (5 + 7) / 2
    assert summary["nsys_extra_s"]["torch_imported"] == 3.0
    assert summary["nsys_extra_s"]["wall_s"] == 7.0


def test_summary_of_one_mode_has_no_difference():
    summary = probe.summarize([{"mode": "plain", "wall_s": 1.0, "ages": _ages(0.5)}])
    assert "nsys" not in summary and "nsys_extra_s" not in summary


def test_without_nsys_it_stops_and_says_why():
    env = {**os.environ, "PATH": "/nonexistent", "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench/nsys_start_probe.py"), "1"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2
    assert "nsys is not on PATH" in done.stderr
