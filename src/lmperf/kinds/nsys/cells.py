"""The nsys records as one row per profiled cell (model, context length, precision), both modes side by side.

Each nsys cell has two records: ``inference`` (forward under ``torch.no_grad``) and ``training``
(forward with loss, backward, AdamW step). ``frame`` reads what the answers need from both into one
row, with the end-to-end record of the same cell beside it (a separate, unprofiled process: the
cross-check of (a)). Times the records hold with an interval come as ``lmperf.core.stats.Estimate``.
No torch here.
"""

from __future__ import annotations

from collections import Counter

import pandas as pd

from lmperf.core import stats
from lmperf.core.sizes import SIZES, config_from_name, parameter_count

ATTENTION_RANGES = {"scores": "computing attention scores", "softmax": "computing softmax", "final": "final matmul"}


def model_rank(name: str) -> int:
    """Registered sizes by parameter count (unknown names last)."""
    order = sorted(SIZES, key=lambda n: parameter_count(config_from_name(n)))
    return order.index(name) if name in order else len(order)


def _attention_of(record: dict) -> str:
    return (record["provenance"].get("settings") or {}).get("attention") or "plain"


def e2e_matches(e2e_records: list[dict]) -> dict[tuple, dict]:
    """(model, context length, precision) -> the eager fp32 end-to-end record with the course's attention.

    Where a cell was timed after several warm-up counts, the record of the count most of these records
    share (the e2e grid's own; the other counts are a sweep of a few cells) is taken."""
    eager = [
        r
        for r in e2e_records
        if r["kind"] == "e2e"
        and r["status"] == "ok"
        and r["cell"].get("precision") == "fp32"
        and r["cell"].get("compile", "eager") == "eager"
        and _attention_of(r) == "plain"
    ]
    if not eager:
        return {}
    usual = Counter(r["cell"].get("warmup_steps") for r in eager).most_common(1)[0][0]
    out: dict[tuple, dict] = {}
    for r in sorted(eager, key=lambda r: r["cell"].get("warmup_steps") != usual):
        c = r["cell"]
        out.setdefault((c["model"], c["context_length"], c["precision"]), r)
    return out


def _top(phase: dict) -> dict:
    return phase["top_kernels"][0] if phase.get("top_kernels") else {}


def _inference(row: dict, r: dict, e2e: dict | None) -> None:
    m = r["metrics"]
    phase = m["phases"]["inference_forward"]
    cc = m["forward_cross_check"]
    top = _top(phase)
    row.update(
        inference_fwd_timer=stats.metric(r, "inference_forward_ms_mean") or stats.Estimate(cc["timer_ms_mean"]),
        inference_fwd_nvtx_ms=cc["nvtx_range_ms_mean"],
        inference_fwd_kernel_ms=cc["kernel_ms_per_step"],
        inference_fwd_e2e=stats.metric(e2e, "inference_forward_ms_mean") if e2e else None,
        inference_fwd_top_kernel=top.get("label"),
        inference_fwd_top_kernel_name=top.get("name"),
        inference_fwd_top_launches=top.get("launches_per_step"),
        inference_fwd_top_share=top.get("share"),
        inference_fwd_launches=phase["launches_per_step"],
        inference_fwd_top_matmul=next((k["label"] for k in phase["top_kernels"] if k["class"] == "matmul"), None),
        inference_fwd_matmul_share=phase["matmul_share"],
        inference_class_share=phase["class_share"],
        inference_class_ms=phase.get("class_ms_per_step") or {},
    )
    ranges = (m.get("attention") or {}).get("ranges") or {}
    if all(name in ranges for name in ATTENTION_RANGES.values()):
        for key, name in ATTENTION_RANGES.items():
            row[f"att_{key}_ms"] = ranges[name]["kernel_ms_per_step"]
            row[f"att_{key}_matmul_ms"] = ranges[name]["matmul_ms_per_step"]
            row[f"att_{key}_flops"] = ranges[name]["flops_per_step"]


def _training(row: dict, r: dict, e2e: dict | None) -> None:
    m = r["metrics"]
    phases = m["phases"]
    step, fb = phases["training_step"], phases["forward_backward"]
    cc = m["forward_cross_check"]
    optimizer = phases.get("optimizer_step") or {}
    top = _top(fb)
    row.update(
        training_fwd_timer=stats.metric(r, "forward_ms_mean") or stats.Estimate(cc["timer_ms_mean"]),
        training_fwd_nvtx_ms=cc["nvtx_range_ms_mean"],
        training_fwd_e2e=stats.metric(e2e, "forward_ms_mean") if e2e else None,
        train_matmul_share=step["matmul_share"],
        train_class_share=step["class_share"],
        train_optimizer_phase_share=(
            optimizer.get("kernel_ms_per_step", 0.0) / step["kernel_ms_per_step"]
            if step["kernel_ms_per_step"]
            else None
        ),
        train_launches=step["launches_per_step"],
        fb_top_kernel=top.get("label"),
        fb_top_kernel_name=top.get("name"),
        fb_top_share=top.get("share"),
        bwd_over_fwd_kernel_ms=phases["backward"]["kernel_ms_per_step"] / phases["forward"]["kernel_ms_per_step"],
    )


def _nvtx_cost(row: dict, r: dict) -> None:
    """The forwards timed with the ranges off and on, no profiler attached (one timing per size, repeated
    in each of its records)."""
    overhead = r["metrics"].get("nvtx_overhead") or {}
    if overhead.get("status") == "ok" and overhead.get("nvtx_disabled_forward_ms_samples"):
        row["nvtx_off"] = stats.estimate(overhead["nvtx_disabled_forward_ms_samples"])
        row["nvtx_on"] = stats.estimate(overhead["nvtx_enabled_forward_ms_samples"])
        row["nvtx_ctx"] = overhead["context_length"]


COLUMNS = ("inference_status", "training_status", "inference_fwd_e2e", "training_fwd_e2e", "fb_top_kernel")


def frame(records: list[dict], e2e_records: list[dict]) -> pd.DataFrame:
    """One row per (model, context length, precision), sizes smallest first."""
    e2e = e2e_matches(e2e_records)
    rows: dict[tuple, dict] = {}
    for r in records:
        c = r["cell"]
        key = (c["model"], c["context_length"], c["precision"])
        row = rows.setdefault(key, {"model": key[0], "context_length": key[1], "precision": key[2]})
        row[f"{c['mode']}_status"] = r["status"]
        row.setdefault("profiler", r["metrics"].get("profiler"))
        _nvtx_cost(row, r)
        if r["status"] == "ok":
            (_inference if c["mode"] == "inference" else _training)(row, r, e2e.get(key))
    df = pd.DataFrame(list(rows.values()))
    if df.empty:
        return df
    df = df.assign(**{c: None for c in COLUMNS if c not in df})
    df["_rank"] = df["model"].map(model_rank)
    return df.sort_values(["_rank", "context_length", "precision"]).drop(columns="_rank").reset_index(drop=True)


def ok(df: pd.DataFrame, mode: str, precision: str | None = "fp32") -> pd.DataFrame:
    """The rows whose ``mode`` record is ok, of one precision (None: every precision)."""
    col = f"{mode}_status"
    if df.empty or col not in df:
        return df.iloc[0:0]
    sub = df[df[col] == "ok"]
    return sub[sub.precision == precision] if precision else sub


def kernels_frame(records: list[dict]) -> pd.DataFrame:
    """Every phase's top kernels of every ok record, ranked: the long table behind (b) and (c)."""
    rows = []
    for r in records:
        if r["status"] != "ok":
            continue
        for phase, s in r["metrics"]["phases"].items():
            for rank, k in enumerate(s.get("top_kernels") or [], 1):
                rows.append({**r["cell"], "phase": phase, "rank": rank, **k})
    return pd.DataFrame(rows)


def oom_cells(records: list[dict]) -> list[str]:
    """'xl ctx 1024 fp32 training' for every record that ran out of memory, sizes smallest first."""
    hits = [r["cell"] for r in records if r["status"] == "oom"]
    hits.sort(key=lambda c: (model_rank(c["model"]), c["context_length"], c["precision"], c["mode"]))
    return [f"{c['model']} ctx {c['context_length']} {c['precision']} {c['mode']}" for c in hits]
