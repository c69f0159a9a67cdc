"""The tables of nsys_profile (a)–(e), and the two CSV files behind them. No torch here.

Each ``*_table`` returns the DataFrame a section shows (units in the column names, kernel names
short); ``cells_csv`` is every number of the per-cell frame (an interval's ends in their own columns),
``kernels.csv`` every phase's top kernels (``cells.kernels_frame``).
"""

from __future__ import annotations

import pandas as pd

from lmperf.core import stats
from lmperf.kinds.nsys.cells import ok
from lmperf.kinds.nsys.facts import attention_rows
from lmperf.kinds.nsys.names import short
from lmperf.kinds.nsys.text import Words, pct

# marks an estimate whose interval is wider than the unstable margin (said once, under the table)
UNSTABLE_MARK = "†"


def estimate_text(e) -> str:
    """'56.20 [55.90, 56.60]' (the value alone for one trial; no decimals from 100 up), † where unstable;
    '—' for none."""
    if not isinstance(e, stats.Estimate):
        return "—"
    return e.format(0 if abs(e.median) >= 100 else 2) + (f" {UNSTABLE_MARK}" if e.unstable else "")


def count(v):
    """A count per step (a mean over steps, so a float) as a whole number; None stays None."""
    return None if v is None or v != v else int(round(v))


def forward_table(df: pd.DataFrame, w: Words) -> pd.DataFrame:
    """(a) Per fp32 cell: the inference forward per the profiler, the timer, the unprofiled e2e run."""
    inf = ok(df, "inference")
    rows = []
    for r in inf.itertuples():
        e2e = r.inference_fwd_e2e
        rows.append(
            {
                "model": r.model,
                "context": r.context_length,
                f"{w.range} (ms)": r.inference_fwd_nvtx_ms,
                "timer, same process (ms)": estimate_text(r.inference_fwd_timer),
                "e2e, unprofiled (ms)": estimate_text(e2e),
                f"{w.kernel}s (ms)": r.inference_fwd_kernel_ms,
                f"{w.unit} busy": pct(r.inference_fwd_kernel_ms / r.inference_fwd_nvtx_ms),
                "profiled vs e2e": stats.compare(stats.Estimate(r.inference_fwd_nvtx_ms), e2e) if e2e else "—",
            }
        )
    return pd.DataFrame(rows)


def top_kernel_table(df: pd.DataFrame, w: Words) -> pd.DataFrame:
    """(b) Per fp32 cell: the forward's top kernel, its launches and share; forward + backward's top kernel."""
    inf = ok(df, "inference")
    return pd.DataFrame(
        {
            "model": inf.model,
            "context": inf.context_length,
            f"top forward {w.kernel}": [short(k) for k in inf.inference_fwd_top_kernel],
            f"{w.launches} / forward": [count(v) for v in inf.inference_fwd_top_launches],
            "share of forward": [pct(v) for v in inf.inference_fwd_top_share],
            f"{w.kernel}s / forward": [count(v) for v in inf.inference_fwd_launches],
            f"top forward + backward {w.kernel}": [
                "out of memory" if not isinstance(fb, str) else "same" if fb == f else short(fb)
                for fb, f in zip(inf.fb_top_kernel, inf.inference_fwd_top_kernel)
            ],
            "its share of forward + backward": [pct(v) for v in inf.get("fb_top_share", [None] * len(inf))],
        }
    )


def bf16_table(df: pd.DataFrame, w: Words) -> pd.DataFrame:
    """(b) Per bf16 cell, beside the fp32 cell of the same size and context."""
    pairs = ok(df, "inference", "bf16").merge(
        ok(df, "inference", "fp32"), on=["model", "context_length"], suffixes=("", "_fp32")
    )
    return pd.DataFrame(
        {
            "model": pairs.model,
            "context": pairs.context_length,
            f"top {w.kernel}, bf16": [short(k) for k in pairs.inference_fwd_top_kernel],
            "top matmul, bf16": [short(k) for k in pairs.inference_fwd_top_matmul],
            "matmul share, bf16": [pct(v) for v in pairs.inference_fwd_matmul_share],
            "matmul share, fp32": [pct(v) for v in pairs.inference_fwd_matmul_share_fp32],
            f"forward {w.kernel}s, bf16 (ms)": pairs.inference_fwd_kernel_ms,
            f"forward {w.kernel}s, fp32 (ms)": pairs.inference_fwd_kernel_ms_fp32,
            "bf16 vs fp32": [
                stats.compare(stats.Estimate(b), stats.Estimate(f))
                for b, f in zip(pairs.inference_fwd_kernel_ms, pairs.inference_fwd_kernel_ms_fp32)
            ],
        }
    )


def non_matmul_table(kernels: pd.DataFrame, cells: int, w: Words) -> pd.DataFrame:
    """(c) The non-matmul kernels above the share, with in how many cells and how large."""
    return pd.DataFrame(
        {
            w.kernel: [f"`{k}`" for k in kernels.label],
            "class": kernels["class"],
            f"cells (of {cells})": kernels.cells,
            "median share": [pct(v) for v in kernels.median_share],
            "largest share": [pct(v) for v in kernels.max_share],
        }
    )


def training_table(df: pd.DataFrame, w: Words) -> pd.DataFrame:
    """(d) Per fp32 cell with both records: class shares of the training step against the inference forward."""
    both = ok(ok(df, "inference"), "training")
    table = pd.DataFrame(
        {
            "model": both.model,
            "context": both.context_length,
            "matmul, inference": [pct(v) for v in both.inference_fwd_matmul_share],
            "matmul, training step": [pct(v) for v in both.train_matmul_share],
        }
    )
    for cls in ("elementwise", "reduction", "optimizer"):
        table[f"{cls}, training step"] = [pct(s.get(cls)) for s in both.train_class_share]
    if "att_softmax_ms" in both:
        table[f"attention softmax ({w.range}), inference"] = [
            pct(a / k) if k else "—" for a, k in zip(both.att_softmax_ms, both.inference_fwd_kernel_ms)
        ]
    table[f"{w.kernel}s / step"] = [count(v) for v in both.train_launches]
    return table


def attention_table(df: pd.DataFrame, w: Words) -> pd.DataFrame:
    """(e) Per inference cell with the attention ranges: the softmax against the two matmuls."""
    rows = attention_rows(df)
    return pd.DataFrame(
        {
            "model": rows.model,
            "context": rows.context_length,
            "precision": rows.precision,
            "QKᵀ matmul (ms)": rows.att_scores_matmul_ms,
            "softmax (ms)": rows.att_softmax_ms,
            "PV matmul (ms)": rows.att_final_matmul_ms,
            "softmax / matmuls, time": rows.softmax_over_matmul_time,
            "softmax / matmuls, FLOPs": rows.softmax_over_matmul_flops,
        }
    )


def _flat(value, name: str, estimate: bool) -> dict:
    """A cell of the frame as CSV columns: an Estimate column as its median and interval ends."""
    if not estimate:
        return {name: value}
    e = value if isinstance(value, stats.Estimate) else None
    return {f"{name}_ms": e and e.median, f"{name}_ms_low": e and e.low, f"{name}_ms_high": e and e.high}


def cells_csv(df: pd.DataFrame) -> pd.DataFrame:
    """The per-cell frame as plain numbers: Estimates as median, low, high; class-share dicts dropped."""
    rows = attention_rows(df).set_index(["model", "context_length", "precision"])
    estimates = {c for c in df.columns if any(isinstance(v, stats.Estimate) for v in df[c])}
    shares = {c for c in df.columns if any(isinstance(v, dict) for v in df[c])}
    out = []
    for row in df.to_dict("records"):
        flat: dict = {}
        for name, value in row.items():
            if name not in shares:
                flat.update(_flat(value, name, name in estimates))
        key = (row["model"], row["context_length"], row["precision"])
        if key in rows.index:
            flat["softmax_over_matmul_time"] = rows.loc[key, "softmax_over_matmul_time"]
            flat["softmax_over_matmul_flops"] = rows.loc[key, "softmax_over_matmul_flops"]
        out.append(flat)
    return pd.DataFrame(out)
