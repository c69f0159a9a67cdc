"""The flash records as flat tables: one row per correctness entry, per benchmark cell, per
leaderboard timing. These are the CSVs the sections link to; the facts read the records."""

from __future__ import annotations

import pandas as pd

from lmperf.core import stats

TENSORS = ("O", "L", "dQ", "dK", "dV")
PASSES = ("forward", "backward", "forward_backward")
PRECISION_ORDER = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3}

ENTRY_COLUMNS = (
    "precision",
    "head_dim",
    "causal",
    "batch",
    "n_queries",
    "n_keys",
    "seed",
    "course",
    "status",
    *(f"{t}_rel_error" for t in TENSORS),
    "tolerance_o_l",
    "tolerance_grad",
    "saved_tensor_count",
    "saved_l_shaped_count",
    "saved_l_dtype",
    "saved_contract_ok",
    "output_dtype_ok",
    "failed_checks",
    "message",
    "entry_wall_s",
)


BENCH_COLUMNS = (
    "precision",
    "head_dim",
    "sequence_length",
    "implementation",
    "status",
    "reason",
    "sdpa_backend",
    *(f"{p}_ms{end}" for p in PASSES for end in ("", "_low", "_high")),
    "trials",
    *(f"{p}_tflops" for p in PASSES),
    *(f"speedup_vs_plain_{p}" for p in PASSES),
    "peak_allocated_mib",
    "tiles",
)


def split(records: list[dict]) -> dict[str, list[dict]]:
    """The records by part: correctness, benchmark, leaderboard."""
    out: dict[str, list[dict]] = {"correctness": [], "benchmark": [], "leaderboard": []}
    for r in records:
        out.setdefault(r["cell"].get("test", "other"), []).append(r)
    return out


def correctness_frame(records: list[dict]) -> pd.DataFrame:
    """One row per correctness entry of every implementation's record."""
    rows = []
    for r in records:
        m = r["metrics"]
        for e in m.get("entries_detail") or []:
            row = {"implementation": r["cell"]["implementation"], "kernel_mode": m.get("kernel_mode")}
            row.update({k: e.get(k) for k in ENTRY_COLUMNS})
            row["failed_checks"] = "; ".join(e.get("failed_checks") or [])
            rows.append(row)
    return pd.DataFrame(rows, columns=["implementation", "kernel_mode", *ENTRY_COLUMNS])


def _time_columns(record: dict) -> dict:
    """Each pass's median over trials and, when the record has trials, its 95% interval."""
    out = {}
    for p in PASSES:
        est = stats.metric(record, f"{p}_ms_median")
        out[f"{p}_ms"] = None if est is None else est.median
        out[f"{p}_ms_low"] = None if est is None else est.low
        out[f"{p}_ms_high"] = None if est is None else est.high
    out["trials"] = len(record["metrics"].get("trials") or []) or 1
    return out


def _tiles_label(tiles) -> str | None:
    if not isinstance(tiles, dict):
        return None
    parts = []
    for kernel, choice in tiles.items():
        cfg = (choice or {}).get("config") or {}
        if "BLOCK_M" in cfg:
            parts.append(f"{kernel}:{cfg['BLOCK_M']}x{cfg['BLOCK_N']}/{choice.get('source', '?')}")
    return " ".join(parts) or None


def bench_frame(records: list[dict]) -> pd.DataFrame:
    """One row per benchmark cell (implementation × precision × head dim × length)."""
    rows = []
    for r in records:
        c, m = r["cell"], r["metrics"]
        row = {k: c.get(k) for k in ("precision", "head_dim", "sequence_length", "implementation")}
        row.update(status=r["status"], reason=r.get("reason"), sdpa_backend=m.get("sdpa_backend"))
        row.update(_time_columns(r))
        row.update({f"{p}_tflops": m.get(f"{p}_tflops") for p in PASSES})
        row.update({f"speedup_vs_plain_{p}": m.get(f"speedup_vs_plain_{p}") for p in PASSES})
        row.update(peak_allocated_mib=m.get("peak_allocated_mib"), tiles=_tiles_label(m.get("tiles")))
        rows.append(row)
    df = pd.DataFrame(rows, columns=list(BENCH_COLUMNS))
    if df.empty:
        return df
    df["_p"] = df.precision.map(PRECISION_ORDER)
    order = ["_p", "head_dim", "sequence_length", "implementation"]
    return df.sort_values(order).drop(columns="_p").reset_index(drop=True)


def leaderboard_frame(records: list[dict]) -> pd.DataFrame:
    """The protocol's timings (torch.compile, per head dim) and the eager side-by-side rows."""
    rows = []
    for r in records:
        m = r["metrics"]
        shape = m.get("leaderboard_shape") or {}
        by_dim = m.get("protocol_by_head_dim") or {str(shape.get("head_dim")): m.get("protocol") or {}}
        for d, results in by_dim.items():
            for impl, res in results.items():
                if not isinstance(res, dict):
                    continue  # the ratios stored beside the implementations
                est = stats.metric({"metrics": res}, "forward_backward_ms_median")
                rows.append(
                    {
                        "table": "protocol",
                        "implementation": impl,
                        "head_dim": int(d),
                        "batch_size": shape.get("batch"),
                        "sequence_length": shape.get("seq"),
                        "precision": shape.get("dtype"),
                        "status": res.get("status"),
                        "forward_backward_ms": None if est is None else est.median,
                        "forward_backward_ms_low": None if est is None else est.low,
                        "forward_backward_ms_high": None if est is None else est.high,
                        "error": res.get("error"),
                    }
                )
        for row in m.get("side_by_side") or []:
            rows.append({"table": "eager", **{k: v for k, v in row.items() if k != "tiles"}})
    return pd.DataFrame(rows)
