"""The measuring harness against hand computations: timers and pass budgets on a fake clock, FLOP
counts, out of memory as an outcome, precision names and their bytes."""

from __future__ import annotations

import timeit

import pytest
import torch

from lmperf.core import flops, timing
from lmperf.core.dtypes import DTYPES, autocast, dtype_name, torch_dtype
from lmperf.core.oom import capture_oom, parse_oom_message
from lmperf.core.sizes import config_from_name
from lmperf.core.units import BYTES_PER_ELEMENT, GIB, MIB


class FakeClock:
    """timeit.default_timer that only moves when a pass says how long it took."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def pass_of(self, seconds: float):
        return lambda: setattr(self, "now", self.now + seconds)


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(timeit, "default_timer", fake)
    return fake


def test_summarize_against_a_hand_computation():
    s = timing.summarize([1.0, 2.0, 4.0, 5.0])
    # sample std: sqrt((2² + 1² + 1² + 2²) / 3)
    assert (s["mean"], s["median"], s["min"], s["max"], s["n"]) == (3.0, 3.0, 1.0, 5.0, 4)
    assert s["std"] == pytest.approx((10 / 3) ** 0.5) and s["samples"] == [1.0, 2.0, 4.0, 5.0]
    assert timing.summarize([7.0])["std"] == 0.0
    with pytest.raises(ValueError):
        timing.summarize([])
    flat = timing.flatten_summary("forward", timing.summarize([1.0, 3.0]))
    assert flat["forward_ms_mean"] == 2.0 and flat["forward_n"] == 2 and flat["forward_ms_samples"] == [1.0, 3.0]


def test_the_phase_timer_records_each_phase_in_ms_and_skips_unrecorded_steps(clock):
    timer = timing.PhaseTimer(torch.device("cpu"), record=False)
    with timer.phase("forward"):
        clock.pass_of(9.0)()
    timer.record = True
    for seconds in (0.02, 0.03):
        with timer.phase("forward"):
            clock.pass_of(seconds)()
    assert timer.samples_ms["forward"] == pytest.approx([20.0, 30.0])
    assert timer.event_samples_ms() == {}  # no CUDA events on the CPU


@pytest.mark.parametrize(
    "max_passes, min_passes, max_seconds, expected",
    [(10, 1, 3.5, 3), (10, 5, 3.5, 5), (2, 1, 100.0, 2), (10, 1, 0.5, 1)],
)
def test_run_passes_stops_before_the_next_pass_would_pass_the_budget(
    clock, max_passes, min_passes, max_seconds, expected
):
    # 1 s a pass: after k passes k s are gone, and the next would end at k + 1
    assert timing.run_passes(clock.pass_of(1.0), max_passes, min_passes, max_seconds) == expected


def test_warm_up_runs_the_first_pass_outside_the_budget(clock):
    assert timing.warm_up(clock.pass_of(1.0), passes=10, max_seconds=2.5) == (1000.0, 3)
    assert timing.warm_up(clock.pass_of(1.0), passes=10, max_seconds=0.5, min_passes=4) == (1000.0, 4)
    # the first pass ran elsewhere and took 7 s: a second would not fit
    assert timing.warm_up(clock.pass_of(1.0), passes=10, max_seconds=2.5, first_s=7.0) == (7000.0, 1)


def test_attention_flops_and_tflops():
    # 4·B·H·N²·d, halved when causal, backward 2.5×
    assert flops.attention_forward_flops(2, 3, 8, 8, 16) == 4 * 2 * 3 * 64 * 16
    assert flops.attention_forward_flops(1, 1, 8, 8, 16, causal=True) == 2 * 64 * 16
    assert flops.attention_backward_flops(1, 1, 8, 8, 16) == 2.5 * 4 * 64 * 16
    assert flops.tflops_per_s(2e12, 500.0) == pytest.approx(4.0)  # 2e12 FLOPs in 0.5 s


@pytest.mark.parametrize("name", ["tiny", "small", "2.7B"])
def test_lm_flops_are_two_per_matmul_parameter_per_token_plus_attention(name):
    c = config_from_name(name)
    b, t = 4, 128
    d, f, L, V = c.d_model, c.d_ff, c.num_layers, c.vocab_size
    matmul_params = L * (4 * d * d + 3 * d * f) + d * V
    attention = L * 2 * (2 * b * t * t * d)  # QK^T and PV, every score computed
    assert flops.lm_forward_flops(c, b, t) == 2 * matmul_params * b * t + attention
    assert flops.lm_training_step_flops(c, b, t) == 3 * flops.lm_forward_flops(c, b, t)


def test_out_of_memory_is_an_outcome_and_any_other_error_propagates():
    assert capture_oom(lambda: None) is None
    message = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.50 MiB is free."

    def too_big():
        raise torch.OutOfMemoryError(message + "\nmore detail")

    oom = capture_oom(too_big)
    assert oom.first_line == message and oom.reason == f"OutOfMemoryError: {message}"
    assert oom.allocated_when_caught_bytes is None  # no CUDA device given
    assert parse_oom_message(message) == {
        "oom_requested_mib": 2 * GIB / MIB,
        "oom_total_capacity_mib": pytest.approx(79.19 * 1024),
        "oom_free_mib": 1.5,
    }
    with pytest.raises(ValueError, match="a bug"):
        capture_oom(lambda: (_ for _ in ()).throw(ValueError("a bug, not an answer")))


def test_precision_names_their_dtypes_bytes_and_autocast():
    assert set(DTYPES) == set(BYTES_PER_ELEMENT)
    for name, dtype in DTYPES.items():
        assert torch.tensor([], dtype=dtype).element_size() == BYTES_PER_ELEMENT[name]
        assert dtype_name(torch_dtype(name)) == ("fp32" if name == "tf32" else name)  # tf32 stores float32
    want = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    assert {dtype: dtype_name(dtype) for dtype in want} == want and dtype_name(torch.int64) == "int64"
    with pytest.raises(ValueError, match="known"):
        torch_dtype("fp8")
    for name, product in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        with autocast(torch.device("cpu"), name):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == product
