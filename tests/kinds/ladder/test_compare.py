"""ladder across devices: time per token, and whether matmul-heavy rungs follow the measured matmul ceilings."""

from __future__ import annotations

from lmperf.core.record import make_record
from lmperf.kinds.ladder.compare import compare
from tests.kinds.records import provenance


def rung(device, model, rung_name, index, step_ms, tokens, ceiling, mfu) -> dict:
    metrics = {
        "step_ms_median": step_ms,
        "tokens_per_step": tokens,
        "ceiling_measured": ceiling,
        "mfu_measured": mfu,
        "rung_index": index,
    }
    cell = {"model": model, "context_length": 1024, "rung": rung_name}
    return make_record("ladder", cell, "ok", metrics, provenance(device))


def grid(device: str, scale: float, ceiling: float, batch: int = 4) -> list[dict]:
    """Two matmul-heavy rungs (most of the ceiling) and one light one, per model; ``batch`` multiplies
    the tokens and the time of max_batch (a device with more memory picks a larger batch)."""
    out = []
    for i, model in enumerate(("small", "medium", "large")):
        base = 100.0 * (i + 1)
        out.append(rung(device, model, "baseline", 0, base * scale, 4096, ceiling, 0.2))
        out.append(rung(device, model, "compile", 7, base / 2 * scale * (1 + 0.01 * i), 4096, ceiling, 0.6))
        out.append(rung(device, model, "max_batch", 8, base / 8 * batch * scale, 1024 * batch, ceiling, 0.6))
    probe = {"bf16_tflops": ceiling, "fp32_tflops": ceiling / 16}
    out.append(make_record("gemm_peak", {"probe": "square_gemm"}, "ok", probe, provenance(device)))
    # each device profiles its own best rung: distinct numbers, so the evidence's order is checked
    h100 = device == "h100"
    profile = {"busy_fraction": 0.98 if h100 else 0.99, "class_share": {"matmul": 0.7 if h100 else 0.8}}
    profile["rung"] = "compile" if h100 else "max_batch"
    cell = {"model": "large", "context_length": 1024}
    out.append(make_record("ladder_profile", cell, "ok", profile, provenance(device)))
    return out


def test_faster_with_the_same_ceiling_is_outside_the_matmuls():
    c = compare({"h100": grid("h100", 1.0, 800.0), "h200": grid("h200", 0.8, 800.0, batch=8)})
    # per token: max_batch's larger batch is no slower
    assert c.cells == 9 and c.verdict.startswith("`h200` faster (0.80×)")
    assert c.verdict.endswith(
        "faster than its measured matmul ceiling predicts on matmul-heavy rungs: the difference is outside the matmuls"
    )
    assert "measured matmul ceilings `h200` / `h100`: bf16 1.00×, fp32 1.00×" in c.evidence
    assert c.evidence.endswith(
        "profiled best rung `h200` / `h100` (`max_batch` / `compile`): GPU busy 99% / 98%, matmuls 80% / 70% of kernel time"
    )
    assert list(c.table["rung"]) == ["baseline", "compile", "max_batch"]


def test_faster_by_the_ceilings_ratio_is_compute_bound_and_slower_than_they_allow_is_not():
    c = compare({"h100": grid("h100", 1.0, 800.0), "h200": grid("h200", 0.8, 1000.0)})
    assert c.verdict.endswith("matmul-heavy rungs follow the measured matmul ceilings: compute-bound")
    c = compare({"h100": grid("h100", 1.0, 800.0), "h200": grid("h200", 1.0, 1000.0)})
    assert c.verdict == (
        "level (1.00×); `h200` slower than its measured matmul ceiling predicts on matmul-heavy rungs: "
        "the difference is outside the matmuls"
    )
