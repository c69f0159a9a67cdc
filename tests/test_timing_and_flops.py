"""Timing statistics and the FLOP formulas against independent hand computations."""

from __future__ import annotations

import time

import pytest
import torch

from lmperf.core import flops
from lmperf.core.timing import PhaseTimer, flatten_summary, summarize
from lmperf.model import config_from_name


def test_summarize_against_hand_computation():
    s = summarize([1.0, 2.0, 4.0, 5.0])
    assert s["mean"] == 3.0
    assert s["median"] == 3.0
    assert s["min"] == 1.0 and s["max"] == 5.0 and s["n"] == 4
    # sample std: sqrt(((2^2 + 1 + 1 + 2^2)) / 3) = sqrt(10/3)
    assert s["std"] == pytest.approx((10 / 3) ** 0.5)
    assert s["samples"] == [1.0, 2.0, 4.0, 5.0]


def test_summarize_single_sample_and_empty():
    assert summarize([7.0])["std"] == 0.0
    with pytest.raises(ValueError):
        summarize([])


def test_flatten_summary_puts_units_in_names():
    flat = flatten_summary("forward", summarize([1.0, 3.0]))
    assert flat["forward_ms_mean"] == 2.0 and flat["forward_n"] == 2 and "forward_ms_samples" in flat


def test_phase_timer_measures_wall_time_and_skips_unrecorded_steps():
    timer = PhaseTimer(torch.device("cpu"))
    timer.record = False
    with timer.phase("forward"):
        time.sleep(0.01)
    timer.record = True
    for _ in range(2):
        with timer.phase("forward"):
            time.sleep(0.02)
    samples = timer.samples_ms["forward"]
    assert len(samples) == 2
    assert all(19.0 <= s < 200.0 for s in samples)
    assert timer.event_samples_ms() == {}  # no CUDA events on the CPU


def test_attention_flops():
    # 4·B·H·N²·d, halved when causal, backward 2.5×
    assert flops.attention_forward_flops(2, 3, 8, 8, 16) == 4 * 2 * 3 * 64 * 16
    assert flops.attention_forward_flops(1, 1, 8, 8, 16, causal=True) == 2 * 64 * 16
    assert flops.attention_backward_flops(1, 1, 8, 8, 16) == 2.5 * 4 * 64 * 16


def test_lm_forward_flops_is_about_two_flops_per_parameter_per_token():
    # Kaplan et al.: forward ≈ 2·N_nonembedding·tokens + attention; check against a direct sum.
    c = config_from_name("small")
    b, t = 4, 128
    tokens = b * t
    d, f, L, V = c.d_model, c.d_ff, c.num_layers, c.vocab_size
    matmul_params = L * (4 * d * d + 3 * d * f) + d * V
    attention = L * 2 * (2 * b * t * t * d)
    assert flops.lm_forward_flops(c, b, t) == 2 * matmul_params * tokens + attention
    assert flops.lm_training_step_flops(c, b, t) == 3 * flops.lm_forward_flops(c, b, t)


def test_tflops_per_s_against_a_hand_count():
    # 2e12 FLOPs in 500 ms is 4 TFLOP/s
    assert flops.tflops_per_s(2e12, 500.0) == pytest.approx(4.0)


def test_capture_oom_keeps_out_of_memory_and_lets_other_errors_through():
    from lmperf.core.oom import capture_oom

    assert capture_oom(lambda: None) is None

    def too_big():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    oom = capture_oom(too_big)
    assert oom.first_line == "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert oom.reason == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert oom.allocated_when_caught_bytes is None  # no CUDA device given

    def broken():
        raise ValueError("a bug, not an answer")

    with pytest.raises(ValueError, match="a bug"):
        capture_oom(broken)


def test_dtypes_and_units_agree():
    from lmperf.core.dtypes import DTYPES, autocast, dtype_name, torch_dtype
    from lmperf.core.units import BYTES_PER_ELEMENT

    assert set(DTYPES) == set(BYTES_PER_ELEMENT)
    for name, dtype in DTYPES.items():
        assert torch.tensor([], dtype=dtype).element_size() == BYTES_PER_ELEMENT[name]
    assert torch_dtype("bf16") is torch.bfloat16
    assert dtype_name(torch.float32) == "fp32" and dtype_name(torch_dtype("tf32")) == "fp32"  # same storage
    with pytest.raises(ValueError, match="known"):
        torch_dtype("fp8")
    with autocast(torch.device("cpu"), "bf16"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "fp32"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_dtype_names_round_trip():
    from lmperf.core.dtypes import DTYPES, dtype_name, torch_dtype

    # independent reference: the short names the records use, written out
    want = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    assert {dtype: dtype_name(dtype) for dtype in want} == want
    for name in DTYPES:  # every name reaches a dtype whose name leads back to it (tf32 is fp32 storage)
        assert dtype_name(torch_dtype(name)) == ("fp32" if name == "tf32" else name)
        assert torch_dtype(dtype_name(torch_dtype(name))) is torch_dtype(name)
    assert dtype_name(torch.int64) == "int64"  # no short name: torch's
