"""Tables of the speed-ladder report, built from its facts: the CSV of every rung, the best rung of
each ladder, every rung per context, the GEMM ceilings and the profile's top kernels."""

from __future__ import annotations

import math

import pandas as pd

from lmperf.core import stats
from lmperf.core.stats import Estimate
from lmperf.kinds.ladder.bounds import Ceiling, Profile
from lmperf.kinds.ladder.facts import Ladder, Rung, Yardstick, alternative_of, model_rank, yardsticks

UNSTABLE_MARK = "†"
STATUS_WORDS = {"oom": "OOM", "unsupported": "n/a"}


def fmt(x, digits: int | None = None) -> str:
    """A number for prose and tables: 0 decimals from 100, 1 from 10, else 2; '—' for none."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if digits is None:
        digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
    return f"{x:,.{digits}f}"


def pct(x, digits: int = 1) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}%"


def est(e: Estimate | None, unit: str = "", mark: bool = True) -> str:
    """'56.2 ms [55.9, 56.6]' (the value alone for one trial), † where the interval is wide."""
    if e is None:
        return "—"
    digits = 0 if abs(e.median) >= 100 else 1 if abs(e.median) >= 10 else 2
    return e.format(digits, unit) + (f" {UNSTABLE_MARK}" if mark and e.unstable else "")


def times(e: Estimate | None) -> str:
    """A ratio: '1.59×' or '1.59× [1.52, 1.66]'."""
    if e is None:
        return "—"
    text = f"{e.median:.2f}×"
    return text + (f" [{e.low:.2f}, {e.high:.2f}]" if e.low is not None else "")


def md_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "_(no records)_\n"
    shown = df.copy()
    for col in shown.columns:
        shown[col] = [fmt(v) if isinstance(v, float) else v for v in shown[col]]
    return shown.to_markdown(index=False, disable_numparse=True) + "\n"


def unstable_note() -> str:
    return (
        f"{UNSTABLE_MARK} unstable: the 95% interval over trials is wider than "
        f"{pct(stats.UNSTABLE_WIDTH, 0)} of the median."
    )


# -- the CSV: every rung ---------------------------------------------------------------------------


def rung_row(ladder: Ladder, rung: Rung, keys: list[str]) -> dict:
    steps = {s.rung: s for s in (*ladder.chain, *ladder.not_kept)}
    on_chain = {s.rung for s in ladder.chain} | ({ladder.start.name} if ladder.start else set())
    step = steps.get(rung.name)
    e = rung.step_ms
    return {
        "model": rung.model,
        "context_length": rung.context_length,
        "rung": rung.name,
        "rung_index": rung.index,
        "status": rung.status,
        "reason": rung.reason,
        "parent": rung.parent,
        "change": rung.change,
        "kept": rung.name in on_chain if rung.ok else None,
        "against_parent": step.verdict if step else None,
        **{f"config_{k}": v for k, v in rung.config.items()},
        "attention_kernel": rung.attention_kernel,
        "flop_convention": rung.flop_convention,
        "step_statistic": rung.step_statistic,
        "step_ms": e.median if e else None,
        "step_ms_low": e.low if e else None,
        "step_ms_high": e.high if e else None,
        "step_trials": e.trials if e else None,
        "step_unstable": e.unstable if e else None,
        "tokens_per_step": rung.tokens_per_step,
        "tokens_per_s": rung.tokens_per_s if rung.ok else None,
        "us_per_token": rung.us_per_token.median if rung.ok else None,
        "compile_s": rung.compile_s,
        "first_step_s": rung.first_step_s,
        "peak_allocated_gib": rung.peak_gib,
        "step_flops": rung.step_flops,
        **{k: rung.mfu.get(k) for k in keys},
        "rung_wall_s": rung.wall_s,
    }


def rung_frame(ladders: list[Ladder]) -> pd.DataFrame:
    keys = sorted({k for ladder in ladders for r in ladder.rungs for k in r.mfu})
    return pd.DataFrame([rung_row(ladder, r, keys) for ladder in ladders for r in ladder.rungs])


# -- the best rung of each ladder ------------------------------------------------------------------


def mfu_columns(ladders: list[Ladder], head: Yardstick | None) -> list[Yardstick]:
    """The yardsticks of the sizes table: every common one the best rungs give, and the headline's
    twin counted with causal attention half."""
    bests = [ladder.best for ladder in ladders if ladder.best]
    common = [y for y in yardsticks(bests) if y.precision and not y.alternative]
    twin = alternative_of(head, bests)
    return common + ([twin] if twin else []) if common else yardsticks(bests)


def sizes_table(ladders: list[Ladder], head: Yardstick | None) -> pd.DataFrame:
    columns = mfu_columns(ladders, head)
    rows = []
    for ladder in ladders:
        best = ladder.best
        row = {"model": ladder.model, "context": ladder.context_length}
        row["first rung that runs"] = f"`{ladder.start.name}`" if ladder.start else "—"
        row["best rung"] = f"`{best.name}`" if best else "—"
        row["batch"] = best.batch_words if best else "—"
        row["step (ms)"] = est(best.step_ms) if best else "—"
        row["tokens/s"] = fmt(best.tokens_per_s, 0) if best else "—"
        row["speed-up"] = times(ladder.speedup)
        for y in columns:
            row[f"{y.column} (%)"] = pct(best.mfu.get(y.key)) if best else "—"
        row["peak (GiB)"] = fmt(best.peak_gib) if best else "—"
        row["ladder wall time (s)"] = fmt(ladder.wall_s, 0)
        rows.append(row)
    df = pd.DataFrame(rows)
    return df[[c for c in df.columns if not (df[c] == "—").all()]]  # no column without data


# -- every rung, per context -----------------------------------------------------------------------


def rung_cell(rung: Rung | None, head: Yardstick | None) -> str:
    if rung is None:
        return "—"
    if not rung.ok:
        return STATUS_WORDS.get(rung.status, rung.status)
    mfu = rung.mfu.get(head.key) if head else None
    return est(rung.step_ms, "ms") + (f" ({pct(mfu)})" if mfu is not None else "")


def rung_order(ladders: list[Ladder]) -> list[str]:
    """Rung names by their median position in the ladders, then by name (unknown rungs included)."""
    positions: dict[str, list[float]] = {}
    for ladder in ladders:
        for r in ladder.rungs:
            positions.setdefault(r.name, []).append(r.index)
    return sorted(positions, key=lambda n: (sorted(positions[n])[len(positions[n]) // 2], n))


def pivot_table(ladders: list[Ladder], context_length: int, head: Yardstick | None) -> pd.DataFrame:
    here = sorted((la for la in ladders if la.context_length == context_length), key=lambda la: model_rank(la.model))
    rows = []
    for name in rung_order(here):
        row = {"rung": f"`{name}`"}
        for ladder in here:
            row[ladder.model] = rung_cell(next((r for r in ladder.rungs if r.name == name), None), head)
        rows.append(row)
    return pd.DataFrame(rows)


def compile_table(ladders: list[Ladder]) -> pd.DataFrame:
    """Compile time of every rung that records one, apart from its step time."""
    rows = [
        {
            "model": r.model,
            "context": r.context_length,
            "rung": f"`{r.name}`",
            "compile (s)": fmt(r.compile_s),
            "first step (s)": fmt(r.first_step_s),
            "step (ms)": est(r.step_ms),
        }
        for ladder in ladders
        for r in ladder.rungs
        if r.ok and r.compile_s is not None
    ]
    return pd.DataFrame(rows)


# -- ceilings and the profile ----------------------------------------------------------------------


def ceilings_table(ceilings: list[Ceiling]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "precision": c.precision,
                "best square GEMM (TFLOP/s)": fmt(c.tflops),
                "at N": c.best_n if c.best_n is not None else "—",
                "datasheet dense (TFLOP/s)": fmt(c.datasheet_tflops),
                "share of datasheet": pct(c.share_of_datasheet),
            }
            for c in ceilings
        ]
    )


def kernels_table(profile: Profile) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "kernel": f"`{k['name']}`",
                "class": k.get("class", "—"),
                "ms per step": fmt(k["ms"] / profile.steps) if "ms" in k else "—",
                "share of kernel time": pct(k.get("share")),
            }
            for k in profile.top_kernels
        ]
    )
