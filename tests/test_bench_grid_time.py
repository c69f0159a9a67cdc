"""bench/grid_time_breakdown.py: a record's share of its process's time, grouped, overlaps counted once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture
def breakdown(bench_module):
    return bench_module("grid_time_breakdown")


def write(root: Path, name: str, kind: str, cell: dict, start: str, age_s: float, **settings) -> None:
    path = root / "results" / "dev" / kind / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    provenance = {"process_start_time": start, "process_age_s": age_s, "hostname": "h", "settings": settings}
    path.write_text(json.dumps({"kind": kind, "cell": cell, "status": "ok", "provenance": provenance}))


def test_shares_follow_each_process_and_overlapping_compiles_count_once(breakdown, tmp_path, monkeypatch):
    # one attention process writes two records: 10 s (start-up included), then 5 s more
    write(
        tmp_path,
        "a",
        "attention",
        {"implementation": "plain", "sequence_length": 1024},
        "2026-01-01T00:00:00+00:00",
        10,
    )
    write(
        tmp_path,
        "b",
        "attention",
        {"implementation": "plain", "sequence_length": 65536},
        "2026-01-01T00:00:00+00:00",
        15,
    )
    # two compile processes side by side: 00:01:00-00:01:40 and 00:01:20-00:02:00, 60 s covered
    write(tmp_path, "c1", "e2e_compile", {}, "2026-01-01T00:01:00+00:00", 40)
    write(tmp_path, "c2", "e2e_compile", {}, "2026-01-01T00:01:20+00:00", 40)
    # an e2e cell of our kernels in the model, 20 s after the attention process ended (a short gap)
    cell = {"model": "small", "compile": "eager", "warmup_steps": 5}
    write(tmp_path, "e", "e2e", cell, "2026-01-01T00:00:35+00:00", 5, attention="flash")
    monkeypatch.chdir(tmp_path)

    seconds, gaps, processes = breakdown.breakdown("dev")

    assert processes == 4
    assert seconds[("attention plain, N <= 16384", "course")] == pytest.approx(10)
    assert seconds[("attention plain, N > 16384", "beyond the course")] == pytest.approx(5)
    assert seconds[("e2e_compile job (cold compiles of the 20 compiled cells)", "course")] == pytest.approx(60)
    assert seconds[("e2e attention_compare (our kernels in the whole model)", "beyond the course")] == pytest.approx(5)
    # 00:00:15 -> 00:00:35 and 00:00:40 -> 00:01:00: 40 s of gaps, each under the 30 s pause threshold
    assert gaps == pytest.approx(40)


def test_no_records_is_a_clear_error(breakdown, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["grid_time_breakdown.py", "nowhere"])
    with pytest.raises(SystemExit, match="no records with process times under results/nowhere/"):
        breakdown.main()
