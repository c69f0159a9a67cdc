"""Writing helpers of the flash report beyond ``lmperf.report.common``'s: precision order, why records did
not run. No torch."""

from __future__ import annotations

PRECISION_ORDER = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3}


def why(records: list[dict]) -> str:
    """' (unsupported: no CUDA device)': what stopped the records that are not ok, or ''."""
    reasons = "; ".join(sorted({f"{r['status']}: {r['reason']}" for r in records if r["status"] != "ok"}))
    return f" ({reasons})" if reasons else ""
