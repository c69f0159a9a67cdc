"""Synthetic precision records (one per probe), schema-valid, for the facts and report tests."""

from __future__ import annotations

from lmperf.core.record import make_record
from lmperf.kinds.precision.report import LN_LABELS
from tests.kinds.records import provenance

PROVENANCE = provenance(start_time="2026-11-26T10:00:00+00:00")


def record(probe: str, metrics: dict) -> dict:
    return make_record("precision", {"probe": probe}, "ok", {"device_type": "cuda", **metrics}, PROVENANCE)


def accumulation(cast_result: float = 10.00213623046875, mixed_result: float = 10.00213623046875) -> dict:
    """The course's four loops as an H100 measures them; the fp16-increment results may be changed."""
    fp16 = 0.01000213623046875
    loops = [
        ("fp32 += fp32", 10.000133514404297, 0.009999999776482582, 9.5367431640625e-07),
        ("fp16 += fp16", 9.953125, fp16, 0.0078125),
        ("fp32 += fp16", mixed_result, fp16, 9.5367431640625e-07),
        ("fp32 += fp16 cast to fp32", cast_result, fp16, 9.5367431640625e-07),
    ]
    keys = ("variant", "result", "stored_increment", "accumulator_spacing_at_result")
    rows = [dict(zip(keys, loop), steps=1000, exact=10.0, abs_error=abs(loop[1] - 10.0)) for loop in loops]
    return record(
        "accumulation", {"results": [r | {"exact_sum_of_stored_increment": 1000 * r["stored_increment"]} for r in rows]}
    )


def autocast(dtype: str, **overrides) -> dict:
    """One autocast entry as CUDA gives it: matmuls in ``dtype``, layer norm and loss in fp32."""
    params = {"fc1.weight": "fp32", "ln.weight": "fp32"}
    entry = {"parameters": params, "fc1_output": dtype, "relu_output": dtype, "ln_output": "fp32", "logits": dtype}
    return entry | {"loss": "fp32", "gradients": dict(params)} | overrides


def ln_row(dtype: str, mean: float, **errors) -> dict:
    """One layer-norm probe result: errors of 0.01 unless ``errors`` overrides them (None: overflowed)."""
    maximum = {"fp16": 65504.0, "bf16": 3.39e38, "fp32": 3.4e38}[dtype]
    row = {"dtype": dtype, "mean": mean, "std": 1.0, "width": 2560, "rows": 16, "dtype_max": maximum}
    row |= {
        "sum_of_squares_exact_max": 2560 * (mean**2 + 1),
        "sum_of_squares_fp32_accumulation_overflow": dtype == "fp16" and mean >= 10,
    }
    return row | dict.fromkeys((k for k in LN_LABELS if "overflow" not in k), 0.01) | errors


def layer_norm(rows: list[dict]) -> dict:
    return record("layer_norm", {"results": rows})  # make_record stores a non-finite value as null
