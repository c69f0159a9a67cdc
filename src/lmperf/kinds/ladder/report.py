"""Report of the speed ladder: from the course's step to the best rung, with the measured GEMM ceilings
and the best rung's profile: ``tables/ladder.csv``, a waterfall per (model, context) and the section.
Facts (``facts``, ``bounds``) -> ``tables`` and ``figures`` -> the templates here. No torch.
"""

from __future__ import annotations

from pathlib import Path

from lmperf.core import stats
from lmperf.kinds.ladder import facts as F
from lmperf.kinds.ladder import figures
from lmperf.kinds.ladder import tables as T
from lmperf.kinds.ladder.bounds import OVERLAP, Ceiling, Profile, at_ceiling_ms, ceilings_from
from lmperf.kinds.ladder.grid import ladders as grid_ladders
from lmperf.report import common as C
from lmperf.report.common import count as plural

SECTIONS = ["speed_ladder"]
ALSO_READS = ("gemm_peak", "ladder_profile")
CSV = "tables/ladder.csv"
STATUS_WORDS = {"oom": "out of memory", "unsupported": "cannot run here"}


def jobs(grid: dict) -> list[tuple[str, int]]:
    """(model, context) of every ladder the grid asks for."""
    return grid_ladders(grid) if grid.get("models") else []


def figure_path(model: str, context_length: int) -> str:
    return f"figures/ladder_{model}_ctx{context_length}.png"


def outputs(grid: dict) -> list[str]:
    return [CSV, *(figure_path(m, c) for m, c in jobs(grid))]


def image(device: str, model: str, context_length: int, drawn: set) -> str:
    if (model, context_length) not in drawn:
        return ""
    return f"![{model} at context {context_length}: time per token by rung]({C.link(device, figure_path(model, context_length))})"


def answer_text(a: F.Answer, head: str | None) -> str:
    """The answer first: speed-up range, the highest MFU, where the gains come from, compile time."""
    if a.ran == 0:
        return f"No rung of the {plural(a.ladders, 'ladder')} ran here (out of memory or cannot run here)."
    s = []
    if a.slowest is not None:
        lo, hi = a.slowest, a.fastest
        ends = [f"{la.speedup.median:.2f}× ({la.model}, context {la.context_length})" for la in (lo, hi)]
        spread = f"{lo.speedup.median:.2f}×" if lo is hi else " to ".join(ends)
        s.append(
            f"The best rung runs {spread} the tokens/s of the first rung that runs (the course's step where it fits: "
            f"{a.baseline_fits} of {plural(a.ladders, 'ladder')})."
        )
    if a.noise:
        where = C.listing(
            f"{la.model} at context {la.context_length} ({C.times(la.speedup, mark=True)})" for la in a.noise
        )
        s.append(f"The best rung's speed-up is within the noise in {where}.")
    if a.top is not None:
        b = a.top.best
        s.append(
            f"The highest MFU is {C.pct(b.mfu[head])} of {F.YARDSTICKS[head]} ({a.top.model} at context "
            f"{a.top.context_length}, `{b.name}`, {C.num(b.tokens_per_s, 0)} tokens/s)."
        )
    if a.gains:
        counted = [f"`{rung}` (in {plural(n, 'ladder')})" for rung, n in a.gains]
        s.append(f"The largest single gain of a ladder is {' or '.join(counted)}.")
    if (r := a.longest_compile) is not None:
        s.append(
            f"Compile time is kept apart from step time: at most {C.num(r.compile_s)} s for a rung (`{r.name}`, "
            f"{r.model} at context {r.context_length}: what its warm-up steps took beyond measured steps)."
        )
    return " ".join(s)


def fp8_text(gains: list[F.Fp8Gain], head: str | None) -> str:
    """FP8 against bf16 in one sentence: the range of speed-ups, the verdicts, the largest."""
    if not gains:
        return ""
    verdicts = C.count_verdicts(g.verdict for g in gains)
    top = max(gains, key=lambda g: g.speedup.median)
    return (
        f"FP8 training (torchao float8) runs {C.span([g.speedup.median for g in gains])} the tokens/s of the "
        f"fastest bf16 rung of the same ladder ({C.verdicts_said(verdicts)} of {plural(len(gains), 'ladder')}); "
        f"the most at {top.model}, context {top.context_length}: `{top.fp8.name}` at {C.times(top.speedup, mark=True)} "
        f"the tokens/s of `{top.bf16.name}`."
        + (f" The table's MFU is against {F.YARDSTICKS[head]} (for an FP8 rung, bf16-equivalent)." if head else "")
    )


def summary(a: F.Answer, head: str | None) -> str:
    """The question's answer in one line, first in the fragment: the front page's (the device report drops it)."""
    if a.slowest is None:
        return ""
    hi, lo = a.fastest, "" if a.slowest is a.fastest else f"{a.slowest.speedup.median:.2f}× to "
    text = f"The best rung runs {lo}{C.times(hi.speedup, mark=True)} ({hi.model}/{hi.context_length}) the first rung's tokens/s"
    text += ", within the noise" if hi in a.noise else ""
    if a.top is not None and head:
        b = a.top.best
        text += f"; highest MFU {C.pct(b.mfu[head])} of {F.YARDSTICKS[head]} ({a.top.model}/{a.top.context_length}, `{b.name}`)"
    return C.summary(text + ".")


def waterfall_text(ladder: F.Ladder, device: str) -> str:
    """The ladder in one paragraph; its savings are rounded so that they add up to the total shown."""
    name = f"**{ladder.model}, context {ladder.context_length}**"
    why: dict[str, list[str]] = {}  # the rungs that did not run, by why (a CPU's CUDA-only ones left out)
    for r in ladder.failed:
        if not (device == "cpu" and r.status == "unsupported"):
            # an unsupported rung says why (e.g. no larger batch allowed), out of memory is enough
            words = r.reason if r.status == "unsupported" and r.reason else STATUS_WORDS.get(r.status, r.status)
            why.setdefault(words, []).append(f"`{r.name}`")
    did_not = "; ".join(f"{', '.join(names)} ({str(w).rstrip('.')})" for w, names in why.items())
    if ladder.best is None:
        return f"{name}: no rung ran ({did_not})."
    start, best, us = ladder.start, ladder.best, ladder.start.us_per_token.median
    d = 2 if us < 10 else 1 if us < 1000 else 0
    best_us, *saved = F.round_parts([best.us_per_token.median, *(s.saved_us for s in ladder.chain)], d)
    text = f"{name}: `{start.name}` at {C.num(best_us + sum(saved), d)} µs per token"
    if ladder.chain:
        parts = ", ".join(
            f"`{s.rung}` {'saves' if v >= 0 else 'costs'} {C.num(abs(v), d)}"
            + (" (within the noise)" if s.verdict == "within noise" else "")
            for s, v in zip(ladder.chain, saved)
        )
        text += (
            f" to `{best.name}` at {C.num(best_us, d)} ({C.times(ladder.speedup, mark=True)} the tokens/s): {parts}; "
            f"{C.num(sum(saved), d)} µs per token in all."
        )
    else:
        text += f", the fastest rung that runs ({C.num(best.tokens_per_s, 0)} tokens/s)."
    if ladder.off_chain:
        words = ", ".join(f"`{s.rung}` ({C.VERDICT_WORDS[s.verdict]} against `{s.parent}`)" for s in ladder.off_chain)
        text += f" Off the best rung's path: {words}."
    return text + (f" Did not run: {did_not}." if did_not else "")


def profile_text(p: Profile, ceilings: list[Ceiling], head: str | None = None) -> str:
    where = f"the best {p.model} rung at context {p.context_length}"
    if not p.ok:
        return f"The profile of {where} was not taken: {str(p.reason).rstrip().rstrip('.')}."
    shown = F.round_parts([v for _, v in p.parts], 1)
    parts = ", ".join(
        f"{'less ' + name if name == OVERLAP else name} {C.num(abs(v), 1)}" for (name, _), v in zip(p.parts, shown)
    )
    s = [
        f"**What bounds {where}.** A kernel profile (Nsight Systems) of `{p.rung}` over {p.steps} steps splits its "
        f"{C.num(sum(shown), 1)} ms step into {parts} ms; the GPU runs kernels {C.pct(p.busy_fraction)} of the step."
    ]
    ceiling = next((c for c in ceilings if c.precision == p.precision), None)
    if p.matmul_tflops is not None:
        share = (
            f", {C.pct(p.matmul_tflops / ceiling.tflops)} of the measured {p.precision} GEMM ceiling" if ceiling else ""
        )
        if p.attention_separate:
            rate = f" at {C.num(p.attention_tflops)} TFLOP/s" if p.attention_tflops else ""
            share += f"; the attention kernels take {C.num(p.attention_ms)} ms{rate} (causal attention counted half)"
        elif p.attention_fused:
            share += "; this profile counts the fused attention kernels among them (its FLOPs counted half)"
        s.append(f"The matmul kernels run at {C.num(p.matmul_tflops)} TFLOP/s{share}.")
    if ceiling and p.matmul_tflops is not None and p.matmul_tflops >= ceiling.tflops:
        s.append(
            f"The matmul kernels run at or above that ceiling, which times square GEMMs only: the "
            f"{C.num(sum(shown) - p.matmul_ms, 1)} ms outside the matmul kernels bound the step."
        )
    elif ceiling and (bound := at_ceiling_ms(p, ceiling)) is not None:
        step, mfu = sum(shown), p.mfu.get(head)
        s.append(
            f"With them at that ceiling and every other part as profiled, the step would take {C.num(bound, 1)} ms, "
            f"{step / bound:.2f}× faster"
            + (f" ({C.pct(mfu * step / bound)} of {F.YARDSTICKS[head]} against {C.pct(mfu)} measured)" if mfu else "")
            + f": the {C.num(step - p.matmul_ms, 1)} ms outside the matmul kernels bound it."
        )
    if p.optimizer_ms is not None and p.optimizer_floor_ms is not None:
        s.append(
            f"The optimizer kernels take {C.num(p.optimizer_ms)} ms; moving {F.ADAMW_BYTES_PER_PARAM} bytes per "
            f"parameter at the datasheet's memory bandwidth takes at least {C.num(p.optimizer_floor_ms)} ms."
        )
    return " ".join(s)


def method_text(ladders: list[F.Ladder], head: str | None, device: str) -> str:
    rungs = [r for la in ladders for r in la.rungs if r.ok]
    trials = max((r.step_ms.trials for r in rungs), default=1)
    over = "in one trial" if trials == 1 else f"over up to {trials} trials (separate processes), with its 95% interval"
    timer = "timed around" if device == "cpu" else "timed with a synchronize around"
    conventions: dict[str, list[str]] = {}
    for r in rungs:
        conventions.setdefault(r.flop_convention, []).append(f"`{r.name}`")
    flops = "; ".join(f"{conv} on {', '.join(dict.fromkeys(names))}" for conv, names in conventions.items())
    # records from before the keep rule name no `kept`: their rungs built on the fastest rung before them
    builds = (
        "builds on the fastest kept rung before it (its record names its parent), and is kept when its first "
        f"trial beats its parent's tokens/s by more than {C.pct(stats.SAME_MARGIN, 0)}."
        if any(r.kept is not None for r in rungs)
        else "builds on the fastest rung measured before it (its record names its parent)."
    )
    s = [
        "Method: each ladder starts from the course's training step and changes one thing per rung; a rung "
        f"{builds} A rung's time is the "
        f"median of its measured steps, {over}, {timer} the whole step (forward, loss, backward, optimizer); "
        "time per token divides it by the tokens of one optimizer step. A rung is faster or slower than its "
        f"parent only where the interval of their ratio clears {C.pct(stats.SAME_MARGIN, 0)} either way; "
        "otherwise it is within the noise."
    ]
    if flops:
        s.append(f"FLOPs are matmul FLOPs as the attention kernel computes them: {flops}.")
    if any(k.endswith("fp8") for k in F.yardsticks(rungs)):
        s.append(
            "FP8 rungs give MFU against the bf16 peak (bf16-equivalent: the same FLOPs over the bf16 rate) and "
            "against the fp8 peak."
        )
    if head:
        s.append(f"The figures' labels and the MFU in the tables of every rung are against {F.YARDSTICKS[head]}.")
    return " ".join(s)


def section(records: list[dict], device: str, grid: dict) -> str:
    """The answer, the table of best rungs, the first ladder's figure and waterfall, what bounds it,
    the method; every other ladder and every rung in folds; the source."""
    ladders = F.ladders_from(records, grid.get("rungs"))
    if not ladders:
        return f"The speed ladder was not measured on `{device}`.\n"
    rungs = [r for la in ladders for r in la.rungs]
    head = next(iter(F.yardsticks(rungs)), None)
    ceilings = ceilings_from(records)
    answer, gains = F.answer_facts(ladders, head), F.fp8_gains(ladders)
    bests = {(la.model, la.context_length): la.best for la in ladders}
    profiles = [
        Profile(r, bests.get((r["cell"]["model"], int(r["cell"]["context_length"]))))
        for r in records
        if r["kind"] == "ladder_profile"
    ]
    # shown first: the profiled ladder, else the largest model at its shortest context
    profiled = [la for la in ladders if la.best and any(p.model == la.model for p in profiles if p.ok)]
    shown = profiled[0] if profiled else ([la for la in ladders if la.best] or ladders)[-1]
    drawn = set(jobs(grid))
    cannot = sorted({r.name for r in rungs if r.status == "unsupported"})
    others = [
        f"{waterfall_text(la, device)}\n\n{image(device, la.model, la.context_length, drawn)}"
        for la in ladders
        if la is not shown
    ] + [f"**{m}, context {c}**: no records.\n\n{image(device, m, c, drawn)}" for m, c in sorted(drawn - set(bests))]
    every, mfu = [], f"MFU of {F.YARDSTICKS[head]}" if head else "no MFU in the records"
    for c in sorted({la.context_length for la in ladders}):
        rows = T.pivot_table(ladders, c, head)
        cells = {v for row in rows for v in row.values()}  # the status words said beneath are the table's
        said = [f"{w}: {STATUS_WORDS[k]}" for k, w in T.STATUS_WORDS.items() if w in cells]
        keys = f"; {', '.join(said)}" if said else ""
        every.append(f"Context {c}: median ms per step ({mfu}){keys}.\n\n" + C.md_table(rows))
    if compiled := T.compile_table(ladders):
        every += ["Compile time per compiled rung, apart from its step time:", C.md_table(compiled)]
    every.append(f"[full table]({C.link(device, CSV)}) (every rung, with reasons, configurations and MFU)")
    return C.blocks(
        summary(answer, head),
        answer_text(answer, head),
        C.md_table(T.sizes_table(ladders)),
        fp8_text(gains, head),
        C.md_table(T.fp8_table(gains, head)) if gains else "",
        image(device, shown.model, shown.context_length, drawn),
        waterfall_text(shown, device),
        *([] if device == "cpu" else [profile_text(p, ceilings, head) for p in profiles]),
        "Measured GEMM ceilings (square N×N matmuls, best of sizes and repeats):" if ceilings else "",
        C.md_table(T.ceilings_table(ceilings)) if ceilings else "",
        *[C.details("Top kernels of the profile", C.md_table(T.kernels_table(p))) for p in profiles if p.ok],
        method_text(ladders, head, device),
        f"Not measured on a CPU: {', '.join(f'`{n}`' for n in cannot)} (CUDA only)."
        if device == "cpu" and cannot
        else "",
        C.details("Every other ladder", *others) if others else "",
        C.details("Every rung", *every),
        C.source_line(records, device),
    )


def write(records: list[dict], grid: dict, device: str, out: Path) -> None:
    ladders = F.ladders_from(records, grid.get("rungs"))
    C.write_csv(T.rung_frame(ladders), out / CSV)
    head = next(iter(F.yardsticks([r for la in ladders for r in la.rungs])), None)
    by_job = {(la.model, la.context_length): la for la in ladders}
    for model, ctx in jobs(grid):
        ladder, path = by_job.get((model, ctx)), out / figure_path(model, ctx)
        if ladder is None:
            C.empty_figure(path, f"{model} at context {ctx}: no ladder records")
        else:
            figures.waterfall(ladder, head, path, drop_unsupported=device == "cpu")
    C.write_text(out / "sections" / "speed_ladder.md", section(records, device, grid))


main = C.report_cli(__doc__, write)

if __name__ == "__main__":
    raise SystemExit(main())
