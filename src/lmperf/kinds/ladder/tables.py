"""Tables of the speed-ladder report, from its facts."""

from __future__ import annotations

import math

import pandas as pd

from lmperf.kinds.ladder.bounds import Ceiling, Profile
from lmperf.kinds.ladder.facts import YARDSTICKS, Fp8Gain, Ladder, Rung, yardsticks
from lmperf.report.common import VERDICT_WORDS, est, model_rank, pct, times
from lmperf.report.common import num as fmt

STATUS_WORDS = {"oom": "OOM", "unsupported": "n/a"}


def column(key: str) -> str:
    """'mfu_datasheet_bf16' -> 'MFU bf16 datasheet (%)'."""
    _, ceiling, precision = key.split("_")
    return f"MFU {precision} {ceiling} (%)"


def rung_frame(ladders: list[Ladder]) -> pd.DataFrame:
    """Every rung, with reasons, configurations and every MFU the records give (the CSV)."""
    rows = []
    for ladder in ladders:
        steps = {s.rung: s for s in (*ladder.chain, *ladder.off_chain)}
        for r in ladder.rungs:
            e, step = r.step_ms, steps.get(r.name)
            row = {"model": r.model, "context_length": r.context_length, "rung": r.name, "rung_index": r.index}
            row |= {"status": r.status, "reason": r.reason, "parent": r.parent, "change": r.change}
            row |= {"kept": r.kept, "against_parent": step.verdict if step else None}
            row |= {f"config_{k}": v for k, v in r.config.items()}
            row |= {"attention_kernel": r.attention_kernel, "flop_convention": r.flop_convention}
            row |= {"step_ms": e and e.median, "step_ms_low": e and e.low, "step_ms_high": e and e.high}
            row |= {"step_trials": e and e.trials, "tokens_per_step": r.tokens_per_step}
            row |= {"tokens_per_s": r.tokens_per_s if r.ok else None, "compile_s": r.compile_s}
            row |= {"first_step_s": r.first_step_s, "peak_allocated_gib": r.peak_gib, "step_flops": r.step_flops}
            rows.append(row | {k: r.mfu.get(k) for k in YARDSTICKS} | {"rung_wall_s": r.wall_s})
    return pd.DataFrame(rows)


def sizes_table(ladders: list[Ladder]) -> pd.DataFrame:
    """The best rung of each ladder, against the first rung that runs."""
    keys = yardsticks([la.best for la in ladders if la.best])
    rows = []
    for la in ladders:
        b, row = la.best, {"model": la.model, "context": la.context_length}
        if b:  # a ladder with a best rung has a start and a speed-up; one without is all '—' but its wall time
            batch, accum = b.config.get("batch_size"), b.config.get("accumulation_steps") or 1
            batch = "—" if batch is None else f"{batch}" + (f"×{accum}" if accum > 1 else "")
            row |= {"first rung that runs": f"`{la.start.name}`", "best rung": f"`{b.name}`", "batch": batch}
            row |= {
                "step (ms)": est(b.step_ms),
                "tokens/s": fmt(b.tokens_per_s, 0),
                "speed-up": times(la.speedup, mark=True),
            }
            row |= {column(k): pct(b.mfu.get(k)) for k in keys} | {"peak (GiB)": fmt(b.peak_gib)}
        rows.append(row | {"ladder wall time (s)": fmt(sum(r.wall_s for r in la.rungs), 0)})
    df = pd.DataFrame(rows, columns=list(max(rows, key=len))).fillna("—")
    return df[[c for c in df.columns if not (df[c] == "—").all()]]  # no column without data


def fp8_table(gains: list[Fp8Gain], head: str | None) -> list[dict]:
    """Each ladder's fastest FP8 rung beside its fastest bf16 rung; MFU against ``head`` (bf16-equivalent)."""
    rows = []
    for g in gains:
        row = {"model": g.model, "context": g.context_length, "bf16 rung": f"`{g.bf16.name}`"}
        row |= {"bf16 tokens/s": fmt(g.bf16.tokens_per_s, 0), "FP8 rung": f"`{g.fp8.name}`"}
        row |= {"FP8 tokens/s": fmt(g.fp8.tokens_per_s, 0), "FP8 ÷ bf16": times(g.speedup, mark=True)}
        row["verdict"] = VERDICT_WORDS[g.verdict]
        if head:
            row |= {"bf16 MFU (%)": pct(g.bf16.mfu.get(head)), "FP8 MFU (%)": pct(g.fp8.mfu.get(head))}
        rows.append(row)
    return rows


def rung_cell(rung: Rung | None, head: str | None) -> str:
    if rung is None:
        return "—"
    if not rung.ok:
        return STATUS_WORDS.get(rung.status, rung.status)
    mfu = rung.mfu.get(head)
    return est(rung.step_ms, unit=" ms") + (f" ({pct(mfu)})" if mfu is not None else "")


def pivot_table(ladders: list[Ladder], context_length: int, head: str | None) -> list[dict]:
    """Rungs (rows, by median position; not one unsupported in all) by model (columns) at one context length."""
    here = sorted((la for la in ladders if la.context_length == context_length), key=lambda la: model_rank(la.model))
    positions: dict[str, list[float]] = {}
    for r in (r for la in here for r in la.rungs if r.status != "unsupported"):
        positions.setdefault(r.name, []).append(r.index)
    order = sorted(positions, key=lambda n: (sorted(positions[n])[len(positions[n]) // 2], n))
    named = [(la.model, {r.name: r for r in la.rungs}) for la in here]
    return [
        {"rung": f"`{name}`"} | {model: rung_cell(rungs.get(name), head) for model, rungs in named} for name in order
    ]


def compile_table(ladders: list[Ladder]) -> list[dict]:
    """Compile time of every rung that records one, apart from its step time."""
    return [
        {"model": r.model, "context": r.context_length, "rung": f"`{r.name}`", "compile (s)": fmt(r.compile_s)}
        | {"first step (s)": fmt(r.first_step_s), "step (ms)": est(r.step_ms)}
        for la in ladders
        for r in la.rungs
        if r.ok and r.compile_s is not None
    ]


def ceilings_table(ceilings: list[Ceiling]) -> list[dict]:
    return [
        {"precision": c.precision, "best square GEMM (TFLOP/s)": fmt(c.tflops), "at N": c.best_n or "—"}
        | {"datasheet dense (TFLOP/s)": fmt(c.datasheet_tflops), "share of datasheet": pct(c.share_of_datasheet)}
        for c in ceilings
    ]


def kernels_table(profile: Profile) -> list[dict]:
    return [
        {"kernel": f"`{k['name']}`", "class": k.get("class", "—")}
        | {"ms per step": fmt(k.get("ms", math.nan) / profile.steps), "share of kernel time": pct(k.get("share"))}
        for k in profile.top_kernels
    ]
