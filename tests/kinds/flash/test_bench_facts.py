"""flash_benchmarking facts: speed-ups over plain and SDPA with their verdicts (beyond the noise or
not), the geometric mean over a length band, out of memory against not measured, what float32 rows
multiplied in."""

from __future__ import annotations

import math

import pytest

from lmperf.core import stats
from lmperf.kinds.flash import bench_report
from lmperf.kinds.flash.bench_facts import band_label, bench_facts

from .builders import bench


def _pair(speedup, spread=None, n=1024, d=64, precision="bf16"):
    """plain at 1 ms and ours ``speedup`` times faster, at one shape."""
    return [
        bench("plain", d, n, 1.0, precision=precision, spread=spread),
        bench("flash_triton", d, n, 1.0 / speedup, precision=precision, spread=spread),
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
    facts = bench_facts(_pair(speedup, spread))
    s = facts.speedup("bf16", "plain")
    assert s.value.median == pytest.approx(speedup)
    assert s.verdict == verdict
    faster, slower, within = (facts.shape_verdicts[0][k] for k in (2, 3, 4))
    assert (faster, slower, within) == (verdict == "faster", verdict == "slower", verdict == "within noise")
    assert (s.value.low is None) == (spread is None)  # an interval only where the records have one


def test_a_band_speedup_is_the_geometric_mean_of_its_shapes():
    records = [*_pair(2.0, 0.02, n=128), *_pair(8.0, 0.02, n=1024)]
    s = bench_facts(records).speedup("bf16", "plain", head_dim=64, band="N 128–1024")
    assert s.value.median == pytest.approx(4.0)
    assert s.shapes == 2
    # conservative ends: plain's low over ours' high, plain's high over ours' low, per shape
    assert s.value.low == pytest.approx(4.0 * 0.98 / 1.02)
    assert s.value.high == pytest.approx(4.0 * 1.02 / 0.98)


def test_bands_split_at_1024_and_8192():
    lengths = [2**k for k in range(7, 17)]
    assert [band_label(lengths, end) for end in (1024, 8192, math.inf)] == [
        "N 128–1024",
        "N 2048–8192",
        "N 16384–65536",
    ]
    assert band_label([4096], 8192) == "N 4096" and band_label([128], 8192) is None


def test_a_wide_interval_marks_the_speedup_unstable():
    wide = bench_facts(_pair(2.0, spread=0.2 * stats.UNSTABLE_WIDTH / 0.1))
    tight = bench_facts(_pair(2.0, spread=0.01))
    assert wide.speedup("bf16", "plain").unstable and not tight.speedup("bf16", "plain").unstable
    assert bench_report.UNSTABLE_MARK in bench_report.cell(wide.speedup("bf16", "plain"))
    assert bench_report.UNSTABLE_MARK not in bench_report.cell(tight.speedup("bf16", "plain"))


def _grid():
    """plain runs out of memory at N = 2048; ours at d = 128, N = 2048 has no record."""
    return [
        bench("plain", 16, 1024, precision="fp32"),
        bench("plain", 16, 2048, precision="fp32", status="oom"),
        bench("plain", 128, 1024, precision="fp32"),
        bench("plain", 128, 2048, precision="fp32", status="oom"),
        bench("flash_triton", 16, 1024, 0.5, precision="fp32"),
        bench("flash_triton", 16, 2048, 0.5, precision="fp32"),
        bench("flash_triton", 128, 1024, 0.5, precision="fp32"),
    ]


def test_a_missing_record_is_not_measured_not_out_of_memory():
    facts = bench_facts(_grid())
    assert facts.oom_from == (("fp32", "plain", 16, 2048), ("fp32", "plain", 128, 2048))
    assert facts.missing == (("fp32", "flash_triton", 128, (2048,)),)
    text = bench_report.section(facts, "h100", "")
    assert "No record (not measured, so not out of memory): flash_triton fp32 d = 128 at N = 2048." in text
    assert "ours from" not in text  # no record of ours has status oom
    # a record with status oom is what out of memory means
    oom = bench_facts([*_grid(), bench("flash_triton", 128, 2048, precision="fp32", status="oom")])
    assert ("fp32", "flash_triton", 128, 2048) in oom.oom_from and not oom.missing
    assert "ours from N = 2048 (fp32 d = 128)" in bench_report.answer(oom)


def test_cells_the_grid_asks_for_and_nobody_ran_are_missing():
    records = _pair(2.0)
    assert bench_facts(records).missing == ()
    grid = {"precisions": ["bf16"], "implementations": ["plain", "flash_triton"], "head_dims": [64]}
    facts = bench_facts(records, {**grid, "sequence_lengths": [1024, 4096]})
    assert facts.missing == (("bf16", "flash_triton", 64, (4096,)), ("bf16", "plain", 64, (4096,)))


def _products(records, precision):
    return next(x for x in bench_facts(records).products if x.precision == precision)


def test_fp32_products_follow_the_records():
    ieee = bench("flash_triton", 16, 1024, precision="fp32")
    assert _products([ieee], "fp32").ours == ("IEEE",)  # code version, allow_tf32 off: IEEE
    split = bench("flash_triton", 16, 1024, precision="fp32", dot_precision="tf32x3")
    assert _products([split], "fp32").ours == ("3xTF32",)
    assert 'input_precision="tf32x3"' in bench_report.products_note(bench_facts([split]))
    old = bench("flash_triton", 16, 1024, precision="fp32")
    del old["provenance"]["code_version"]
    assert _products([old], "fp32").ours == ("TF32",)  # kernels before code versions: Triton's default
    # plain: IEEE in fp32, TF32 in tf32 (the cell allows TF32 matmuls there whatever the process default)
    assert _products([bench("plain", 16, 1024, precision="fp32")], "fp32").plain == "IEEE"
    assert _products([bench("plain", 16, 1024, precision="tf32")], "tf32").plain == "TF32"
    assert not [x for x in bench_facts([bench("plain", 16, 1024)]).products]  # bf16: no question


def _sdpa(precision="fp32", device="h100", backend="EFFICIENT_ATTENTION"):
    return bench("sdpa", 16, 1024, precision=precision, device=device, sdpa_backend=backend)


def test_sdpa_float32_rows_ran_3xtf32_only_where_backend_and_device_say_so():
    assert _products([_sdpa()], "fp32").sdpa == "3xTF32"
    assert _products([_sdpa("tf32")], "tf32").sdpa == "3xTF32"
    assert "OpMultiplyAddFastF32" in bench_report.products_note(bench_facts([_sdpa()]))
    for other in (_sdpa(device="cpu"), _sdpa(backend="FLASH_ATTENTION"), _sdpa(device="unknown-gpu")):
        assert _products([other], "fp32").sdpa is None


def test_unsupported_cells_are_said_once_per_reason():
    records = [bench(i, 16, n, status="unsupported", device="cpu") for i in ("plain", "flash_triton") for n in (1, 2)]
    facts = bench_facts(records)
    assert facts.unsupported == (("no CUDA device", ("plain", "flash_triton")),)
    text = bench_report.section(facts, "cpu", "")
    assert text.count("no CUDA device") == 1 and "![" in text


def test_answer_golden():
    records = [*_pair(1.5, 0.01, n=512), *_pair(20.0, 0.01, n=16384), bench("plain", 64, 65536, status="oom")]
    records.append(bench("flash_triton", 64, 65536, 30.0, spread=0.01))
    assert bench_report.answer(bench_facts(records)) == (
        "Our Triton FlashAttention-2 (`flash_triton`) runs forward+backward faster than PyTorch's unfused "
        "attention (`plain`) in 2 of the 2 shapes where both ran (0 within the noise, 0 slower). From N 512 to "
        "N 16384–65536 its speed-up goes from 1.50× [1.47, 1.53] to 20.00× [19.60, 20.40] in bf16 (geometric "
        "means over head dims). Plain attention runs out of memory from N = 65536 at every precision and head "
        "dim; ours ran every length up to N = 65536."
    )
