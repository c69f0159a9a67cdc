"""Tables of the attention report: the CSV frames and the markdown tables the sections show.

Each markdown table is a small pivot (lengths as rows, head dimensions as columns); the CSV files
keep every column of every cell.
"""

from __future__ import annotations

import math

import pandas as pd

from lmperf.core import stats
from lmperf.kinds.attention import memory_model as memory
from lmperf.kinds.attention.facts import Growth, OomAccounting

UNSTABLE_MARK = "†"
SAME_MARK = "≈"


def sig(x: float, digits: int = 3) -> str:
    """x to about `digits` significant digits, thousands separated: 0.167, 39.2, 1,703."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def estimate_text(est: stats.Estimate | None, unit: str = "") -> str:
    """'39.2', '39.2 [38.9, 39.6]', with † where the estimate is unstable."""
    if est is None:
        return "—"
    digits = 0 if est.median == 0 else max(0, 2 - math.floor(math.log10(abs(est.median))))
    return est.format(digits, unit) + (UNSTABLE_MARK if est.unstable else "")


def human_bytes(nbytes: float) -> str:
    """'32 GiB', '2 MiB', '8 KiB' (three significant digits)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            value = nbytes / scale
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"
    return f"{nbytes:.0f} B"


def dims_text(ds) -> str:
    return "d = " + ", ".join(map(str, ds))


def md_table(df: pd.DataFrame) -> str:
    """A markdown table, every cell as written."""
    if df.empty:
        return "_(no records)_\n"
    return df.to_markdown(index=False, disable_numparse=True) + "\n"


def _pivot(df: pd.DataFrame, implementation: str, cell) -> pd.DataFrame:
    """Lengths as rows, one column per head dim, each cell `cell(row)` ('—' where there is no record)."""
    sub = df[df.implementation == implementation]
    dims = sorted(int(d) for d in sub.head_dim.unique())
    lengths = sorted(int(n) for n in sub.sequence_length.unique())
    by_cell = {(int(r["head_dim"]), int(r["sequence_length"])): r for r in sub.to_dict("records")}
    rows = []
    for n in lengths:
        row = {"N": str(n)}
        for d in dims:
            r = by_cell.get((d, n))
            row[f"d = {d}"] = cell(r) if r is not None else "—"
        rows.append(row)
    return pd.DataFrame(rows)


def _oom(r: dict) -> str | None:
    if r["status"] == "oom" and r["forward_est"] is None:
        return f"OOM ({r['oom_phase']})"
    return None


def time_cell(r: dict) -> str:
    """'forward / backward' ms per pass; a phase that ran out of memory says so."""
    oom = _oom(r)
    if oom:
        return oom
    back = estimate_text(r["backward_est"])
    if r["backward_est"] is None and r["status"] == "oom":
        back = f"OOM ({r['oom_phase']})"
    return f"{estimate_text(r['forward_est'])} / {back}"


def memory_cell(r: dict) -> str:
    """Memory before backward (MiB, the cell's own); where the forward never finished, the prediction."""
    value = r["before_backward_mib"]
    if value is not None and not pd.isna(value):
        return sig(value)
    predicted = r["predicted_before_backward_mib"]
    need = f" ({sig(predicted)} predicted)" if predicted is not None and not pd.isna(predicted) else ""
    return f"OOM{need}" if r["status"] == "oom" else "—"


def time_table(df: pd.DataFrame, implementation: str) -> pd.DataFrame:
    table = _pivot(df, implementation, time_cell)
    return table.rename(columns={c: f"{c} (ms)" for c in table.columns if c != "N"})


def memory_table(df: pd.DataFrame, implementation: str) -> pd.DataFrame:
    table = _pivot(df, implementation, memory_cell)
    return table.rename(columns={c: f"{c} (MiB)" for c in table.columns if c != "N"})


def accounting_table(acc: OomAccounting) -> pd.DataFrame:
    """Plain attention's forward, allocation by allocation, from the accounting (memory_model)."""
    rows = []
    for point in memory.timeline(memory.plain_forward_steps(acc.shape), acc.base_bytes):
        row = {
            "step": point.step.tensor,
            "what": point.step.what,
            "allocates": human_bytes(point.step.nbytes),
            "live once allocated": human_bytes(point.live_peak),
            "kept for backward": "yes" if point.step.saved else ("output" if point.step.tensor == "O" else "no"),
            "freed then": ", ".join(point.step.frees),
        }
        if acc.capacity_mib is not None:
            row["fits the card"] = "yes" if point.live_peak <= acc.capacity_mib * 2**20 else "**no**"
        rows.append(row)
    return pd.DataFrame(rows)


def fit_range_text(g: Growth) -> str:
    """'4096–16384', or one range per group of head dims where the fits used different lengths."""
    if len(g.fit_ranges) == 1:
        lo, hi, _ = g.fit_ranges[0]
        return f"{lo}–{hi}"
    return "; ".join(f"{lo}–{hi} ({dims_text(ds)})" for lo, hi, ds in g.fit_ranges)


def growth_table(growths: dict) -> pd.DataFrame:
    rows = [
        {
            "implementation": name,
            "exponent k (range over d)": f"{min(g.exponents):.2f}–{max(g.exponents):.2f}",
            "N×N matrices kept": f"{g.n2_matrices_kept:.2f}",
            "fit over N": fit_range_text(g),
            "kept at the largest N (MiB)": f"{sig(g.kept_mib_at_largest)} (N = {g.largest_n}, d = {g.largest_n_head_dim})",
        }
        for name, g in growths.items()
    ]
    return pd.DataFrame(rows)


def _speedup_cell(r: dict, phase: str) -> str:
    speed = r[f"{phase}_speedup"]
    if speed is None or pd.isna(speed):
        return "—"
    low, high = r[f"{phase}_speedup_low"], r[f"{phase}_speedup_high"]
    text = f"{speed:.2f}×" + (f" [{low:.2f}, {high:.2f}]" if low is not None and not pd.isna(low) else "")
    return (SAME_MARK + text) if r[f"{phase}_verdict"] == "within noise" else text


def compile_table(table: pd.DataFrame) -> pd.DataFrame:
    """Speed-up of compiled over plain, 'forward / backward', lengths as rows and head dims as columns."""
    if table.empty:
        return table
    dims = sorted(int(d) for d in table.head_dim.unique())
    compared = table.dropna(subset=["forward_speedup", "backward_speedup"], how="all")
    rows = []
    for n, group in compared.groupby("sequence_length"):
        by_d = {int(r["head_dim"]): r for r in group.to_dict("records")}
        row = {"N": str(int(n))}
        for d in dims:
            r = by_d.get(d)
            row[f"d = {d} (speed-up)"] = (
                f"{_speedup_cell(r, 'forward')} / {_speedup_cell(r, 'backward')}" if r is not None else "—"
            )
        rows.append(row)
    return pd.DataFrame(rows)


def csv_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The per-cell CSV: every column but the estimate objects."""
    return df.drop(columns=[c for c in df.columns if c.endswith("_est")])
