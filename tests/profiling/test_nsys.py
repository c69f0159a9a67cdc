"""Reading an nsys export, on a fixture cut from a real H200 report of the small model's plain attention
(tests/fixtures/nsys: cut_fixture.py, capture.sh), against ``nsys stats --report cuda_gpu_kern_sum
--filter-nvtx <block>`` of the full report; and running nsys, with fake ones that fail in nsys's ways."""

from __future__ import annotations

import csv
import gzip
import os
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from lmperf.profiling import nsys
from lmperf.profiling.phases import attribute, cell_range_name, summarize_cell

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nsys"


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("nsys") / "small_fp32_ctx128.sqlite"
    with sqlite3.connect(path) as con, gzip.open(FIXTURES / "small_fp32_ctx128.sql.gz", "rt") as f:
        con.executescript(f.read())
    return path


def stats(mode: str) -> dict[str, tuple[int, int]]:
    with open(FIXTURES / f"stats_ctx128_{mode}_cuda_gpu_kern_sum.csv") as f:
        return {r["Name"]: (int(r["Instances"]), int(r["Total Time (ns)"])) for r in csv.DictReader(f)}


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_block_totals_match_nsys_stats(db, mode):
    """Per kernel name, launches and total time in the block equal nsys's own report."""
    trace = nsys.read_sqlite(db)
    assert all(x.launch_known and x.launch_ns <= x.start_ns for x in trace.kernels)
    block = [r for r in trace.ranges if r.name == cell_range_name(128, mode)]
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for x, owner in zip(trace.kernels, attribute(trace.kernels, block, {block[0].name})):
        if owner:
            totals[x.name] = [totals[x.name][0] + 1, totals[x.name][1] + x.end_ns - x.start_ns]
    assert {n: tuple(v) for n, v in totals.items()} == stats(mode)
    s = summarize_cell(trace, 128, mode, top_n=100)
    phases = ("forward", "backward", "optimizer_step") if mode == "training" else ("inference_forward",)
    assert s["unattributed_kernels"] == 0  # backward kernels are launched from the autograd thread, and kept
    assert sum(s["phases"][p]["launches_per_step"] * 2 for p in phases) == sum(n for n, _ in stats(mode).values())


def test_plain_attention_runs_as_matmuls_and_softmax_pieces(db):
    """Issue 51, the other side: the course's attention has no fused kernel; its ranges hold matmuls (QKᵀ, PV)
    and, in the softmax range, reductions and elementwise kernels only."""
    s = summarize_cell(nsys.read_sqlite(db), 128, "inference")
    att = s["attention"]["ranges"]
    assert {a["range_count_per_step"] for a in att.values()} == {12}  # the small model's layers
    classes = {name: {c for c, ms in a["class_ms_per_step"].items() if ms} for name, a in att.items()}
    assert "matmul" in classes["computing attention scores"] and "matmul" in classes["final matmul"]
    assert classes["computing softmax"] <= {"reduction", "elementwise", "memory"}
    assert not any("attention" in c for c in classes.values())
    assert s["phases"]["inference_forward"]["class_share"]["attention"] == 0


def test_reader_without_runtime_table_flags_launches_and_refuses_a_report_without_kernels(tmp_path):
    with sqlite3.connect(tmp_path / "a.sqlite") as con:
        con.executescript("""
            CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
            INSERT INTO StringIds VALUES (1, 'void k<float>(float*)'), (2, 'k'), (3, 'forward');
            CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, "end" INT, correlationId INT, demangledName INT, shortName INT);
            INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (10, 20, 5, 1, 2);
            CREATE TABLE NVTX_EVENTS (start INT, "end" INT, text TEXT, textId INT, globalTid INT);
            INSERT INTO NVTX_EVENTS VALUES (0, 100, NULL, 3, 7), (50, NULL, 'a mark', NULL, 7);
        """)  # fmt: skip
    t = nsys.read_sqlite(tmp_path / "a.sqlite")
    assert [(x.name, x.short_name, x.launch_ns, x.launch_known) for x in t.kernels] == [
        ("void k<float>(float*)", "k", 10, False)
    ]
    assert [(r.name, r.start_ns, r.end_ns, r.thread) for r in t.ranges] == [("forward", 0, 100, 7)]
    sqlite3.connect(tmp_path / "b.sqlite").close()
    with pytest.raises(nsys.NsysError, match="no CUPTI_ACTIVITY_KIND_KERNEL"):
        nsys.read_sqlite(tmp_path / "b.sqlite")


def fake_nsys(tmp_path: Path, body: str) -> str:
    path = tmp_path / "nsys"
    path.write_text('#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = "-o" ] && base=$2; shift; done\n' + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_failing_nsys_raises_with_its_stderr(tmp_path, capsys):
    fake = fake_nsys(tmp_path, 'echo "Error: unrecognised option --cpuctxsw" >&2; exit 3')
    with pytest.raises(nsys.NsysError, match="exit status 3(.|\n)*unrecognised option --cpuctxsw"):
        nsys.profile(fake, tmp_path / "rep", ["true"])
    assert "unrecognised option" in capsys.readouterr().err  # echoed to the rule's log as well
    with pytest.raises(nsys.NsysError, match="wrote no report"):
        nsys.profile(fake_nsys(tmp_path, "exit 0"), tmp_path / "rep", ["true"])
    with pytest.raises(nsys.NsysError, match="not an executable"):
        nsys.find_nsys(str(tmp_path / "no-nsys"))


def test_reports_come_back_in_the_order_of_their_ranges_and_a_dotted_name_is_found(tmp_path):
    fake = fake_nsys(tmp_path, 'for i in 10 2 1 3 4 5 6 7 8 9; do echo $i > "$base.$i.nsys-rep"; done')
    old = tmp_path / "nsys_fp32.7.nsys-rep"
    old.write_text("left from an earlier run")
    os.utime(old, (1, 1))
    reports = nsys.profile_ranges(fake, tmp_path / "nsys_fp32", ["true"], 10)
    assert [p.name for p in reports] == [f"nsys_fp32.range{i}.nsys-rep" for i in range(1, 11)]
    assert [p.read_text().strip() for p in reports] == [str(i) for i in range(1, 11)]
    dotted = fake_nsys(tmp_path, 'touch "${base%%.*}.nsys-rep"')  # takes "2.7B_fp32" for a name and an extension
    assert nsys.profile(dotted, tmp_path / "2.7B_fp32", ["true"]) == tmp_path / "2.7B_fp32.nsys-rep"
