"""The nsys records as one row per profiled cell, both modes side by side, with the unprofiled eager fp32
e2e record of the same cell beside it (the cross-check of (a)). No torch here."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from lmperf.core import stats
from lmperf.report.common import model_order
from lmperf.report.compare import attention_of

ATTENTION_RANGES = {"scores": "computing attention scores", "softmax": "computing softmax", "final": "final matmul"}
RANGE_METRICS = {"ms": "kernel_ms_per_step", "flops": "flops_per_step", "matmul_ms": "matmul_ms_per_step"}
COLUMNS = ("inference_status", "training_status", "inference_fwd_e2e", "fb_top_kernel")  # in every frame


def model_rank(name: str) -> int:
    return model_order().index(name)  # registered sizes by parameter count


def e2e_matches(e2e_records: list[dict]) -> dict[tuple, dict]:
    """(model, context length) -> the eager fp32 e2e record with the course's attention, at the warm-up
    count most of them share (the e2e grid's; the other counts are a sweep of a few cells)."""
    eager = [
        r
        for r in e2e_records
        if r["kind"] == "e2e" and r["status"] == "ok" and r["cell"].get("precision") == "fp32"
        if r["cell"].get("compile", "eager") == "eager" and attention_of(r) == "plain"
    ]
    usual = Counter(r["cell"].get("warmup_steps") for r in eager).most_common(1)[0][0] if eager else None
    out: dict[tuple, dict] = {}
    for r in sorted(eager, key=lambda r: r["cell"].get("warmup_steps") != usual):
        out.setdefault((r["cell"]["model"], r["cell"]["context_length"]), r)
    return out


def _inference(r: dict, e2e: dict | None) -> dict:
    fwd = r["metrics"]["phases"]["inference_forward"]
    top = (fwd.get("top_kernels") or [{}])[0]
    row = {
        "inference_fwd_timer": stats.metric(r, "inference_forward_ms_mean"),
        "inference_fwd_nvtx_ms": fwd["range_ms_mean"],
        "inference_fwd_kernel_ms": fwd["kernel_ms_per_step"],
        "inference_fwd_e2e": stats.metric(e2e, "inference_forward_ms_mean") if e2e else None,
        "inference_fwd_top_kernel": top.get("label"),
        "inference_fwd_top_launches": top.get("launches_per_step"),
        "inference_fwd_top_share": top.get("share"),
        "inference_fwd_launches": fwd["launches_per_step"],
        "inference_fwd_matmul_share": fwd["matmul_share"],
        "inference_class_share": fwd["class_share"],
    }
    ranges = (r["metrics"].get("attention") or {}).get("ranges") or {}
    for key, name in ATTENTION_RANGES.items() if all(n in ranges for n in ATTENTION_RANGES.values()) else ():
        row |= {f"att_{key}_{column}": ranges[name][metric] for column, metric in RANGE_METRICS.items()}
    return row


def _training(r: dict) -> dict:
    phases = r["metrics"]["phases"]
    step, fb = phases["training_step"], phases["forward_backward"]
    return {
        "train_matmul_share": step["matmul_share"],
        "train_class_share": step["class_share"],
        "train_optimizer_phase_share": phases["optimizer_step"]["kernel_ms_per_step"] / step["kernel_ms_per_step"],
        "train_launches": step["launches_per_step"],
        "fb_top_kernel": (fb.get("top_kernels") or [{}])[0].get("label"),
        "bwd_over_fwd_kernel_ms": phases["backward"]["kernel_ms_per_step"] / phases["forward"]["kernel_ms_per_step"],
    }


def frame(records: list[dict], e2e_records: list[dict]) -> pd.DataFrame:
    """One row per (model, context length, precision), sizes smallest first."""
    e2e, rows = e2e_matches(e2e_records), {}
    for r in records:
        c = r["cell"]
        key = (c["model"], c["context_length"], c["precision"])
        row = rows.setdefault(key, dict(zip(("model", "context_length", "precision"), key)))
        row[f"{c['mode']}_status"] = r["status"]
        if r["status"] == "ok" and c["mode"] == "inference":
            row |= _inference(r, e2e.get(key[:2]) if c["precision"] == "fp32" else None)
        elif r["status"] == "ok":
            row |= _training(r)
    df = pd.DataFrame(list(rows.values()))
    if df.empty:
        return df
    df = df.assign(**{c: None for c in COLUMNS if c not in df}, _rank=df.model.map(model_rank))
    return df.sort_values(["_rank", "context_length", "precision"]).drop(columns="_rank").reset_index(drop=True)


def ok(df: pd.DataFrame, mode: str, precision: str | None = "fp32") -> pd.DataFrame:
    """The rows whose ``mode`` record is ok, of one precision (None: every precision)."""
    if df.empty or f"{mode}_status" not in df:
        return df.iloc[0:0]
    sub = df[df[f"{mode}_status"] == "ok"]
    return sub[sub.precision == precision] if precision else sub


def kernels_frame(records: list[dict]) -> pd.DataFrame:
    """Every phase's top kernels of every ok record, ranked: the long table behind (b) and (c)."""
    return pd.DataFrame(
        [
            {**r["cell"], "phase": phase, "rank": rank, **k}
            for r in records
            if r["status"] == "ok"
            for phase, s in r["metrics"]["phases"].items()
            for rank, k in enumerate(s.get("top_kernels") or [], 1)
        ]
    )


def oom_cells(records: list[dict]) -> list[str]:
    """'xl ctx 1024 fp32 training' for every record that ran out of memory, sizes smallest first."""
    cells = sorted(
        (r["cell"] for r in records if r["status"] == "oom"),
        key=lambda c: (model_rank(c["model"]), c["context_length"], c["precision"], c["mode"]),
    )
    return [f"{c['model']} ctx {c['context_length']} {c['precision']} {c['mode']}" for c in cells]
