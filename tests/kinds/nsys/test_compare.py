"""nsys across devices: the kernel time per step, and compute or bandwidth from the kernel classes."""

from __future__ import annotations

from lmperf.core.record import make_record
from lmperf.kinds.nsys.compare import compare

BASE_MS = {"matmul": 6.0, "elementwise": 2.0, "optimizer": 1.0, "reduction": 0.5, "other": 0.1}


def provenance(device: str) -> dict:
    return {
        "device_slug": device,
        "device_name": device.upper(),
        "torch_version": "2.11",
        "git_commit": "0" * 40,
        "git_dirty": False,
        "start_time": "2026-11-26T10:00:00+00:00",
        "settings": {},
    }


def profile(device: str, model: str, ctx: int, matmul: float, bandwidth: float, mode: str = "training") -> dict:
    """A profile whose matmul time scales by ``matmul`` and whose other classes by ``bandwidth``."""
    size = {"small": 1.0, "medium": 3.0}[model] * ctx / 128
    class_ms = {c: ms * size * (matmul if c == "matmul" else bandwidth) for c, ms in BASE_MS.items()}
    phase = "training_step" if mode == "training" else "inference_forward"
    metrics = {
        "phases": {phase: {"kernel_ms_per_step": sum(class_ms.values()), "class_ms_per_step": class_ms}},
    }
    cell = {"model": model, "context_length": ctx, "precision": "fp32", "mode": mode}
    return make_record("nsys", cell, "ok", metrics, provenance(device))


def grid(device: str, matmul: float = 1.0, bandwidth: float = 1.0) -> list[dict]:
    return [
        profile(device, model, ctx, matmul * (1 + 0.001 * ctx / 128), bandwidth, mode)
        for model in ("small", "medium")
        for ctx in (128, 256, 512)
        for mode in ("training", "inference")
    ]


def test_faster_in_bandwidth_bound_kernels_only_is_memory_bandwidth():
    c = compare({"h100": grid("h100"), "h200": grid("h200", bandwidth=0.7)})
    assert c.cells == 12 and c.verdict.startswith("`h200` faster")
    assert c.verdict.endswith("`h200` faster in its bandwidth-bound kernels, matmuls level: memory bandwidth")
    assert c.evidence.startswith("matmuls 1.00×") and "bandwidth-bound kernels 0.70×" in c.evidence
    assert "(36% of the kernel time on `h100`, median cell)" in c.evidence  # 3.5 of 9.6 ms and a little


def test_faster_in_matmuls_only_is_compute():
    c = compare({"h100": grid("h100"), "h200": grid("h200", matmul=0.8)})
    assert c.verdict.endswith("`h200` faster in its matmuls, bandwidth-bound kernels level: compute")


def test_level_and_opposite_sides():
    assert compare({"h100": grid("h100"), "h200": grid("h200")}).verdict == (
        "level (1.00×); level in matmuls and in bandwidth-bound kernels"
    )
    mixed = compare({"h100": grid("h100"), "h200": grid("h200", matmul=1.2, bandwidth=0.7)})
    assert mixed.verdict.endswith("`h200` slower in its matmuls and faster in its bandwidth-bound kernels")


def test_table_rows_per_class_with_shares():
    c = compare({"h100": grid("h100"), "h200": grid("h200", bandwidth=0.7)})
    rows = {r["kernels"]: r for r in c.table.to_dict("records")}
    assert set(rows) == {"all kernels", "matmul", "elementwise", "optimizer", "reduction", "other"}
    assert rows["matmul"]["share of kernel time"] == "63%" and rows["matmul"]["verdict"] == "within noise"
    assert rows["optimizer"]["verdict"] == "faster"


def test_profiles_without_a_whole_step_phase_are_not_compared():
    bare = [make_record("nsys", {"model": "small", "mode": "training"}, "ok", {"phases": {}}, provenance("h100"))]
    other = [make_record("nsys", {"model": "small", "mode": "training"}, "ok", {"phases": {}}, provenance("h200"))]
    assert compare({"h100": bare, "h200": other}).verdict.startswith("not compared")
