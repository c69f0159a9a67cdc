"""bench/compile_exit_probe.py: one JSON line per (compile_threads, cache) with the process's time
and its exit's, the thread count it asked for in force, the two settings sharing one cache.

On CPU (no CUDA here) the exit's length says nothing about an H100 host's; what is checked is that
the probe measures what it says: four runs on one cache, only the first cold, two with Inductor's
own worker count and then two with one worker, and the exit inside the process's time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_probe_reports_each_setting_cold_then_warm():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench/compile_exit_probe.py"), "cpu"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    import torch._inductor.config as inductor_config

    default = inductor_config.compile_threads
    assert [(r["compile_threads"], r["cache"]) for r in rows] == [
        (default, "cold"),
        (default, "warm"),
        (1, "warm"),
        (1, "warm"),
    ]
    for row in rows:
        assert row["device"] == "cpu"
        assert 0 <= row["exit_s"] < row["process_s"]
