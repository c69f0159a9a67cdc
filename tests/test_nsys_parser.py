"""The nsys SQLite reader and the kernel classifier, on a fixture cut from a real GPU report.

tests/fixtures/nsys/small_fp32_ctx128.sql.gz holds the `lmperf ctx=128 inference` and
`lmperf ctx=128 training` blocks (2 measured steps each) of the small model's fp32 profile, cut
by cut_fixture.py from the export of an nsys run of lmperf.kinds.nsys.cell on an H200 (capture.sh).
The independent reference is `nsys stats --report cuda_gpu_kern_sum --filter-nvtx <block>` on
the full report (the two stats_*.csv files): kernel names, instances and total time per block.
"""

from __future__ import annotations

import csv
import gzip
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from lmperf.profiling import kernels as kn
from lmperf.profiling import nsys as nsys_tool
from lmperf.profiling.phases import attribute, cell_range_name, summarize_cell

FIXTURES = Path(__file__).parent / "fixtures" / "nsys"


@pytest.fixture(scope="module")
def fixture_db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("nsys_fixture") / "small_fp32_ctx128.sqlite"
    con = sqlite3.connect(path)
    with gzip.open(FIXTURES / "small_fp32_ctx128.sql.gz", "rt") as f:
        con.executescript(f.read())
    con.commit()
    con.close()
    return path


@pytest.fixture(scope="module")
def trace(fixture_db):
    return nsys_tool.read_sqlite(fixture_db)


def _stats(mode: str) -> dict[str, tuple[int, int]]:
    with open(FIXTURES / f"stats_ctx128_{mode}_cuda_gpu_kern_sum.csv") as f:
        return {r["Name"]: (int(r["Instances"]), int(r["Total Time (ns)"])) for r in csv.DictReader(f)}


def test_reader_finds_every_kernel_its_launch_and_the_ranges(fixture_db, trace):
    con = sqlite3.connect(fixture_db)
    n_kernels = con.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    n_ranges = con.execute('SELECT COUNT(*) FROM NVTX_EVENTS WHERE "end" IS NOT NULL').fetchone()[0]
    assert len(trace.kernels) == n_kernels > 5000
    assert len(trace.ranges) == n_ranges
    assert all(k.launch_known for k in trace.kernels)
    assert all(k.launch_ns <= k.start_ns for k in trace.kernels)  # launched before it ran
    assert {r.name for r in trace.ranges} >= {
        "forward",
        "backward",
        "optimizer_step",
        "inference_forward",
        "computing attention scores",
        "computing softmax",
        "final matmul",
    }
    gemms = [k for k in trace.kernels if "gemm" in k.name]
    assert gemms and all(k.short_name for k in gemms)


@pytest.mark.parametrize("mode", ["inference", "training"])
def test_block_totals_match_nsys_stats(trace, mode):
    """Per kernel name, instances and total time in the block equal nsys's own report."""
    name = cell_range_name(128, mode)
    block = [r for r in trace.ranges if r.name == name]
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for k, owner in zip(trace.kernels, attribute(trace.kernels, block, {name})):
        if owner is not None:
            totals[k.name][0] += 1
            totals[k.name][1] += k.end_ns - k.start_ns
    assert {n: tuple(v) for n, v in totals.items()} == _stats(mode)


def test_backward_kernels_come_from_another_thread_and_are_kept(fixture_db, trace):
    s = summarize_cell(trace, 128, "training", top_n=100)
    phases = s["phases"]
    assert phases["backward"]["steps"] == 2 and phases["backward"]["launches_per_step"] > 0
    assert s["unattributed_kernels"] == 0
    launches = sum(phases[p]["launches_per_step"] * 2 for p in ("forward", "backward", "optimizer_step"))
    assert launches == sum(n for n, _ in _stats("training").values())
    # The launches of backward kernels run on a thread other than the one holding the NVTX ranges:
    # a per-thread filter would have lost them.
    con = sqlite3.connect(fixture_db)
    range_threads = {r.thread for r in trace.ranges if r.name == "backward"}
    bwd = [r for r in trace.ranges if r.name == "backward"]
    launch_threads = {
        tid
        for start, tid in con.execute("SELECT start, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME")
        if any(b.start_ns <= start <= b.end_ns for b in bwd)
    }
    assert launch_threads - range_threads


def test_summaries_on_the_real_profile(trace):
    inf = summarize_cell(trace, 128, "inference", top_n=15)
    fwd = inf["phases"]["inference_forward"]
    assert fwd["steps"] == 2
    assert sum(fwd["class_share"].values()) == pytest.approx(1.0)
    top = fwd["top_kernels"][0]
    assert top["class"] == "matmul" and "gemm" in top["name"]
    stats = _stats("inference")
    assert top["launches"] == stats[top["name"]][0]
    assert top["total_ms"] == pytest.approx(stats[top["name"]][1] / 1e6)
    att = inf["attention"]["ranges"]
    n_layers = 12  # the small model
    for name in att:
        assert att[name]["range_count_per_step"] == n_layers
    assert att["computing softmax"]["matmul_ms_per_step"] == 0
    assert att["computing attention scores"]["matmul_ms_per_step"] > 0 and att["final matmul"]["matmul_ms_per_step"] > 0
    assert fwd["range_ms_mean"] >= fwd["gpu_span_ms_mean"] > 0


def test_classifier_on_real_kernel_names():
    rows = [
        line.rstrip("\n").split("\t", 1)
        for line in (FIXTURES / "kernel_classes_h200.tsv").open()
        if line.strip() and not line.startswith("#")
    ]
    assert len(rows) > 100
    wrong = [(expected, name[:120], kn.classify(name)) for expected, name in rows if kn.classify(name) != expected]
    assert not wrong
    assert {expected for expected, _ in rows} >= {
        "matmul",
        "elementwise",
        "reduction",
        "softmax",
        "memory",
        "optimizer",
    }


@pytest.mark.parametrize(
    "name, label",
    [
        (
            "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)",
            "Kernel2[cutlass_80_simt_sgemm_256x128_8x4_nn_align1]",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<(int)4, at::native::exp_kernel_cuda(at::TensorIteratorBase &)::"
            "[lambda() (instance 2)]::operator ()() const::[lambda() (instance 2)]::operator ()() const::[lambda(float) "
            "(instance 1)], std::array<char *, (unsigned long)2>>(int, T2, T3)",
            "vectorized_elementwise_kernel[exp]",
        ),
        (
            "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
            "at::native::MaxNanFunctor<float>>, unsigned int, float, (int)4, (int)4>>(T3)",
            "reduce_kernel[MaxNanFunctor]",
        ),
        ("nvjet_sm90_tst_64x64_64x13_4x2_h_bz_TNT", "nvjet_sm90_tst_64x64_64x13_4x2_h_bz_TNT"),
        ("aten::mm", "aten::mm"),
    ],
)
def test_labels(name, label):
    assert kn.label(name) == label


def test_cpu_operator_names_classify():
    assert [
        kn.classify(n)
        for n in (
            "aten::mm",
            "aten::bmm",
            "aten::addmm",
            "aten::exp",
            "aten::amax",
            "aten::_softmax",
            "aten::copy_",
            "aten::_foreach_mul_",
        )
    ] == ["matmul", "matmul", "matmul", "elementwise", "reduction", "softmax", "memory", "optimizer"]


def _write_db(path: Path, script: str) -> Path:
    con = sqlite3.connect(path)
    con.executescript(script)
    con.commit()
    con.close()
    return path


def test_reader_variants(tmp_path):
    # NVTX text through StringIds, no runtime table: launch falls back to the GPU start, flagged.
    db = _write_db(
        tmp_path / "a.sqlite",
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        INSERT INTO StringIds VALUES (1, 'void k<float>(float*)'), (2, 'k'), (3, 'forward');
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, "end" INT, correlationId INT, demangledName INT, shortName INT);
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (10, 20, 5, 1, 2);
        CREATE TABLE NVTX_EVENTS (start INT, "end" INT, eventType INT, text TEXT, textId INT, globalTid INT);
        INSERT INTO NVTX_EVENTS VALUES (0, 100, 59, NULL, 3, 7), (50, NULL, 34, 'a mark', NULL, 7);
    """,
    )
    t = nsys_tool.read_sqlite(db)
    assert [(k.name, k.short_name, k.launch_ns, k.launch_known) for k in t.kernels] == [
        ("void k<float>(float*)", "k", 10, False)
    ]
    assert [(r.name, r.start_ns, r.end_ns, r.thread) for r in t.ranges] == [("forward", 0, 100, 7)]
    assert t.notes["kernels_without_runtime_launch"] == 1


def test_reader_refuses_a_report_without_kernels(tmp_path):
    db = _write_db(tmp_path / "b.sqlite", "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);")
    with pytest.raises(nsys_tool.NsysError, match="no CUPTI_ACTIVITY_KIND_KERNEL"):
        nsys_tool.read_sqlite(db)
