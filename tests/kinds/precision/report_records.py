"""Synthetic precision records (one per probe) for the report's tests, valid per ``make_record``."""

from __future__ import annotations

import math

from lmperf.core.record import make_record
from lmperf.kinds.precision import facts as F

PROVENANCE = {
    "device_slug": "h100",
    "device_name": "NVIDIA H100 80GB HBM3",
    "torch_version": "2.11.0",
    "git_commit": "0123456789abcdef0123456789abcdef01234567",
    "git_dirty": False,
    "start_time": "2026-11-26T10:00:00+00:00",
    "settings": {},
}


def record(probe: str, metrics: dict) -> dict:
    return make_record("precision", {"probe": probe}, "ok", metrics, PROVENANCE)


def loop(variant: str, result: float, stored: float, spacing: float, steps: int = 1000) -> dict:
    return {
        "variant": variant,
        "steps": steps,
        "increment": 0.01,
        "result": result,
        "exact": 10.0,
        "abs_error": abs(result - 10.0),
        "stored_increment": stored,
        "exact_sum_of_stored_increment": steps * stored,
        "accumulator_spacing_at_result": spacing,
    }


def accumulation(cast_result: float = 10.00213623046875, mixed_result: float = 10.00213623046875) -> dict:
    """The course's four loops as an H100 measures them; the fp16-increment results may be changed."""
    fp16 = 0.01000213623046875
    return record(
        "accumulation",
        {
            "results": [
                loop("fp32 += fp32", 10.000133514404297, 0.009999999776482582, 9.5367431640625e-07),
                loop("fp16 += fp16", 9.953125, fp16, 0.0078125),
                loop("fp32 += fp16", mixed_result, fp16, 9.5367431640625e-07),
                loop("fp32 += fp16 cast to fp32", cast_result, fp16, 9.5367431640625e-07),
            ]
        },
    )


def autocast(dtype: str, **overrides) -> dict:
    """One autocast entry as CUDA gives it: matmuls in ``dtype``, layer norm and loss in fp32."""
    params = {"fc1.weight": "fp32", "ln.weight": "fp32"}
    entry = {"status": "ok", "parameters": params, "fc1_output": dtype, "relu_output": dtype, "ln_output": "fp32"}
    entry.update(logits=dtype, loss="fp32", gradients=dict(params))
    entry.update(overrides)
    return entry


def toy(**entries) -> dict:
    return record("toy_model", {"device_type": "cuda", "autocast": entries})


def ln_row(dtype: str, mean: float, **errors) -> dict:
    """One layer-norm probe result: finite errors of 0.01 unless ``errors`` overrides them (None: overflowed)."""
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
        **dict.fromkeys(F.ERROR_COLUMNS, 0.01),
    }
    row.update(errors)
    return row


def layer_norm(rows: list[dict]) -> dict:
    clean = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows]
    return record("layer_norm", {"device_type": "cuda", "results": clean})
