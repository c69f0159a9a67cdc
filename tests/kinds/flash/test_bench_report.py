"""flash_benchmarking: speed-ups over plain and SDPA with their verdicts (beyond the noise or not), the
geometric mean over a length band, out of memory, what float32 rows multiplied in, the answer's wording."""

from __future__ import annotations

import math

import pytest

from lmperf.core import stats
from lmperf.kinds.flash import bench_report, report
from lmperf.kinds.flash.bench_report import BenchFacts, band_labels

from .builders import bench


def _pair(speedup, spread=None, n=1024, d=64, precision="bf16"):
    """plain at 1 ms and ours ``speedup`` times faster, at one shape."""
    return [
        bench("plain", d, n, 1.0, precision=precision, spread=spread),
        bench("flash", d, n, 1.0 / speedup, precision=precision, spread=spread),
    ]


@pytest.mark.parametrize(
    ("speedup", "spread", "verdict"),
    [
        (1.3, 0.01, "faster"),  # tight intervals, far apart
        (1.3, 0.2, "within noise"),  # intervals overlap
        (1.3, None, "faster"),  # one trial, beyond twice the margin
        (1.04, None, "within noise"),  # one trial, inside twice the margin
        (1.0 / 1.3, 0.01, "slower"),
    ],
)
def test_the_verdict_comes_from_the_intervals(speedup, spread, verdict):
    facts = BenchFacts(_pair(speedup, spread))
    s = facts.speedup("bf16", "plain")
    assert s.value.median == pytest.approx(speedup) and s.verdict == verdict
    assert dict(facts.verdicts["plain"]) == {verdict: 1}
    assert (s.value.low is None) == (spread is None)  # an interval only where the records have one
    assert ("(within noise)" in bench_report.cell(s)) == (verdict == "within noise")


def test_a_band_speedup_is_the_geometric_mean_of_its_shapes():
    records = [*_pair(2.0, 0.02, n=128), *_pair(8.0, 0.02, n=1024)]
    s = BenchFacts(records).speedup("bf16", "plain", head_dim=64, band="N 128–1024")
    assert s.value.median == pytest.approx(4.0) and s.shapes == 2
    # conservative ends: plain's low over ours' high, plain's high over ours' low, per shape
    assert s.value.low == pytest.approx(4.0 * 0.98 / 1.02) and s.value.high == pytest.approx(4.0 * 1.02 / 0.98)


def test_bands_split_at_1024_and_8192():
    labels = band_labels([2**k for k in range(7, 17)])
    assert sorted(set(labels.values())) == ["N 128–1024", "N 16384–65536", "N 2048–8192"]
    assert labels[1024] == "N 128–1024" and labels[2048] == "N 2048–8192"
    assert band_labels([4096]) == {4096: "N 4096"}
    assert math.inf in bench_report.BAND_ENDS


def test_a_wide_interval_marks_the_speedup_unstable():
    wide = BenchFacts(_pair(2.0, spread=2 * stats.UNSTABLE_WIDTH))
    tight = BenchFacts(_pair(2.0, spread=0.01))
    assert wide.speedup("bf16", "plain").unstable and not tight.speedup("bf16", "plain").unstable
    assert bench_report.UNSTABLE_MARK in bench_report.cell(wide.speedup("bf16", "plain"))
    assert bench_report.UNSTABLE_MARK not in bench_report.cell(tight.speedup("bf16", "plain"))


def test_out_of_memory_is_a_status_and_said_per_precision():
    records = [
        *(bench("plain", d, 1024, precision=p) for p in ("fp32", "bf16") for d in (16, 128)),
        *(bench("plain", d, 2048, precision="fp32", status="oom") for d in (16, 128)),
        bench("plain", 16, 2048, precision="bf16", status="oom"),
        *(bench("flash", d, n, 0.5, precision=p) for p in ("fp32", "bf16") for d in (16, 128) for n in (1024, 2048)),
    ]
    facts = BenchFacts(records)
    assert facts.oom_from == {("fp32", "plain", 16): 2048, ("fp32", "plain", 128): 2048, ("bf16", "plain", 16): 2048}
    assert bench_report.oom_text(facts, "plain") == "N = 2048 (fp32 at every head dim; bf16 d = 16)"
    assert "ours ran every length up to N = 2048." in bench_report.answer(facts)
    table = bench_report.band_table(facts, "plain")
    assert [row["plain out of memory from N"] for row in table] == ["2048", "2048", "2048", "—"]


def _products(records, precision):
    return next(x for x in BenchFacts(records).products if x[0] == precision)


def test_fp32_products_follow_the_records():
    split = bench("flash", 16, 1024, precision="fp32", dot_precision="tf32x3")
    assert _products([split], "fp32")[1:3] == (("3xTF32",), "IEEE")
    assert 'input_precision="tf32x3"' in bench_report.notes(BenchFacts([split]))
    ieee = bench("flash", 16, 1024, precision="fp32")  # no label: the kernels followed allow_tf32 (off)
    assert _products([ieee], "fp32")[1] == ("IEEE",)
    assert _products([bench("plain", 16, 1024, precision="tf32")], "tf32")[1:3] == (("TF32",), "TF32")
    assert not BenchFacts([bench("plain", 16, 1024)]).products  # bf16: no question


def test_sdpa_float32_rows_ran_3xtf32_only_where_backend_and_device_say_so():
    assert _products([bench("sdpa", 16, 1024, precision="fp32")], "fp32")[3] == "3xTF32"
    assert "OpMultiplyAddFastF32" in bench_report.notes(BenchFacts([bench("sdpa", 16, 1024, precision="fp32")]))
    assert _products([bench("sdpa", 16, 1024, precision="fp32", device="cpu")], "fp32")[3] is None


def test_no_timings_says_why_once():
    records = [bench(i, 16, n, status="unsupported", device="cpu") for i in ("plain", "flash") for n in (128, 256)]
    text = bench_report.section(records, "cpu")
    assert text.startswith("The FlashAttention-2 benchmark has no timings on `cpu`: flash and plain (no CUDA device).")
    assert text.count("no CUDA device") == 1 and "![" not in text  # no figure shown that has nothing to show
    assert bench_report.section([], "cpu") == "FlashAttention-2 was not measured on `cpu`.\n"


def test_answer_golden():
    records = [*_pair(1.5, 0.01, n=512), *_pair(20.0, 0.01, n=16384), bench("plain", 64, 65536, status="oom")]
    records.append(bench("flash", 64, 65536, 30.0, spread=0.01))
    assert bench_report.answer(BenchFacts(records)) == (
        "Our Triton FlashAttention-2 (`flash`) runs forward+backward faster than PyTorch's unfused attention "
        "(`plain`) in 2 of the 2 shapes where both ran (0 within the noise, 0 slower). From N 512 to "
        "N 16384–65536 its speed-up goes from 1.50× [1.47, 1.53] to 20.00× [19.60, 20.40] in bf16 (geometric "
        "means over head dims). Plain attention runs out of memory from N = 65536 at every precision and head "
        "dim; ours ran every length up to N = 65536."
    )


def test_the_speedup_figure_says_which_pass_of_plain_ran_out_of_memory(tmp_path):
    records = _pair(2.0, n=1024) + [bench("flash", 64, 65536, 10.0), bench("plain", 64, 65536, status="oom")]
    assert "plain out of memory" in report.speedup_figure(report.bench_frame(records), tmp_path / "s.png")
    forward_ran = bench("plain", 64, 65536, status="oom", forward_ms_median=70.0)
    records = _pair(2.0, n=1024) + [bench("flash", 64, 65536, 10.0), forward_ran]
    labels = report.speedup_figure(report.bench_frame(records), tmp_path / "s.png")
    assert "plain's backward out of memory" in labels and "flash fwd" in labels
