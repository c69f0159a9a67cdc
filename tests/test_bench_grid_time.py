"""bench/grid_time_breakdown.py: a record's share of its process's time, grouped, overlaps counted once."""

from __future__ import annotations

import datetime as dt
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

    seconds, gaps, processes, _, restarts, shares = breakdown.breakdown("dev")

    assert processes == 4
    assert seconds[("attention plain, N <= 16384", "course")] == pytest.approx(10)
    assert seconds[("attention plain, N > 16384", "beyond the course")] == pytest.approx(5)
    assert seconds[("e2e_compile job (cold compiles of the 20 compiled cells)", "course")] == pytest.approx(60)
    assert seconds[("e2e attention_compare (our kernels in the whole model)", "beyond the course")] == pytest.approx(5)
    # 00:00:15 -> 00:00:35 and 00:00:40 -> 00:01:00: 40 s of gaps, each under the 30 s pause threshold,
    # each counted with the process before it (an attention process that ended on an addition's share,
    # then our kernels in the model)
    assert gaps == {"beyond the course": pytest.approx(40)} and restarts == (0, 0)
    assert shares["attention/a.json"] == (pytest.approx(10), "course", "ok")
    assert shares["attention/b.json"] == (pytest.approx(5), "additions", "ok")
    # a Snakemake run that began in the second gap makes it a restart, summed apart
    from lmperf.core import run_log

    run_log.note_start(tmp_path / "results" / "dev", dt.datetime(2026, 1, 1, 0, 0, 50, tzinfo=dt.timezone.utc))
    _, gaps, _, _, restarts, _ = breakdown.breakdown("dev")
    assert gaps == {"beyond the course": pytest.approx(20)} and restarts == (1, pytest.approx(20))


def test_no_records_is_a_clear_error(breakdown, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["grid_time_breakdown.py", "nowhere"])
    with pytest.raises(SystemExit, match="no records with process times under results/nowhere/"):
        breakdown.main()


def test_timed_passes_follow_each_protocol(breakdown):
    e2e = {
        "kind": "e2e",
        "metrics": {"training_step_ms_median": 100.0, "inference_forward_ms_median": 50.0},
        "provenance": {"settings": {"warmup_steps": 5, "measured_steps": 10}},
    }
    # 15 training steps of 0.1 s and 15 no-grad forwards of 0.05 s
    assert breakdown.timed_passes_s(e2e) == pytest.approx(2.25)
    attention = {
        "kind": "attention",
        "metrics": {
            "forward_warmup_passes": 5,
            "forward_n": 100,
            "forward_ms_mean": 10.0,
            "backward_warmup_passes": 5,
            "backward_n": 100,
            "backward_ms_mean": 20.0,
        },
    }
    # 105 forwards, then 105 backwards each behind an untimed forward
    assert breakdown.timed_passes_s(attention) == pytest.approx(105 * 0.01 + 105 * 0.03)
    # do_bench: a first call and 5 to estimate, then the windows, each at least one call long
    assert breakdown.do_bench_s(2.0, 25, 100) == pytest.approx((12 + 25 + 100) / 1e3)
    assert breakdown.do_bench_s(200.0, 25, 100) == pytest.approx((1200 + 200 + 200) / 1e3)
    bench = {
        "kind": "flash",
        "cell": {"test": "benchmark"},
        "metrics": {"forward_ms_median": 2.0, "backward_ms_median": None, "forward_backward_ms_median": 2.0},
        "provenance": {"settings": {"warmup_ms": 25, "rep_ms": 100}},
    }
    assert breakdown.timed_passes_s(bench) == pytest.approx(2 * 0.137)
    leaderboard = {
        "kind": "flash",
        "cell": {"test": "leaderboard"},
        "metrics": {"side_by_side": [{}] * 6},
        "provenance": {
            "settings": {
                "warmup_ms": 1000,
                "rep_ms": 10000,
                "protocol_head_dims": [64, 128],
                "implementations": ["a", "b", "c"],
                "table_warmup_ms": 25,
                "table_rep_ms": 100,
            }
        },
    }
    # 2 head dims x 3 implementations x 11 s, and 6 table rows x 3 timings x 0.125 s
    assert breakdown.timed_passes_s(leaderboard) == pytest.approx(66 + 18 * 0.125)
    assert breakdown.timed_passes_s({"kind": "nsys"}) is None


def test_a_group_with_an_unread_protocol_has_no_timed_passes(breakdown, tmp_path, monkeypatch):
    cell = {"model": "small", "context_length": 128, "precision": "fp32", "mode": "training"}
    write(tmp_path, "n", "nsys", cell, "2026-01-01T00:00:00+00:00", 30)
    write(tmp_path, "b", "nsys", dict(cell, precision="bf16"), "2026-01-01T00:01:00+00:00", 20)
    monkeypatch.chdir(tmp_path)
    _, _, _, timed, _, _ = breakdown.breakdown("dev")
    # the course profiles in fp32; the bf16 profiles are this project's (report header's grid_part)
    assert timed == {("nsys profiles", "course"): None, ("nsys profiles", "beyond the course"): None}


def test_nsys_processes_that_split_their_time_get_a_table(breakdown, tmp_path, monkeypatch, capsys):
    """Two records of one nsys process carry its time split (the process's time is its last record's
    age); a record without the split (older code) is left out."""
    stage = {"profile": 20.0, "export": 6.5, "read": 1.25, "nvtx_overhead": 3.0}
    for name, age, mode in (("s_train", 31.0, "training"), ("s_inf", 31.5, "inference")):
        write(
            tmp_path,
            name,
            "nsys",
            {"model": "small", "precision": "fp32", "mode": mode},
            "2026-01-01T00:00:00+00:00",
            age,
        )
        path = tmp_path / "results/dev/nsys" / f"{name}.json"
        record = json.loads(path.read_text())
        record["metrics"] = {"stage_s": stage, "capture_start_process_age_s": 9.0}
        path.write_text(json.dumps(record))
    write(
        tmp_path,
        "old",
        "nsys",
        {"model": "xl", "precision": "fp32", "mode": "training"},
        "2026-01-01T00:01:00+00:00",
        40,
    )
    monkeypatch.chdir(tmp_path)
    assert breakdown.nsys_stages("dev") == [("small", "fp32", 31.5, stage, 9.0)]
    monkeypatch.setattr("sys.argv", ["grid_time_breakdown.py", "dev"])
    breakdown.main()
    out = capsys.readouterr().out
    assert "| small | fp32 | 31.5 | 20.0 | 9.0 | 6.5 | 1.2 | 3.0 |" in out
    assert "| xl |" not in out


def test_nsys_stages_of_a_process_that_profiles_several_sizes(breakdown, tmp_path, monkeypatch):
    """One process per precision (lmperf.kinds.nsys.cell): one row, its sizes in the order they were
    profiled, the process's stages once and the sizes' NVTX timings summed."""
    for model, capture, nvtx in (("small", 30.0, 0.5), ("2.7B", 10.0, 3.0)):
        for mode, age in (("inference", 60.0), ("training", 61.0 if model == "small" else 50.0)):
            name = f"{model}_{mode}"
            write(
                tmp_path,
                name,
                "nsys",
                {"model": model, "precision": "fp32", "mode": mode},
                "2026-01-01T00:00:00+00:00",
                age,
            )
            path = tmp_path / "results/dev/nsys" / f"{name}.json"
            record = json.loads(path.read_text())
            stage = {"profile": 40.0, "export": 2.0, "read": 1.5, "nvtx_overhead": nvtx}
            record["metrics"] = {"stage_s": stage, "capture_start_process_age_s": capture}
            path.write_text(json.dumps(record))
    monkeypatch.chdir(tmp_path)
    assert breakdown.nsys_stages("dev") == [
        ("2.7B, small", "fp32", 61.0, {"profile": 40.0, "export": 2.0, "read": 1.5, "nvtx_overhead": 3.5}, 10.0)
    ]


def test_course_only_here_counts_the_course_cells_the_other_device_did_not_run(breakdown):
    here = {
        "e2e/xl_ctx1024.json": (30.0, "course", "ok"),  # out of memory on the other device: counted
        "e2e/small_ctx128.json": (2.0, "course", "ok"),  # ran on both
        "attention/plain_n65536.json": (4.0, "additions", "ok"),  # not the course's
        "nsys/xl_ctx1024.json": (0.0, "course", "ok"),  # written with an earlier size: no time of its own
        "e2e/2.7B_ctx1024.json": (1.0, "course", "oom"),  # did not run here either
    }
    other = {
        "e2e/xl_ctx1024.json": (0.5, "course", "oom"),
        "e2e/small_ctx128.json": (2.5, "course", "ok"),
        "e2e/2.7B_ctx1024.json": (0.5, "course", "oom"),
    }
    assert breakdown.course_only_here(here, other) == (2, pytest.approx(30.0))
    assert breakdown.course_only_here(other, here) == (0, 0)


def test_a_record_that_ran_the_course_first_splits_its_group(breakdown, tmp_path, monkeypatch):
    """The leaderboard's process: 25 s up to its course part's end (our kernel's protocol run), 65 s of
    additions after; the timed passes split the same way (one do_bench of 1 + 10 s for the course's)."""
    path = tmp_path / "results" / "dev" / "flash" / "leaderboard.json"
    path.parent.mkdir(parents=True)
    settings = {"warmup_ms": 1000, "rep_ms": 10000, "protocol_head_dims": [64, 128]}
    settings |= {"implementations": ["flash_triton", "sdpa_flash", "sdpa_cudnn"]}
    provenance = {"process_start_time": "2026-01-01T00:00:00+00:00", "process_age_s": 90.0, "hostname": "h"}
    record = {"kind": "flash", "cell": {"test": "leaderboard"}, "status": "ok"}
    record |= {"metrics": {"course_part_process_age_s": 25.0}, "provenance": provenance | {"settings": settings}}
    path.write_text(json.dumps(record))
    monkeypatch.chdir(tmp_path)

    seconds, _, processes, timed, _, shares = breakdown.breakdown("dev")

    assert processes == 1
    assert seconds == pytest.approx(
        {("flash leaderboard", "course"): 25.0, ("flash leaderboard", "beyond the course"): 65.0}
    )
    assert timed[("flash leaderboard", "course")] == pytest.approx(11.0)
    assert timed[("flash leaderboard", "beyond the course")] == pytest.approx(5 * 11.0)
    assert shares["flash/leaderboard.json"] == (pytest.approx(90.0), "course", "ok")


def test_an_nsys_sizes_records_split_at_its_nvtx_timing_and_keep_the_process_time(breakdown, tmp_path, monkeypatch):
    """Two sizes of one fp32 nsys process, two records each written at the same age, each size's
    NVTX-overhead timing just before them: its seconds are this project's addition (as in the report
    header, lmperf.report.devices.record_parts), the rest the course's, and nothing is lost or counted
    twice however the records that share an age are ordered."""
    for model, age, nvtx in (("large", 50.0, 4.0), ("small", 53.0, 2.0)):
        for mode in ("inference", "training"):
            name = f"{model}_{mode}"
            cell = {"model": model, "precision": "fp32", "mode": mode}
            write(tmp_path, name, "nsys", cell, "2026-01-01T00:00:00+00:00", age)
            path = tmp_path / "results/dev/nsys" / f"{name}.json"
            record = json.loads(path.read_text())
            record["metrics"] = {"stage_s": {"profile": 40.0, "nvtx_overhead": nvtx}}
            path.write_text(json.dumps(record))
    monkeypatch.chdir(tmp_path)
    seconds, gaps, processes, _, _, _ = breakdown.breakdown("dev")
    assert processes == 1 and gaps == {}
    # 0-46 s course, 46-50 s large's NVTX timing, 50-51 s course (small's records from the trace), 51-53 s
    assert seconds[("nsys profiles", "course")] == pytest.approx(47.0)
    assert seconds[("nsys profiles", "beyond the course")] == pytest.approx(6.0)
