"""What bounds the best rung: the profile's step splits into parts that add up, matmul rates count the
FLOPs the kernels compute, a profile from another run is named, the GEMM ceilings are read."""

from __future__ import annotations

import pytest

from lmperf.core.record import make_record
from lmperf.kinds.ladder import bounds, facts

from .ladder_synth import PROV, rung

FULL, HALF = 100e12, 90e12  # attention 20e12 in full, 10e12 counted half; GEMMs 80e12


def best_rung(attention: str = "sdpa_cudnn", step_ms: float = 300.0):
    record = rung(
        "compile",
        0,
        None,
        step_ms,
        attention=attention,
        step_flops=FULL,
        step_flops_causal_half=HALF,
        parameter_count=1_000_000_000,
        datasheet_hbm_gbps=2000.0,
    )
    (ladder,) = facts.ladders_from([record])
    return ladder.best


def profile(best, class_ms: dict, idle_ms: float, window_ms: float, steps: int = 2, **metrics) -> dict:
    m = {
        "rung": best.name,
        "config": best.config,
        "profiled_steps": steps,
        "window_ms": window_ms,
        "idle_ms": idle_ms,
        "busy_fraction": 1 - idle_ms / window_ms,
        "class_ms": class_ms,
        "step_ms_ladder": best.step_ms.median,
        "top_kernels": [{"name": "nvjet_x", "class": "matmul", "ms": 100.0, "share": 0.5}],
        **metrics,
    }
    return make_record("ladder_profile", {"model": best.model, "context_length": best.context_length}, "ok", m, PROV)


def test_the_profiled_step_splits_into_parts_that_add_up():
    best = best_rung()
    p = bounds.profile_from(profile(best, {"matmul": 400.0, "elementwise": 60.0, "optimizer": 30.0}, 6.0, 496.0), best)
    assert p.parts == (("matmul", 200.0), ("elementwise", 30.0), ("optimizer", 15.0), ("idle", 3.0))
    assert sum(v for _, v in p.parts) == pytest.approx(p.step_ms) == pytest.approx(248.0)
    # kernels that overlap count twice in the classes: the split says so, and still adds up
    p = bounds.profile_from(profile(best, {"matmul": 400.0, "elementwise": 60.0, "optimizer": 30.0}, 6.0, 490.0), best)
    assert p.parts[-1] == (bounds.OVERLAP, pytest.approx(-3.0))
    assert sum(v for _, v in p.parts) == pytest.approx(245.0)


@pytest.mark.parametrize(
    ("attention", "classes", "matmul", "attn"),
    [
        ("sdpa_cudnn", {"matmul": 400.0, "attention": 100.0}, 80e12 / 0.2 / 1e12, 10e12 / 0.05 / 1e12),
        ("sdpa_cudnn", {"matmul": 500.0}, 90e12 / 0.25 / 1e12, None),  # fused, not told apart: half counted
        ("plain", {"matmul": 500.0}, 100e12 / 0.25 / 1e12, None),  # the unfused attention computes every score
    ],
)
def test_matmul_rates_count_what_the_kernels_compute(attention, classes, matmul, attn):
    best = best_rung(attention)
    p = bounds.profile_from(profile(best, classes, 0.0, sum(classes.values())), best)
    assert p.matmul_tflops == pytest.approx(matmul)
    assert p.attention_separate == (attn is not None) and p.attention_fused == (attention != "plain")
    assert (p.attention_tflops == pytest.approx(attn)) if attn else p.attention_tflops is None


def test_the_optimizer_floor_is_bytes_over_bandwidth():
    best = best_rung()
    p = bounds.profile_from(profile(best, {"matmul": 400.0, "optimizer": 40.0}, 0.0, 440.0), best)
    assert p.optimizer_floor_ms == pytest.approx(1e9 * 28 / 2000e9 * 1e3) and p.optimizer_ms == pytest.approx(20.0)


def test_a_profile_from_another_run_is_told_apart():
    best = best_rung()
    tol = facts.PROFILE_RUN_TOLERANCE
    near = profile(best, {"matmul": 400.0}, 0.0, 400.0, step_ms_ladder=best.step_ms.median * (1 + tol / 2))
    far = profile(best, {"matmul": 400.0}, 0.0, 400.0, step_ms_ladder=best.step_ms.median * (1 + 2 * tol))
    assert bounds.profile_from(near, best).same_run and not bounds.profile_from(far, best).same_run
    other_rung = profile(best, {"matmul": 400.0}, 0.0, 400.0, rung="max_batch")
    p = bounds.profile_from(other_rung, best)
    assert not p.same_run and p.matmul_tflops is None  # no rate from another rung's FLOPs
    other_batch = profile(best, {"matmul": 400.0}, 0.0, 400.0, config={**best.config, "batch_size": 8})
    assert not bounds.profile_from(other_batch, best).same_run


def test_a_profile_that_was_not_taken_keeps_its_reason():
    best = best_rung()
    record = make_record(
        "ladder_profile", {"model": "small", "context_length": 1024}, "unsupported", {}, PROV, "nsys is not on PATH"
    )
    p = bounds.profile_from(record, best)
    assert not p.ok and p.reason == "nsys is not on PATH"


def test_the_ceilings_are_read_per_precision():
    metrics = {
        "precisions": ["fp32", "bf16"],
        "fp32_tflops": 50.0,
        "fp32_best_n": 4096,
        "fp32_datasheet_tflops": 66.9,
        "bf16_tflops": 800.0,
        "bf16_best_n": 8192,
    }
    record = make_record("gemm_peak", {"probe": "square_gemm"}, "ok", metrics, PROV)
    fp32, bf16 = bounds.ceilings_from([record])
    assert (fp32.precision, fp32.tflops, fp32.best_n) == ("fp32", 50.0, 4096)
    assert fp32.share_of_datasheet == pytest.approx(50.0 / 66.9) and bf16.share_of_datasheet is None
