"""The front page's Across devices section and the header's measured time (lmperf.report.devices)."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from lmperf.core.record import load_record, make_record, write_record
from lmperf.report import answers, devices
from lmperf.report.common import commits_words
from tests.kinds.records import provenance as base_provenance

REPO = Path(__file__).resolve().parents[2]
START = dt.datetime(2026, 11, 22, 10, 0, 0, tzinfo=dt.timezone.utc)


def provenance(device: str, start_s: float = 0.0, age_s: float = 10.0, **settings) -> dict:
    start = START + dt.timedelta(seconds=start_s)
    process = {"process_start_time": start.isoformat(timespec="milliseconds"), "process_age_s": age_s}
    started = (start + dt.timedelta(seconds=age_s)).isoformat(timespec="seconds")
    fields = dict(settings=settings, start_time=started, code_version="0123456789abcdef", **process)
    return base_provenance(device, f"NVIDIA {device.upper()}", git_commit="0" * 40, torch_version="2.11", **fields)


def write_grid(root: Path, device: str, scale: float) -> None:
    """e2e cells whose step doubles with the context, and memory peaks (the same on every device)."""
    for i, ctx in enumerate((128, 256, 512)):
        cell = {"model": "small", "context_length": ctx, "precision": "fp32", "compile": "eager", "warmup_steps": 5}
        metrics = {"training_step_ms_median": ctx / 4 * scale, "process_start_to_first_step_s": 1.0 + i}
        record = make_record("e2e", cell, "ok", metrics, provenance(device, 20.0 * i, 15.0))
        write_record(root / device / "e2e" / f"small_ctx{ctx}.json", record)
        cell = {"model": "2.7B", "context_length": ctx, "precision": "fp32", "mode": "training"}
        record = make_record("memory", cell, "ok", {"peak_allocated_mib": 1000.0 + ctx}, provenance(device, 100.0))
        write_record(root / device / "memory" / f"2.7B_ctx{ctx}.json", record)


def rows(text: str) -> dict[str, list[str]]:
    """The summary table's rows by kind."""
    table = text.split("| kind |")[1].split("\n\n")[0]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    return {row[0]: row for row in cells}


def test_one_row_per_kind_with_ratio_verdict_and_evidence(tmp_path):
    write_grid(tmp_path, "h100", 1.0)
    write_grid(tmp_path, "h200", 0.8)
    text = devices.across_devices(tmp_path, "h100", report_dir=tmp_path)
    assert "[`h100`](h100/answers.md), [`h200`](h200/answers.md)" in text
    found = rows(text)
    assert list(found) == list(devices.COMPARE_MODULES)
    assert found["e2e"][3] == "0.80× [0.80, 0.80]" and found["e2e"][5].startswith("`h200` faster (0.80×)")
    assert found["memory"][5] == "the same peaks: the same allocations on both devices"
    assert found["flash"][3] == "—" and found["flash"][5].startswith("not compared")
    # a fold with its table for each kind that has one, none for the kinds not compared
    assert re.findall(r"<summary>(\w+):", text) == ["e2e", "memory"]
    assert "Every compared cell ran the same code on each device." in text


def test_a_local_cpu_run_is_left_out_and_one_device_compares_nothing(tmp_path):
    write_grid(tmp_path, "h100", 1.0)
    assert "nothing to compare yet" in devices.across_devices(tmp_path, "h100")
    write_grid(tmp_path, "cpu", 50.0)
    assert "nothing to compare yet" in devices.across_devices(tmp_path, "h100")
    write_grid(tmp_path, "h200", 0.8)
    assert "cpu" not in devices.across_devices(tmp_path, "h100")


def test_a_record_with_another_code_version_is_different_code(tmp_path):
    write_grid(tmp_path, "h100", 1.0)
    write_grid(tmp_path, "h200", 0.8)
    assert "Every compared cell ran the same code" in devices.across_devices(tmp_path, "h100")
    path = tmp_path / "h200" / "e2e" / "small_ctx128.json"
    record = load_record(path)
    record["provenance"]["code_version"] = "fedcba9876543210"
    write_record(path, record)
    text = devices.across_devices(tmp_path, "h100")
    assert "**1 of 6 compared cells ran different code on different devices**" in text


def test_header_time_counts_each_process_once_and_overlaps_once():
    def rec(kind, start_s, age_s, **prov):
        cell = {"probe": kind, "at": start_s}
        return make_record(kind, cell, "ok", {"x": 1}, {**provenance("h100", start_s, age_s), **prov})

    records = [
        rec("e2e", 0.0, 10.0),
        rec("e2e_compile", 5.0, 10.0),  # e2e's package: overlaps the e2e process by 5 s
        rec("e2e_compile", 6.0, 4.0),  # inside the one before
        rec("ladder", 100.0, 20.0),
        rec("ladder", 100.0, 30.0),  # the same process, later record: the process ran 30 s
        rec("gemm_peak", 200.0, 6.0),
    ]
    untimed = make_record("memory", {"m": 1}, "ok", {"x": 1}, {**provenance("h100"), "process_age_s": None})
    t = devices.header_time([*records, untimed])
    assert t["per_kind_s"] == pytest.approx({"e2e": 15.0, "ladder": 36.0})
    assert t["total_s"] == pytest.approx(51.0) and t["processes"] == 5 and t["untimed_records"] == 1
    lines = devices.timing_lines(records)
    assert lines == [
        "- Measured time: 51 s of cell processes (5 processes, those that ran at once counted once); "
        "per kind: ladder 36 s, e2e 15 s"
    ]


def test_header_time_says_when_merged_records_leave_their_later_trials_out():
    start = provenance("h100", 0.0, 10.0)
    merged = make_record("e2e", {"model": "small"}, "ok", {"x": 1, "trials": [{}, {}, {}]}, start)
    single = make_record("e2e", {"model": "medium"}, "ok", {"x": 1, "trials": [{}]}, provenance("h100", 20.0, 5.0))
    t = devices.header_time([merged, single])
    assert (t["merged_records"], t["later_trials"], t["processes"]) == (1, 2, 2)
    (line,) = devices.timing_lines([merged, single])
    assert line.startswith("- Measured time: 15 s of first-trial cell processes (2 processes, those that ran at once")
    assert line.endswith("so the 2 later trials of its 1 merged records are not in this figure")
    assert "first-trial" not in devices.timing_lines([single])[0]


def test_header_time_start_up_and_no_process_times():
    e2e = make_record("e2e", {"model": "small"}, "ok", {"process_start_to_first_step_s": 0.6}, provenance("h100"))
    t = devices.header_time([e2e])
    assert (t["startup_median_s"], t["startup_n"]) == (0.6, 1)
    startup = "- Per-cell start-up (e2e, process start → first step): median 0.6 s over 1 cells"
    assert devices.timing_lines([e2e])[1] == startup
    bare = {**provenance("h100")}
    del bare["process_start_time"]
    lines = devices.timing_lines([make_record("e2e", {"model": "small"}, "ok", {"x": 1}, bare)])
    assert lines == ["- Measured time: not recorded (these records carry no process times)"]


def test_commits_are_named_once_with_their_counts():
    record = {"provenance": {"git_commit": "a" * 40, "git_dirty": False}}
    assert commits_words([record, record]) == ", commit `aaaaaaa`"
    other = {"provenance": {"git_commit": "b" * 40, "git_dirty": True}}
    assert commits_words([record, other, record]) == ", commits `aaaaaaa` (2), `bbbbbbb (dirty)` (1)"


@pytest.mark.skipif(not (REPO / "results" / "h200").is_dir(), reason="needs the committed H100 and H200 records")
def test_every_kind_of_the_committed_records_has_a_compared_row():
    text = devices.across_devices(REPO / "results", "h100", report_dir=REPO / "report")
    found = rows(text)
    assert list(found) == list(devices.COMPARE_MODULES)
    for kind, row in found.items():
        assert re.match(r"\d\.\d\d× \[\d\.\d\d, \d\.\d\d\]$", row[3]), (kind, row)
        assert not row[5].startswith("not compared"), (kind, row)
    assert len(text.encode()) < 30_000


def test_the_front_page_links_the_compared_devices_not_a_local_cpu_report(tmp_path, monkeypatch):
    for device, scale in (("h100", 1.0), ("h200", 0.8), ("cpu", 50.0)):
        write_grid(tmp_path / "results", device, scale)
    monkeypatch.chdir(tmp_path)  # a local CPU run's report (git-ignored) beside the committed ones
    for device in ("cpu", "h200"):
        (tmp_path / "report" / device).mkdir(parents=True)
        (tmp_path / "report" / device / "answers.md").write_text("report\n")
    text = answers.front_page("h100", {}, tmp_path / "results", tmp_path / "report" / "answers.md")
    assert "Each device's full report: [h100](h100/answers.md), [h200](h200/answers.md);" in text
    assert "cpu/answers.md" not in text
