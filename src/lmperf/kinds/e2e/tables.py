"""Tables of the end-to-end report: the facts as DataFrames of strings, the CSV of every record, and
the number formats the templates share. A time prints as its median with its 95% interval over
trials (``56.2 [55.9, 56.6]``, units in the column name), † where unstable; a comparison as its ratio
and its ``stats.compare`` verdict.
"""

from __future__ import annotations

import pandas as pd

from lmperf.core.stats import Estimate
from lmperf.kinds.e2e import facts as F
from lmperf.report.common import est, md_table, num, pct

DASH, OOM = "—", "out of memory"
VERDICT_MARK = {"faster": "faster", "slower": "slower", "within noise": "≈"}
SHORT = {"forward": "fwd", "backward": "bwd", "step": "step", "inference": "inference fwd"}


def share(e: Estimate | None) -> str:
    """A fraction's estimate in percent: ``38% [35%, 41%]``; its interval kept within 0–100% (a few trials'
    interval on the log scale can pass 100%, a share cannot)."""
    if e is None:
        return DASH
    return f"{e.median:.0%}" + (f" [{max(e.low, 0):.0%}, {min(e.high, 1):.0%}]" if e.low is not None else "")


def speedup(row: F.Pair, phase: str) -> str:
    """A row's speed-up in ``phase``: ``1.55× faster`` (≈: within the noise)."""
    word = row.verdict(phase)
    return DASH if word is None else f"{est(row.speedup(phase), 2, '×')} {VERDICT_MARK[word]}"


def host(row: F.Pair, names: tuple[str, str] | None = None) -> str:
    """The ``host-bound`` column: ``host-bound`` (of a pair, which ways), ``no``, or — where not measured."""
    bound = [F.host_bound(b) for b in row.busy]
    if names is None:  # one cell: the other side
        return {True: "host-bound", False: "no", None: DASH}[bound[1]]
    if bound == [None, None]:
        return DASH
    return " and ".join(n for n, b in zip(names, bound) if b) or "no"


def md(df: pd.DataFrame) -> str:
    """A markdown table of the strings as given; columns with nothing measured (all —) left out."""
    if df.empty:
        return "_(no records)_"
    df = df.fillna(DASH).astype(str)
    return md_table(df[[c for c in df.columns if not (df[c] == DASH).all()]])


def timing_table(t: F.TimingFacts) -> pd.DataFrame:
    rows = []
    for r in t.rows:
        m, params = r.metrics, r.metrics.get("parameter_count")
        row = {"model": r.model, "parameters (M)": num(params and params / 1e6, 1), "context": str(r.context_length)}
        for phase, (_, e) in r.times.items():
            row[f"{phase} (ms, mean ± std)"] = f"{est(e)} ± {num(m.get(f'{phase}_ms_std'))}" if e else OOM
        row.update({f"{SHORT[p]} CV": pct(v) for p, v in r.cvs.items()})
        rows.append(
            {**row, "GPU busy": share(r.busy[1]), "host-bound": host(r), "MFU (train)": pct(m.get("training_step_mfu"))}
        )
    return pd.DataFrame(rows)


def warmup_table(w: F.WarmupFacts) -> pd.DataFrame:
    rows = []
    for r in w.rows:
        row = {"model": r.model, "warm-up steps": str(r.warmup_steps)}
        for phase, (_, e) in r.times.items():
            row.update({f"{phase} (ms, mean)": est(e), f"{SHORT[phase]} CV": pct(r.cvs[phase])})
            row[f"{phase} vs {w.default} warm-up"] = r.verdict(phase) or DASH
        rows.append({**row, "fwd 1st / median": num(r.first_over_median), "host-bound": host(r)})
    return pd.DataFrame(rows)


def precision_pivot(p: F.PrecisionFacts) -> pd.DataFrame:
    """Training-step speed-up from bf16 (fp32 / bf16), a row per size and a column per context."""
    cells: dict[str, dict[str, str]] = {}
    for r in p.rows:
        cells.setdefault(r.model, {"model": r.model})[f"ctx {r.context_length}"] = speedup(r, "step")
    return pd.DataFrame(list(cells.values()))


def pair_table(rows, ways: tuple[str, str], extra=lambda r: {}) -> pd.DataFrame:
    """Per row: its cell, ``extra(row)``, each phase's time either way and the speed-up, host-bound."""
    out = []
    for r in rows:
        precision = {} if "fp32" in ways else {"precision": r.precision}  # unless the precision is what differs
        row = {"model": r.model, "context": str(r.context_length), **precision, **extra(r)}
        for phase, times in r.times.items():
            row.update({f"{SHORT[phase]} {way} (ms)": est(e, missing=OOM) for way, e in zip(ways, times)})
            row[f"{SHORT[phase]} speed-up"] = speedup(r, phase)
        out.append({**row, "host-bound": host(r, ways)})
    return pd.DataFrame(out)


def compile_columns(r: F.CompileRow) -> dict:
    """pair_table's extra columns of a compiled row: the compile job's cold compile times."""
    return {f"compile, {p} (s)": num(r.cold.get(f"{p}_compile_s")) for p in ("training", "inference")}


def attention_columns(r: F.AttentionRow) -> dict:
    """pair_table's extra columns of another attention's row: which, and its training peak against plain's."""
    return {"attention": r.attention, "training peak (MiB)": num(r.peak_mib[1], 0), "peak / plain's": num(r.peak_ratio)}


def timer_table(series: dict) -> pd.DataFrame:
    rows = []
    for phase in F.TIMER_PHASES:
        devs = sorted(d for (_, p), s in series.items() if p == phase for d in s)
        if devs:
            row = {"phase": phase.replace("_", " "), f"samples over {F.TIMER_CHECK_MIN_MS:.0f} ms": str(len(devs))}
            row["median deviation (%)"] = f"{100 * devs[len(devs) // 2]:.2f}"
            rows.append({**row, "worst absolute deviation (%)": f"{100 * max(map(abs, devs)):.2f}"})
    return pd.DataFrame(rows)


def records_frame(records: list[dict]) -> pd.DataFrame:
    """One row per record: its cell, attention, status, trials and every scalar metric; an interval
    ``x_interval`` as ``x_low`` and ``x_high``; sorted as the report's tables."""
    rows = []
    for r in sorted(records, key=lambda r: (F.model_rank(r["cell"]["model"]), *r["cell"].values(), F.attention_of(r))):
        row = {**r["cell"], "attention": F.attention_of(r), "status": r["status"], "reason": r.get("reason")}
        for name, value in r["metrics"].items():
            if name.endswith("_interval") and isinstance(value, list):
                row[name.replace("_interval", "_low")], row[name.replace("_interval", "_high")] = value
            elif value is None or isinstance(value, (int, float, str, bool)):
                row[name] = value
        rows.append({**row, "trials": F.trials(r)})
    return pd.DataFrame(rows)
