"""The precision probes against independent references (IEEE rounding through struct, float64, autocast's
dtypes read back directly) and the CPU grid's job through the runner."""

from __future__ import annotations

import random
import struct

import pytest
import torch
from conftest import cpu_jobs, run_job

from lmperf.core.record import load_record
from lmperf.kinds.precision import probes


def round_to(x: float, dtype: str) -> float:
    """A float64 rounded to fp16 / fp32 (to nearest even) by the struct module."""
    return struct.unpack({"fp16": "e", "fp32": "f"}[dtype], struct.pack({"fp16": "e", "fp32": "f"}[dtype], x))[0]


@pytest.mark.parametrize("variant", list(probes.ACCUMULATION_VARIANTS))
def test_accumulation_loops_match_ieee_rounding(variant, fresh_seed):
    """An IEEE addition of two representable numbers is their exact sum, correctly rounded."""
    rng = random.Random(fresh_seed)
    steps, increment = rng.choice([1000, 700]), rng.choice([0.01, 0.003, 0.1])
    acc, inc, _ = probes.ACCUMULATION_VARIANTS[variant]
    s = 0.0
    for _ in range(steps):
        s = round_to(s + round_to(increment, inc), acc)
    r = probes.accumulate(variant, steps, increment, "cpu")
    assert r["result"] == s and r["stored_increment"] == round_to(increment, inc)
    assert r["accumulator_spacing_at_result"] == 2.0 ** ((int(s).bit_length() - 1) - {"fp16": 10, "fp32": 23}[acc])


def test_toy_model_dtypes_are_what_the_modules_return_under_cpu_bf16_autocast():
    r = probes.toy_model_dtypes("bf16", "cpu", 16, 4, 8, 0)
    assert set(r["parameters"].values()) == set(r["gradients"].values()) == {"fp32"}  # never converted
    assert (r["fc1_output"], r["logits"], r["loss"]) == ("bf16", "bf16", "fp32")  # cross-entropy: autocast's fp32 list
    model = probes.toy_model(16, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ln_out = model.ln(model.relu(model.fc1(torch.randn(2, 16))))
    assert r["ln_output"] == probes.dtype_name(ln_out.dtype)


def test_sequential_sum_rounds_every_partial_sum():
    x = torch.tensor([[random.choice([100.25, 60.75]) for _ in range(300)]], dtype=torch.float16)
    s = 0.0
    for v in x[0].tolist():
        s = round_to(s + v, "fp16")
    assert probes._sequential_sum(x).item() == s and abs(s - sum(x[0].tolist())) > 10  # far from the exact sum


def test_layer_norm_probe_shows_overflow_cancellation_and_fp32_accuracy(fresh_seed):
    fp16, bf16, fp32 = (
        probes.layer_norm_errors(d, 10.0, 1.0, 1024, 4, "cpu", fresh_seed) for d in ("fp16", "bf16", "fp32")
    )
    # Σx² ≈ 1024 · 101 > 65504: fp16 overflows even with fp32 accumulation, bf16 does not
    assert fp16["sum_of_squares_exact_max"] > 65504 and fp16["sum_of_squares_fp32_accumulation_overflow"]
    assert not bf16["sum_of_squares_fp32_accumulation_overflow"]
    assert not probes.layer_norm_errors("fp16", 0.0, 1.0, 1024, 4, "cpu", fresh_seed)[
        "sum_of_squares_fp32_accumulation_overflow"
    ]
    for r in (fp16, bf16):  # low-precision accumulation and the one-pass variance are the fragile parts
        assert r["mean_lowp_accumulation_err_std"] > 10 * r["mean_fp32_accumulation_err_std"]
        assert r["var_one_pass_rel_err"] > r["var_two_pass_rel_err"]
    assert fp32["output_kernel_err"] < 1e-4 and fp32["input_rounding_err_std"] < 1e-5
    assert bf16["input_rounding_err_std"] > fp16["input_rounding_err_std"]  # 8 significant bits against 11


def test_cpu_job_through_the_runner(tmp_path):
    (job,) = cpu_jobs(
        "precision",
        tmp_path,
        layer_norm={"width": 64, "rows": 2, "means": [0, 100], "std": 1.0, "dtypes": ["fp16", "fp32"]},
    )
    run_job(job)
    records = {c["probe"]: load_record(p) for p, c in job.records.items()}
    assert all(r["status"] == "ok" and r["provenance"]["settings"] == job.settings for r in records.values())
    assert [x["variant"] for x in records["accumulation"]["metrics"]["results"]] == list(probes.ACCUMULATION_VARIANTS)
    assert set(records["toy_model"]["metrics"]["autocast"]) == {"fp16", "bf16"}
    assert [(r["dtype"], r["mean"]) for r in records["layer_norm"]["metrics"]["results"]] == [
        ("fp16", 0),
        ("fp16", 100),
        ("fp32", 0),
        ("fp32", 100),
    ]
