"""Precision probes against independent references (IEEE rounding via struct, float64), the
precision cell CLI end to end, its unsupported-per-entry path, and the report on its records."""

from __future__ import annotations

import json
import math
import random
import struct

import pytest
import torch

from lmperf.core.record import load_record
from lmperf.kinds.precision import cell as precision_cell
from lmperf.kinds.precision import probes as precision
from lmperf.kinds.precision import report as precision_report


def round_to(x: float, dtype: str) -> float:
    """Round a float64 to fp16 / fp32 (round to nearest even) with the struct module."""
    fmt = {"fp16": "e", "fp32": "f"}[dtype]
    return struct.unpack(fmt, struct.pack(fmt, x))[0]


def reference_loop(acc_dtype: str, inc_dtype: str, steps: int, increment: float) -> float:
    """The same loop in exact float64 arithmetic, rounding each sum to the accumulator's type: an
    IEEE addition of two representable numbers is the exact sum, correctly rounded."""
    inc = round_to(increment, inc_dtype)
    s = 0.0
    for _ in range(steps):
        s = round_to(s + inc, acc_dtype)
    return s


@pytest.mark.parametrize("variant", list(precision.ACCUMULATION_VARIANTS))
def test_accumulation_loops_match_ieee_rounding(variant, fresh_seed):
    rng = random.Random(fresh_seed)
    steps, increment = rng.choice([1000, 700]), rng.choice([0.01, 0.003, 0.1])
    acc, inc, _ = precision.ACCUMULATION_VARIANTS[variant]
    r = precision.accumulate(variant, steps, increment)
    assert r["result"] == reference_loop(acc, inc, steps, increment)
    assert r["stored_increment"] == round_to(increment, inc)


def test_course_accumulation_numbers():
    res = {v: precision.accumulate(v)["result"] for v in precision.ACCUMULATION_VARIANTS}
    # fp16's spacing at 8..16 is 2^-7: the fp16 sum ends far from 10, the fp32 sums close to it
    assert abs(res["fp16 += fp16"] - 10) > 0.01
    assert abs(res["fp32 += fp32"] - 10) < 1e-3
    assert (
        res["fp32 += fp16"]
        == res["fp32 += fp16 cast to fp32"]
        == pytest.approx(1000 * round_to(0.01, "fp16"), abs=1e-4)
    )
    assert precision.spacing(10.0, "fp16") == 2**-7 and precision.spacing(10.0, "fp32") == 2**-20


def test_toy_model_dtypes_under_cpu_bf16_autocast():
    r = precision.toy_model_dtypes("bf16", torch.device("cpu"))
    assert set(r["parameters"].values()) == {"fp32"}  # autocast never converts parameters
    assert r["fc1_output"] == "bf16" and r["logits"] == "bf16"  # matmuls run in bf16
    assert r["loss"] == "fp32"  # cross-entropy is on CPU autocast's fp32 list
    assert set(r["gradients"].values()) == {"fp32"}
    # the hook saw what the module returns: recompute the layer norm's dtype directly
    model = precision.ToyModel(16, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ln_out = model.ln(model.relu(model.fc1(torch.randn(2, 16))))
    assert r["ln_output"] == precision.dtype_name(ln_out.dtype)


def test_sequential_sum_rounds_every_partial_sum():
    rng = random.Random(0)
    values = [rng.uniform(50, 150) for _ in range(300)]
    x = torch.tensor([values], dtype=torch.float16)
    s = 0.0
    for v in x[0].tolist():
        s = round_to(s + v, "fp16")
    assert precision._sequential_sum(x).item() == s
    # and that is far from the float64 sum once the partial sums grow
    assert abs(s - sum(x[0].tolist())) > 10


def test_layer_norm_probe_shows_overflow_and_cancellation(fresh_seed):
    kwargs = dict(std=1.0, width=1024, rows=4, device="cpu", seed=fresh_seed)
    fp16 = precision.layer_norm_errors("fp16", 10.0, **kwargs)
    bf16 = precision.layer_norm_errors("bf16", 10.0, **kwargs)
    fp32 = precision.layer_norm_errors("fp32", 10.0, **kwargs)
    # Σx² ≈ 1024 · 101 > 65504: fp16 overflows even with fp32 accumulation, bf16 does not
    assert fp16["sum_of_squares_exact_max"] > 65504
    assert fp16["sum_of_squares_fp32_accumulation_overflow"] and not bf16["sum_of_squares_fp32_accumulation_overflow"]
    # low-precision accumulation of the mean is far worse than fp32 accumulation
    for r in (fp16, bf16):
        assert r["mean_lowp_accumulation_err_std"] > 10 * r["mean_fp32_accumulation_err_std"]
        assert r["var_one_pass_rel_err"] > r["var_two_pass_rel_err"]
    # fp32 inputs: every part within float32 rounding of the float64 reference
    assert fp32["output_kernel_err"] < 1e-4 and fp32["input_rounding_err_std"] < 1e-5
    # the fused kernel's output error is that of fp32 computation from the same rounded inputs (within 2×)
    assert bf16["output_kernel_err"] <= 2 * bf16["output_fp32_from_rounded_input_err"] + 1e-3
    # bf16's inputs are rounded more coarsely than fp16's (8 against 11 significant bits)
    assert bf16["input_rounding_err_std"] > fp16["input_rounding_err_std"]
    zero = precision.layer_norm_errors("fp16", 0.0, **kwargs)
    assert not zero["sum_of_squares_fp32_accumulation_overflow"]


def run_cell(tmp_path, probes=precision_cell.PROBES) -> list[dict]:
    out = str(tmp_path / "{probe}.json")
    assert (
        precision_cell.main(
            ["--output", out, "--device", "cpu", "--ln-width", "256", "--ln-rows", "4", "--probes", *probes]
        )
        == 0
    )
    return [load_record(out.format(probe=p)) for p in probes]


def test_cell_cli_and_report(tmp_path):
    records = run_cell(tmp_path)
    assert all(r["status"] == "ok" for r in records)
    acc, toy, ln = records
    assert len(acc["metrics"]["results"]) == 4 and toy["metrics"]["autocast"]["bf16"]["status"] == "ok"
    assert {r["dtype"] for r in ln["metrics"]["results"]} == {"fp16", "bf16", "fp32"}
    json.dumps(ln)
    out = tmp_path / "report"
    assert (
        precision_report.main(
            [
                "--device",
                "cpu",
                "--tables-dir",
                str(out),
                "--sections-dir",
                str(out),
                "--figures-dir",
                str(out),
                "--records",
                *(str(tmp_path / f"{p}.json") for p in precision_cell.PROBES),
            ]
        )
        == 0
    )
    accumulation = (out / "mixed_precision_accumulation.md").read_text()
    fp16_result = next(r for r in acc["metrics"]["results"] if r["variant"] == "fp16 += fp16")["result"]
    assert f"{fp16_result:.10g}" in accumulation
    ab = (out / "benchmarking_mixed_precision_ab.md").read_text()
    assert "### (a)" in ab and "### (b)" in ab and "Range (fp16)" in ab
    assert (out / "precision_layer_norm.png").stat().st_size > 1000
    assert (out / "precision_accumulation.csv").read_text().count("\n") == 5


def test_unsupported_autocast_dtype_is_recorded_per_entry(tmp_path, monkeypatch):
    real = precision.toy_model_dtypes

    def no_fp16(dtype, *args, **kwargs):
        if dtype == "fp16":
            raise NotImplementedError("cpu autocast does not support fp16: test")
        return real(dtype, *args, **kwargs)

    monkeypatch.setattr(precision, "toy_model_dtypes", no_fp16)
    (toy,) = run_cell(tmp_path, ["toy_model"])
    entries = toy["metrics"]["autocast"]
    assert toy["status"] == "ok"
    assert entries["fp16"] == {"status": "unsupported", "reason": "cpu autocast does not support fp16: test"}
    assert entries["bf16"]["status"] == "ok"
    table = precision_report.toy_table(toy)
    assert set(table["fp16 autocast"]) == {"unsupported"}


def test_autocast_without_support_raises_not_implemented(monkeypatch):
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)
    with pytest.raises(NotImplementedError, match="no autocast"):
        precision.toy_model_dtypes("bf16", torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA autocast dtypes need a GPU")
def test_cuda_autocast_runs_layer_norm_in_fp32():
    for dtype in ("fp16", "bf16"):
        r = precision.toy_model_dtypes(dtype, torch.device("cuda"))
        assert r["fc1_output"] == dtype and r["ln_output"] == "fp32" and r["loss"] == "fp32"
        assert math.isfinite(precision.accumulate("fp16 += fp16", device="cuda")["result"])


def _ln_record(rows: list[dict]) -> dict:
    """A layer-norm record holding ``rows`` (the probe's result dicts)."""
    return {"status": "ok", "metrics": {"results": rows, "device_type": "cuda"}}


def _ln_row(dtype: str, mean: float, **errors) -> dict:
    """One probe result: finite errors unless ``errors`` overrides them (None: overflowed)."""
    over = dtype == "fp16" and mean >= 10
    row = {
        "dtype": dtype,
        "mean": mean,
        "std": 1.0,
        "width": 2560,
        "rows": 16,
        "dtype_max": {"fp16": 65504.0, "bf16": 3.39e38, "fp32": 3.4e38}[dtype],
        "sum_of_squares_exact_max": 2560 * (mean * mean + 1),
        "sum_of_squares_lowp_accumulation_overflow": over,
        "sum_of_squares_fp32_accumulation_overflow": over,
        **{key: 0.01 for key, _ in precision_report.LN_COLUMNS if not key.endswith("overflow")},
    }
    row.update(errors)
    return row


def _range_paragraph(rows: list[dict]) -> str:
    text = precision_report.section_layer_norm(_ln_record(rows), None)
    return next(p for p in text.split("\n\n") if p.startswith("**Range (fp16).**"))


def test_layer_norm_claims_inf_nan_only_where_a_row_shows_it():
    means = (0.0, 10.0, 100.0)
    finite = [_ln_row(d, m) for d in ("fp16", "bf16", "fp32") for m in means]
    finite[2]["mean_lowp_accumulation_err_std"] = None  # the fp16 running sum overflows at mean 100
    text = _range_paragraph(finite)
    assert "inf/NaN" in text and "No variance or output in these rows is inf/NaN" in text
    assert "at most 1e+04 here" in text  # Σx²/width at mean 100, from the row
    assert "Where the table shows inf (overflow): “mean, low-prec. accumulation” at fp16, mean 100." in text
    assert "become inf/NaN" not in text
    # a row whose variance and low-precision output overflowed: the sentence says so, naming them
    broken = [dict(r) for r in finite]
    broken[2].update(var_one_pass_rel_err=None, output_lowp_err=float("inf"))
    text = _range_paragraph(broken)
    assert "There the variance or output becomes inf/NaN: “var E[x²]−E[x]² (rel.)” at mean 100; " in text
    assert "“output in low prec. (fp32-acc. mean)” at mean 100." in text
    assert "No variance or output" not in text


def test_layer_norm_text_says_how_the_low_precision_output_is_computed():
    rows = [_ln_row(d, m) for d in ("fp16", "bf16", "fp32") for m in (0.0, 10.0)]
    text = precision_report.section_layer_norm(_ln_record(rows), None)
    assert "every intermediate" not in text and "all in low prec." not in text
    assert "in that type from the fp32-accumulated mean stored in that type" in text
    assert "Computed in fp16 from the fp32-accumulated mean (two-pass variance), the output errs by" in text


def test_layer_norm_close_to_fp32_flips_at_close_error_factor():
    factor = precision_report.CLOSE_ERROR_FACTOR

    def text(ratio):
        rows = [_ln_row(d, m) for d in ("fp16", "bf16", "fp32") for m in (0.0, 10.0)]
        for row in rows:
            row["output_fp32_from_rounded_input_err"] = 0.01
            row["output_kernel_err"] = 0.01 * ratio
        return precision_report.section_layer_norm(_ln_record(rows), None)

    close = text(factor * 0.9)
    far = text(factor * 1.1)
    assert f"(within {factor:g}×, `CLOSE_ERROR_FACTOR`)" in close and "close to the" in close
    assert "close to the" not in far and f"(more than {factor:g}× it, `CLOSE_ERROR_FACTOR`)" in far
