"""Tables of the end-to-end report: the facts as DataFrames, markdown and CSV, and the number and
text formats its templates share.

A time prints as its median with the 95% interval over trials where the record has one
(``56.2 [55.9, 56.6]``, units in the column name) and a † where that interval is wider than the
unstable margin; a comparison prints as its ratio and its ``stats.compare`` verdict.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from lmperf.core.stats import UNSTABLE_WIDTH, Estimate
from lmperf.kinds.e2e import facts as F

DASH = "—"
OOM = "out of memory"
UNSTABLE_NOTE = f"† unstable: the 95% interval over trials is wider than {100 * UNSTABLE_WIDTH:.0f}% of the median."
SHORT = {"forward": "fwd", "backward": "bwd"}
VERDICT_MARK = {"faster": "faster", "slower": "slower", "within noise": "≈"}


def num(x: float | None, digits: int | None = None) -> str:
    """A number for prose and tables: 2 decimals under 10, 1 under 100, none above (thousands separated)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return DASH
    if digits is None:
        digits = 2 if abs(x) < 10 else 1 if abs(x) < 100 else 0
    return f"{x:,.{digits}f}"


def pct(x: float | None, digits: int = 1) -> str:
    return DASH if x is None else f"{100 * x:.{digits}f}%"


def est(e: Estimate | None, digits: int | None = None, unit: str = "") -> str:
    """``56.2 [55.9, 56.6]`` (no brackets for one trial), † where unstable; ``unit`` follows the median."""
    if e is None:
        return DASH
    text = num(e.median, digits) + unit
    if e.low is not None and e.high is not None:
        text += f" [{num(e.low, digits)}, {num(e.high, digits)}]"
    return text + (" †" if e.unstable else "")


def share(e: Estimate | None) -> str:
    """A fraction's estimate in percent: ``38% [35, 41]``."""
    if e is None:
        return DASH
    scaled = {k: None if v is None else 100 * v for k, v in (("low", e.low), ("high", e.high))}
    return est(dataclasses.replace(e, median=100 * e.median, **scaled), 0, "%")


def span(values, unit: str = "×", digits: int | None = 2) -> str:
    """``1.11×–1.84×`` over values, one value where both ends print the same."""
    values = list(values)
    lo, hi = num(min(values), digits), num(max(values), digits)
    return f"{lo}{unit}" if lo == hi else f"{lo}{unit}–{hi}{unit}"


def verdict_cell(e: Estimate | None, verdict: str | None) -> str:
    """``1.55× faster`` (≈ within the noise)."""
    return DASH if e is None or verdict is None else f"{est(e, 2, '×')} {VERDICT_MARK[verdict]}"


# -- text -----------------------------------------------------------------------------------------


def blocks(*parts: str) -> str:
    """Markdown blocks separated by one blank line, empty parts dropped, ending in one newline."""
    return "\n\n".join(p.strip("\n") for p in parts if p and p.strip("\n")) + "\n"


def sentence(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def names(labels) -> str:
    """'a', 'a and b', 'a, b and c'."""
    labels = list(labels)
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def md(df: pd.DataFrame) -> str:
    """A markdown table of strings as given (no re-reading of numbers)."""
    if df.empty:
        return "_(no records)_"
    return df.astype(object).where(df.notna(), DASH).astype(str).to_markdown(index=False, disable_numparse=True)


def unstable_note(df: pd.DataFrame) -> str:
    return UNSTABLE_NOTE if df.astype(str).apply(lambda c: c.str.contains("†")).any().any() else ""


def drop_empty(df: pd.DataFrame) -> pd.DataFrame:
    """Leave out columns with nothing measured (peak memory, MFU or GPU busy on a CPU, say)."""
    return df[[c for c in df.columns if not (df[c].astype(str) == DASH).all()]]


# -- per section ------------------------------------------------------------------------------------


def timing_table(t: F.TimingFacts) -> pd.DataFrame:
    rows = []
    for r in t.rows:
        row = {"model": r.model, "parameters (M)": num(r.parameters / 1e6, 1) if r.parameters else DASH}
        row["context"] = str(r.context_length)
        for phase in F.STEP_PHASES:
            e, std = r.times[phase], r.std[phase]
            row[f"{phase} (ms, mean ± std)"] = f"{est(e)} ± {num(std)}" if e else OOM
        row.update({f"{SHORT[p]} CV": pct(r.cvs[p]) for p in F.STEP_PHASES})
        row.update({"GPU busy": share(r.busy), "MFU (train)": pct(r.mfu)})
        rows.append(row)
    return drop_empty(pd.DataFrame(rows))


def warmup_table(w: F.WarmupFacts) -> pd.DataFrame:
    rows = []
    for r in w.rows:
        row = {"model": r.model, "warm-up steps": str(r.warmup_steps)}
        for phase in F.STEP_PHASES:
            row[f"{phase} (ms, mean)"] = est(r.times[phase][1])
            row[f"{SHORT[phase]} CV"] = pct(r.cvs[phase])
            if phase == "forward":
                row["fwd 1st / median"] = num(r.firsts[phase])
            row[f"{phase} vs {w.default} warm-up"] = DASH if r.warmup_steps == w.default else r.verdict(phase) or DASH
        rows.append(row)
    return pd.DataFrame(rows)


def precision_pivot(p: F.PrecisionFacts) -> pd.DataFrame:
    """Training-step speed-up from bf16 (fp32 / bf16), a row per size and a column per context."""
    cells: dict[str, dict[str, str]] = {}
    for r in p.rows:
        cell = verdict_cell(r.speedup("step"), r.verdict("step"))
        cells.setdefault(r.model, {"model": r.model})[f"ctx {r.context_length}"] = cell
    return pd.DataFrame(list(cells.values()))


def precision_table(p: F.PrecisionFacts) -> pd.DataFrame:
    rows = []
    for r in p.rows:
        row = {"model": r.model, "context": str(r.context_length)}
        for phase, word in (("forward", "fwd"), ("backward", "bwd"), ("step", "step")):
            fp32, bf16 = r.times[phase]
            row[f"{word} fp32 (ms)"], row[f"{word} bf16 (ms)"] = est(fp32), est(bf16)
            row[f"{word} speed-up"] = verdict_cell(r.speedup(phase), r.verdict(phase))
        rows.append(row)
    return pd.DataFrame(rows)


def compile_table(c: F.CompileFacts) -> pd.DataFrame:
    rows = []
    for r in c.rows:
        (inf_eager, inf_comp), (step_eager, step_comp) = r.times["inference"], r.times["step"]
        rows.append(
            {
                "model": r.model,
                "context": str(r.context_length),
                "precision": r.precision,
                "inference fwd eager (ms)": est(inf_eager),
                "inference fwd compiled (ms)": est(inf_comp),
                "inference speed-up": verdict_cell(r.speedup("inference"), r.verdict("inference")),
                "train step eager (ms)": est(step_eager) if step_eager else OOM,
                "train step compiled (ms)": est(step_comp) if step_comp else OOM,
                "step speed-up": verdict_cell(r.speedup("step"), r.verdict("step")),
                "compile, training (s)": num(r.cold_training_s),
                "compile, no-grad (s)": num(r.cold_inference_s),
            }
        )
    return drop_empty(pd.DataFrame(rows))


def timer_table(t: F.TimerFacts) -> pd.DataFrame:
    rows = []
    for phase in F.TIMER_PHASES:
        series = [devs for _, p, devs in t.series if p == phase]
        if not series:
            continue
        devs = sorted(d for s in series for d in s)
        rows.append(
            {
                "phase": phase.replace("_", " "),
                f"samples over {F.TIMER_CHECK_MIN_MS:.0f} ms": str(len(devs)),
                "median deviation (%)": f"{100 * devs[len(devs) // 2]:.2f}",
                "worst absolute deviation (%)": f"{100 * max(abs(d) for d in devs):.2f}",
            }
        )
    return pd.DataFrame(rows)


def attention_table(rows: tuple[F.AttentionRow, ...]) -> pd.DataFrame:
    out = []
    for r in rows:
        other = r.attention != "plain"
        out.append(
            {
                "model": r.model,
                "context": str(r.context_length),
                "precision": r.precision,
                "attention": r.attention,
                "training step (ms)": est(r.times["step"][1]) if r.times["step"][1] else OOM,
                "inference forward (ms)": est(r.times["inference"][1]),
                "speed-up over plain": verdict_cell(r.speedup("step"), r.verdict("step")) if other else DASH,
                "training peak (MiB)": num(r.peak_mib[1], 0),
                "peak / plain's": num(r.peak_ratio, 2) if other else DASH,
            }
        )
    return drop_empty(pd.DataFrame(out))


# -- the CSV files ----------------------------------------------------------------------------------

CELL_COLUMNS = ("model", "context_length", "precision", "compile", "warmup_steps")


def records_frame(records: list[dict]) -> pd.DataFrame:
    """One row per record: its cell, attention, status and every scalar metric; an interval metric
    ``x_interval`` as ``x_low`` and ``x_high``; sorted as the report's tables."""
    rows = []
    for r in records:
        row = {**r["cell"], "attention": F.attention_of(r), "status": r["status"], "reason": r.get("reason")}
        for name, value in r["metrics"].items():
            if name.endswith("_interval") and isinstance(value, list) and len(value) == 2:
                row[f"{name.removesuffix('_interval')}_low"], row[f"{name.removesuffix('_interval')}_high"] = value
            elif value is None or isinstance(value, (int, float, str, bool)):
                row[name] = value
        row["compile_scope"] = F.compile_scope(r) if r["cell"].get("compile") == "compiled" else None
        row["trials"] = F.trials(r)
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=[*CELL_COLUMNS, "attention", "status"])
    rows.sort(key=lambda row: (F.model_rank(row["model"]), *((v is None, v or 0) for v in _coords(row))))
    return pd.DataFrame(rows)


def _coords(row: dict) -> tuple:
    return (*(row.get(c) for c in CELL_COLUMNS[1:]), row["attention"])
