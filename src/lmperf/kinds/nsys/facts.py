"""What the nsys_profile report reads from the records (no text, no torch): ``frame``, one row per profiled cell
with both modes side by side and the unprofiled eager fp32 e2e record of the same cell beside it (the cross-check
of (a)); and the facts behind (a)–(e), pure functions of that frame, each its answer's named numbers (None where no
cell has them), a value over cells an Estimate of their median and range. A difference of times is a verdict only
through ``stats.compare``; where the time goes comes from the kernel class shares."""

from __future__ import annotations

import statistics
from collections import Counter
from types import SimpleNamespace as Facts

import pandas as pd

from lmperf.core import stats
from lmperf.report.common import count_verdicts, model_rank
from lmperf.report.compare import attention_of

ATTENTION_RANGES = {"scores": "computing attention scores", "softmax": "computing softmax", "final": "final matmul"}
RANGE_METRICS = {"ms": "kernel_ms_per_step", "flops": "flops_per_step", "matmul_ms": "matmul_ms_per_step"}
COLUMNS = ("inference_status", "training_status", "inference_fwd_e2e", "fb_top_kernel")  # in every frame
NON_TRIVIAL_SHARE = 0.02  # (c): a kernel's share of the forward's kernel time that counts
BUSY = 0.9  # (a): a forward is host-bound when its kernels keep the device busy for less of it


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
    ranked = sorted(eager, key=lambda r: r["cell"].get("warmup_steps") != usual)  # the usual count first
    return {(r["cell"]["model"], r["cell"]["context_length"]): r for r in reversed(ranked)}  # the first of a cell wins


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


def spread(values) -> stats.Estimate | None:
    """The median of some cells' values and their range; None for no values."""
    vals = [float(v) for v in values if pd.notna(v)]
    return stats.Estimate(statistics.median(vals), min(vals), max(vals), len(vals), "range") if vals else None


def judged(pairs) -> list[str]:
    """``stats.compare``'s verdict on each (profiled time, Estimate) pair; '—' where there is no Estimate.
    The profiled time is one number, a point [a, a]: where the Estimate has an interval, a verdict
    needs the point outside it beyond the margin (a point alone would drop that interval)."""
    return [stats.compare(stats.Estimate(float(a), float(a), float(a)), b) if b else "—" for a, b in pairs]


def _ranked(series) -> list[tuple[str, int]]:
    """Values by how many cells have them, most first (ties by name)."""
    return sorted(Counter(v for v in series if isinstance(v, str)).items(), key=lambda kn: (-kn[1], kn[0]))


def forward_check(df: pd.DataFrame) -> Facts | None:
    """(a) The profiler's forward time against the timer in the same process and the unprofiled e2e runs."""
    inf = ok(df, "inference")
    if inf.empty:
        return None
    timed = list(zip(inf.inference_fwd_nvtx_ms, inf.inference_fwd_timer))
    timer_verdicts = count_verdicts(judged(timed))
    e2e = inf[inf.inference_fwd_e2e.notna()]  # the cells with an e2e record
    e2e_said = judged(zip(e2e.inference_fwd_nvtx_ms, e2e.inference_fwd_e2e))
    busy = e2e.inference_fwd_kernel_ms / [e.median for e in e2e.inference_fwd_e2e]  # over the unprofiled forward
    slower_busy = spread(b for b, v in zip(busy, e2e_said) if v == "slower")
    return Facts(
        cells=len(inf),
        over_timer=spread(p / t.median for p, t in timed),  # profiler range / timer, same process
        timer_verdicts=timer_verdicts,
        matches_timer=timer_verdicts["within noise"] == len(inf),
        busy=spread(inf.inference_fwd_kernel_ms / inf.inference_fwd_nvtx_ms),  # kernel time / profiler range
        e2e_verdicts=count_verdicts(e2e_said),  # profiler range against the unprofiled e2e forward
        slower_busy=slower_busy,  # kernel time / unprofiled forward, in the cells profiling slowed
        # whether those forwards are host-bound: their kernels fill less than BUSY of the unprofiled forward
        slowed_where_idle=slower_busy is not None and slower_busy.median < BUSY,
    )


def top_kernel(df: pd.DataFrame) -> Facts | None:
    """(b) The forward's top kernel: which, in how many cells, its launches, and forward + backward's."""
    inf = ok(df, "inference")
    if not (ranked := _ranked(inf.get("inference_fwd_top_kernel", []))):
        return None
    (top, n_top), fb = ranked[0], inf[inf.fb_top_kernel.map(lambda x: isinstance(x, str))]
    return Facts(
        cells=len(inf),
        top=top,  # the label most cells have as their forward's top kernel
        top_cells=n_top,
        launches=spread(inf[inf.inference_fwd_top_kernel == top].inference_fwd_top_launches),  # in the cells it leads
        fb_cells=len(fb),
        fb_same=int((fb.fb_top_kernel == fb.inference_fwd_top_kernel).sum()),  # forward + backward's is the forward's
        fb_most=(_ranked(fb.fb_top_kernel) or [None])[0],  # forward + backward's most frequent, and its cells
    )


def non_matmul(df: pd.DataFrame, kernels: pd.DataFrame) -> Facts | None:
    """(c) Kernels other than GEMMs above NON_TRIVIAL_SHARE of the fp32 forward's kernel time."""
    inf = ok(df, "inference")
    if inf.empty:
        return None
    k = kernels[(kernels.phase == "inference_forward") & (kernels.precision == "fp32")]
    k = k[(k["class"] != "matmul") & (k.share > NON_TRIVIAL_SHARE)].groupby(["label", "class"])
    found = k.agg(cells=("share", "size"), median_share=("share", "median"), max_share=("share", "max"))
    return Facts(
        cells=len(inf),
        share=spread(1 - inf.inference_fwd_matmul_share),  # every non-matmul kernel together
        # label, class, cells, median_share, max_share; most cells first
        kernels=found.reset_index().sort_values(["cells", "max_share"], ascending=False, ignore_index=True),
    )


def training_step(df: pd.DataFrame) -> Facts | None:
    """(d) A full training step's kernel class shares against an inference forward's, same cells."""
    both = ok(ok(df, "inference"), "training")
    if both.empty:
        return None
    shares = list(both.train_class_share)
    named = any(s.get("optimizer") for s in shares)  # kernels named as AdamW's (else it runs as elementwise ones)
    other = [c for c in dict.fromkeys(c for s in shares for c in s) if c not in ("matmul", "optimizer")]
    return Facts(
        cells=len(both),
        matmul_inference=spread(both.inference_fwd_matmul_share),
        matmul_training=spread(both.train_matmul_share),
        change_points=spread((both.train_matmul_share - both.inference_fwd_matmul_share) * 100),  # per cell
        optimizer_named=named,
        # share of the step: the optimizer-class kernels, or the optimizer_step range
        optimizer=spread(s.get("optimizer") for s in shares) if named else spread(both.train_optimizer_phase_share),
        # every other class with a share of the step in some cell
        classes={c: spread(s.get(c) for s in shares) for c in other if any(s.get(c) for s in shares)},
        backward_over_forward=spread(both.bwd_over_fwd_kernel_ms),  # kernel time
        # the softmax range's kernels, share of the inference forward's kernel time
        attention_softmax=spread(both.get("att_softmax_ms", pd.Series(dtype=float)) / both.inference_fwd_kernel_ms),
    )


def attention_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The inference rows with the course's attention ranges, with the ratios of (e) beside them."""
    inf = ok(df, "inference", precision=None)
    if "att_softmax_ms" not in inf:
        return inf.iloc[0:0]
    inf = inf.dropna(subset=["att_softmax_ms"])
    matmul_ms = inf.att_scores_matmul_ms + inf.att_final_matmul_ms
    matmul_flops = inf.att_scores_flops + inf.att_final_flops
    return inf.assign(
        softmax_over_matmul_time=inf.att_softmax_ms / matmul_ms,
        softmax_over_matmul_flops=inf.att_softmax_flops / matmul_flops,
        matmul_flops_per_s=matmul_flops / (matmul_ms / 1e3),
        softmax_flops_per_s=inf.att_softmax_flops / (inf.att_softmax_ms / 1e3),
    )


def attention(df: pd.DataFrame) -> Facts | None:
    """(e) Inside self-attention: the softmax range's kernels against the two (QKᵀ, PV) matmuls', time and FLOPs,
    in the fp32 cells with the attention ranges (the other precision's where none is fp32)."""
    rows = attention_rows(df)
    rows = rows[rows.precision == "fp32"] if (rows.precision == "fp32").any() else rows
    if rows.empty:
        return None
    time, flops = rows.softmax_over_matmul_time, rows.softmax_over_matmul_flops
    return Facts(
        cells=len(rows),
        precision=rows.precision.iloc[0],
        time_ratio=spread(time),  # softmax / matmul kernel time
        flops_ratio=spread(flops),  # softmax / matmul FLOPs
        per_flop=spread(time / flops),  # how many times slower per FLOP the softmax is
        matmul_rate=spread(rows.matmul_flops_per_s),  # FLOP/s
        softmax_rate=spread(rows.softmax_flops_per_s),
    )
