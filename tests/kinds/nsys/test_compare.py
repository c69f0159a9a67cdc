"""nsys across devices: the kernel time per step, and compute or bandwidth from the kernel classes."""

from __future__ import annotations

from lmperf.core.record import make_record
from lmperf.kinds.nsys.compare import compare

from .records import provenance

BASE_MS = {"matmul": 5.0, "attention": 1.0, "elementwise": 2.0, "optimizer": 1.0, "reduction": 0.5, "other": 0.1}


def profile(device: str, model: str, ctx: int, compute: float, bandwidth: float, mode: str) -> dict:
    """A profile whose matmul and attention time scales by ``compute`` and whose other classes by ``bandwidth``."""
    size = {"small": 1.0, "medium": 3.0}[model] * ctx / 128
    class_ms = {c: ms * size * (compute if c in ("matmul", "attention") else bandwidth) for c, ms in BASE_MS.items()}
    phase = "training_step" if mode == "training" else "inference_forward"
    metrics = {"phases": {phase: {"kernel_ms_per_step": sum(class_ms.values()), "class_ms_per_step": class_ms}}}
    cell = {"model": model, "context_length": ctx, "precision": "fp32", "mode": mode}
    return make_record("nsys", cell, "ok", metrics, provenance(device))


def grid(device: str, compute: float = 1.0, bandwidth: float = 1.0) -> list[dict]:
    return [
        profile(device, model, ctx, compute * (1 + 0.001 * ctx / 128), bandwidth, mode)
        for model in ("small", "medium")
        for ctx in (128, 256, 512)
        for mode in ("training", "inference")
    ]


def test_faster_in_bandwidth_bound_kernels_only_is_memory_bandwidth():
    c = compare({"h100": grid("h100"), "h200": grid("h200", bandwidth=0.7)})
    assert c.cells == 12 and c.verdict.startswith("`h200` faster")
    assert c.verdict.endswith("`h200` faster in its bandwidth-bound kernels, matmuls level: memory bandwidth")
    assert c.evidence.startswith("matmuls 1.00×") and "bandwidth-bound kernels 0.70×" in c.evidence
    assert "(36% of the kernel time on `h100`, median cell)" in c.evidence  # 3.5 of 9.6 ms


def test_faster_in_matmuls_and_fused_attention_only_is_compute_then_level_and_opposite_sides():
    c = compare({"h100": grid("h100"), "h200": grid("h200", compute=0.8)})
    assert c.verdict.endswith("`h200` faster in its matmuls, bandwidth-bound kernels level: compute")
    assert compare({"h100": grid("h100"), "h200": grid("h200")}).verdict == (
        "level (1.00×); level in matmuls and in bandwidth-bound kernels"
    )
    mixed = compare({"h100": grid("h100"), "h200": grid("h200", compute=1.2, bandwidth=0.7)})
    assert mixed.verdict.endswith("`h200` slower in its matmuls and faster in its bandwidth-bound kernels")


def test_profiles_without_a_whole_step_phase_or_a_second_device_are_not_compared():
    bare = {d: [make_record("nsys", {"model": "small", "mode": "training"}, "ok", {"phases": {}}, provenance(d))]
            for d in ("h100", "h200")}  # fmt: skip
    assert compare(bare).verdict.startswith("not compared")
    assert compare({"h100": grid("h100")}).verdict.startswith("not compared")
