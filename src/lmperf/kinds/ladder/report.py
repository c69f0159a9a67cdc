"""Report of the speed ladder: how fast each model trains here, from the course's step to the best rung.

Reads the ladder's records (one per rung), the measured GEMM ceiling (``gemm_peak``) and the profile
of a best rung (``ladder_profile``); writes ``tables/ladder.csv`` (every rung), one waterfall figure
per (model, context) of the grid and the section ``speed_ladder``. Facts (``facts``, ``bounds``) →
tables (``tables``) and figures (``figures``) → the short templates here. No torch.

    python -m lmperf.kinds.ladder.report --device h100 --out results/h100 --grid '{"models": …}' \
        --records results/h100/ladder/*.json results/h100/gemm_peak/*.json results/h100/ladder_profile/*.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmperf.core import stats
from lmperf.core.record import load_record
from lmperf.kinds.ladder import figures
from lmperf.kinds.ladder.bounds import OVERLAP, Ceiling, Profile, ceilings_from, profile_from
from lmperf.kinds.ladder.facts import (
    ADAMW_BYTES_PER_PARAM,
    Answer,
    CpuPrecision,
    Ladder,
    Yardstick,
    alternative_of,
    answer_facts,
    cpu_precision,
    headline,
    ladders_from,
    round_parts,
    yardsticks,
)
from lmperf.kinds.ladder.tables import (
    ceilings_table,
    compile_table,
    fmt,
    kernels_table,
    md_table,
    pct,
    pivot_table,
    rung_frame,
    sizes_table,
    times,
    unstable_note,
)

SECTIONS = ["speed_ladder"]
ALSO_READS = ("gemm_peak", "ladder_profile")
CSV = "tables/ladder.csv"
VERDICT_WORDS = {"faster": "faster", "slower": "slower", "within noise": "within the noise"}
STATUS_WORDS = {"oom": "out of memory", "unsupported": "cannot run here"}


def jobs(grid: dict) -> list[tuple[str, int]]:
    """(model, context) of every ladder the grid asks for: its main lengths and its long ones."""
    grids = [grid, *([grid["long_context"]] if isinstance(grid.get("long_context"), dict) else [])]
    grids += grid.get("long_context") if isinstance(grid.get("long_context"), list) else []
    return sorted({(m, int(c)) for g in grids for m in g.get("models", []) for c in g.get("context_lengths", [])})


def figure_path(model: str, context_length: int) -> str:
    return f"figures/ladder_{model}_ctx{context_length}.png"


def outputs(grid: dict) -> list[str]:
    return [CSV, *(figure_path(m, c) for m, c in jobs(grid))]


def link(device: str, path: str) -> str:
    """A results path as linked from report/<device>/answers.md."""
    return f"../../results/{device}/{path}"


def image(device: str, model: str, context_length: int, drawn: set) -> str:
    """The figure of a ladder, where the grid draws one (``outputs``)."""
    if (model, context_length) not in drawn:
        return ""
    path = figure_path(model, context_length)
    return f"![{model} at context {context_length}: time per token by rung]({link(device, path)})"


# -- templates -------------------------------------------------------------------------------------


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def gains_text(a: Answer, only: Ladder | None) -> str:
    if only is not None and only.largest is not None:
        g = only.largest
        return f"The largest single gain is `{g.rung}` over `{g.parent}`: {g.factor:.2f}× the tokens/s."
    if not a.gains:
        return ""
    (first, n), *rest = a.gains
    counted = [f"`{first}` (in {plural(n, 'ladder')})", *(f"`{rung}` ({n})" for rung, n in rest)]
    joined = counted[0] if len(counted) == 1 else ", ".join(counted[:-1]) + " or " + counted[-1]
    return f"The largest single gain of a ladder is {joined}."


def answer_text(a: Answer, head: Yardstick | None, alt: Yardstick | None, only: Ladder | None = None) -> str:
    """The answer first: speed-up range, the highest MFU, where the gains come from, compile time."""
    if a.ran == 0:
        return f"No rung of the {plural(a.ladders, 'ladder')} ran here (out of memory or cannot run here)."
    single = ", ".join(f"{la.model} at context {la.context_length}" for la in a.single)
    single = f"only one rung runs for {single}" if single else ""
    s = []
    if a.slowest is not None:
        lo, hi = a.slowest, a.fastest
        spread = f"{lo.speedup.median:.1f}×" + (
            ""
            if lo is hi
            else f" ({lo.model}, context {lo.context_length}) to {hi.speedup.median:.1f}× ({hi.model}, context {hi.context_length})"
        )
        s.append(
            f"The best rung runs {spread} the tokens/s of the first rung that runs (the course's step where it "
            f"fits: {a.baseline_fits} of {plural(a.ladders, 'ladder')}" + (f"; {single}" if single else "") + ")."
        )
    elif single:
        s.append(single[0].upper() + single[1:] + ".")
    if a.top is not None:
        best = a.top.best
        twin = f"; {pct(best.mfu[alt.key])} with causal attention counted half" if alt and alt.key in best.mfu else ""
        s.append(
            f"The highest MFU is {pct(best.mfu[head.key])} of {head.words} ({a.top.model} at context "
            f"{a.top.context_length}, `{best.name}`, {fmt(best.tokens_per_s, 0)} tokens/s{twin})."
        )
    s.append(gains_text(a, only))
    if a.longest_compile is not None:
        r = a.longest_compile
        s.append(
            f"Compile time is kept apart from step time: at most {fmt(r.compile_s)} s for a rung (`{r.name}`, "
            f"{r.model} at context {r.context_length}; its first step less a measured one)."
        )
    return " ".join(x for x in s if x)


def digits_for(us: float) -> int:
    return 2 if us < 10 else 1 if us < 1000 else 0


def waterfall_text(ladder: Ladder, device: str) -> str:
    """The ladder in one paragraph; its savings are rounded so that they add up to the total shown."""
    name = f"**{ladder.model}, context {ladder.context_length}**"
    failed = [r for r in ladder.failed if not (device == "cpu" and r.status == "unsupported")]
    did_not = "; ".join(
        f"{', '.join(f'`{r.name}`' for r in failed if r.status == s)} ({STATUS_WORDS.get(s, s)})"
        for s in dict.fromkeys(r.status for r in failed)
    )
    if ladder.best is None:
        return f"{name}: no rung ran ({did_not})."
    start, best, d = ladder.start, ladder.best, digits_for(ladder.start.us_per_token.median)
    best_us, *saved = round_parts([best.us_per_token.median, *(s.saved_us for s in ladder.chain)], d)
    text = f"{name}: `{start.name}` at {fmt(best_us + sum(saved), d)} µs per token"
    if ladder.chain:
        parts = ", ".join(
            f"`{s.rung}` {'saves' if v >= 0 else 'costs'} {fmt(abs(v), d)}"
            + ("" if s.verdict != "within noise" else " (within the noise)")
            for s, v in zip(ladder.chain, saved)
        )
        text += (
            f" to `{best.name}` at {fmt(best_us, d)} ({times(ladder.speedup)} the tokens/s): {parts}; "
            f"{fmt(sum(saved), d)} µs per token in all."
        )
    else:
        text += f", the fastest rung that runs ({fmt(best.tokens_per_s, 0)} tokens/s)."
    if ladder.not_kept:
        words = ", ".join(f"`{s.rung}` ({VERDICT_WORDS[s.verdict]} against `{s.parent}`)" for s in ladder.not_kept)
        text += f" Not built on: {words}."
    return text + (f" Did not run: {did_not}." if did_not else "")


def attention_words(p: Profile) -> str:
    if p.attention_separate:
        return (
            f"; the attention kernels take {fmt(p.attention_ms)} ms"
            + (f" at {fmt(p.attention_tflops)} TFLOP/s" if p.attention_tflops else "")
            + " (causal attention counted half for a fused kernel)"
        )
    if p.attention_fused:
        return (
            "; this profile counts the fused attention kernels among the matmuls, so the rate blends GEMMs "
            "with attention (its FLOPs counted half, as a fused causal kernel computes them)"
        )
    return ""


def profile_text(p: Profile, ceilings: list[Ceiling], device: str) -> str:
    where = f"the best {p.model} rung at context {p.context_length}"
    if not p.ok:
        reason = str(p.reason).rstrip().rstrip(".")
        return f"The profile of {where} was not taken: {reason}."
    d = 1
    shown = round_parts([v for _, v in p.parts], d)
    parts = ", ".join(
        f"{name if name != OVERLAP else 'less ' + OVERLAP} {fmt(abs(v) if name == OVERLAP else v, d)}"
        for (name, _), v in zip(p.parts, shown)
    )
    s = [
        f"**What bounds {where}.** A kernel profile (Nsight Systems) of `{p.rung}` over {p.steps} steps splits its "
        f"{fmt(sum(shown), d)} ms step into {parts} ms; the GPU runs kernels {pct(p.busy_fraction)} of the step."
    ]
    bf16 = next((c for c in ceilings if c.precision == "bf16"), None)
    if p.matmul_tflops is not None:
        share = f", {pct(p.matmul_tflops / bf16.tflops)} of the measured bf16 GEMM ceiling" if bf16 else ""
        s.append(f"The matmul kernels run at {fmt(p.matmul_tflops)} TFLOP/s{share}{attention_words(p)}.")
    if p.optimizer_ms is not None and p.optimizer_floor_ms is not None:
        s.append(
            f"The optimizer kernels take {fmt(p.optimizer_ms)} ms; moving {ADAMW_BYTES_PER_PARAM} bytes per "
            f"parameter at the datasheet's memory bandwidth takes at least {fmt(p.optimizer_floor_ms)} ms."
        )
    if not p.same_run:
        s.append(
            f"The profile (commit `{p.commit}`) comes from another run of the ladder: it replayed `{p.rung}` "
            f"stepping in {fmt(p.ladder_step_ms_then)} ms, where today's best rung is `{p.best_rung}` at "
            f"{fmt(p.ladder_step_ms_now)} ms."
        )
    return " ".join(s)


def cpu_precision_text(c: CpuPrecision) -> str:
    gemm = (
        f", where a square bf16 GEMM reaches {c.gemm_bf16_over_fp32:.2f}× fp32's rate (the ceilings table)"
        if c.gemm_bf16_over_fp32
        else ""
    )
    return (
        f"On this CPU `bf16` runs at {times(c.speed)} the tokens/s of its parent `{c.parent}` "
        f"({VERDICT_WORDS[c.verdict]}){gemm}. A CPU runs bf16 matmuls fast only where it has instructions for "
        "them (AMX, AVX-512 BF16), and autocast adds a cast of each matmul's inputs."
    )


def conventions_text(ladders: list[Ladder], alt: Yardstick | None) -> str:
    used = {}
    for la in ladders:
        for r in la.rungs:
            if r.ok:
                used.setdefault(r.flop_convention, []).append(r.name)
    if len(used) == 1:
        text = f"FLOPs are matmul FLOPs with {next(iter(used))} on every rung"
    else:
        text = "FLOPs are matmul FLOPs, " + "; ".join(
            f"{conv} on {', '.join(f'`{n}`' for n in dict.fromkeys(names))}" for conv, names in used.items()
        )
    twin = " (the records also give MFU with causal attention counted half, as fused kernels compute it)"
    return text + (twin if alt else "") + "."


def precisions_text(ladders: list[Ladder], head: Yardstick | None) -> str:
    """Where rungs give MFU against a peak of another precision too (e.g. FP8 against FP8's)."""
    others = sorted(
        {y.precision for y in yardsticks([r for la in ladders for r in la.rungs]) if y.precision}
        - {head.precision if head else None}
    )
    if not others or head is None or head.precision is None:
        return ""
    return (
        f" Rungs that run in {', '.join(others)} give MFU against the {head.precision} peak too ({head.precision}-"
        f"equivalent: the same FLOPs over the {head.precision} rate) and against their own precision's peak."
    )


def method_text(ladders: list[Ladder], head: Yardstick | None, alt: Yardstick | None, device: str) -> str:
    rungs = [r for la in ladders for r in la.rungs if r.ok]
    trials = max((r.step_ms.trials for r in rungs), default=1)
    statistic = "/".join(sorted({r.step_statistic for r in rungs})) or "median"
    timer = (
        "timed around the whole step (forward, loss, backward, optimizer; a CPU has no device to synchronize with)"
        if device == "cpu"
        else "timed with a synchronize around the whole step (forward, loss, backward, optimizer)"
    )
    over = "in one trial" if trials == 1 else f"over {trials} trials, with its 95% interval"
    margin = pct(stats.SAME_MARGIN, 0)
    return (
        "Method: each ladder starts from the course's training step and changes one thing per rung; a rung builds "
        f"on the fastest rung measured before it (its record names its parent). A rung's time is the {statistic} of "
        f"its measured steps, {over}, {timer}; time per token divides it by the tokens of one optimizer step. A rung "
        f"is faster or slower than its parent only where the interval of their ratio clears {margin} either way "
        f"({pct(2 * stats.SAME_MARGIN, 0)} without an interval); otherwise it is within the noise. "
        + conventions_text(ladders, alt)
        + precisions_text(ladders, head)
        + (f" The figures' labels and the MFU in the tables of every rung are against {head.words}." if head else "")
    )


def cpu_line(ladders: list[Ladder], profiles: list[Profile], head: Yardstick | None) -> str:
    cannot = sorted({r.name for la in ladders for r in la.failed if r.status == "unsupported"})
    missing = [f"{', '.join(f'`{n}`' for n in cannot)} (CUDA only)"] if cannot else []
    missing += ["a kernel profile of the best rung"] if profiles and not any(p.ok for p in profiles) else []
    missing += (
        ["a datasheet peak (MFU is against the measured GEMM ceiling)"] if head and head.ceiling != "datasheet" else []
    )
    return f"Not measured on a CPU: {'; '.join(missing)}." if missing else ""


def details(summary: str, *body: str) -> str:
    return (
        f"<details><summary>{summary}</summary>\n\n" + "\n\n".join(b.strip("\n") for b in body if b) + "\n\n</details>"
    )


def source_line(records: list[dict], device: str) -> str:
    counts = {}
    for r in records:
        counts[r["kind"]] = counts.get(r["kind"], 0) + 1
    kinds = ", ".join(f"{n} in `results/{device}/{k}/`" for k, n in counts.items())
    names = sorted({r["provenance"]["device_name"] for r in records})
    commits = sorted({(r["provenance"].get("git_commit") or "unknown")[:7] for r in records})
    return f"_Source: records {kinds}; {', '.join(names)}; commit {', '.join(f'`{c}`' for c in commits)}._"


def featured(ladders: list[Ladder], profiles: list[Profile]) -> Ladder | None:
    """The ladder shown first: the profiled one, else the largest model at its shortest context."""
    profiled = {(p.model, p.context_length) for p in profiles}
    ran = [la for la in ladders if la.best is not None] or ladders
    hit = [la for la in ran if (la.model, la.context_length) in profiled]
    return hit[0] if hit else (ran[-1] if ran else None)


def bounds_blocks(ladders: list[Ladder], profiles: list[Profile], ceilings: list[Ceiling], device: str) -> list[str]:
    """What bounds the best rungs: the profiles (a CPU: bf16 against its parent), the GEMM ceilings."""
    if device == "cpu":
        gemm = {c.precision: c.tflops for c in ceilings}
        blocks = [cpu_precision_text(c) for la in ladders if (c := cpu_precision(la, gemm))]
    else:
        blocks = [profile_text(p, ceilings, device) for p in profiles]
    if ceilings:
        blocks += [
            "Measured GEMM ceilings (square N×N matmuls, best of sizes and repeats):",
            md_table(ceilings_table(ceilings)),
        ]
    if device != "cpu":
        blocks += [details("Top kernels of the profile", md_table(kernels_table(p))) for p in profiles if p.ok]
    return blocks


def others_block(ladders: list[Ladder], shown: Ladder, drawn: set, device: str) -> str:
    """Every ladder but the one shown first, and the grid's ladders without records, with their figures."""
    others = [
        f"{waterfall_text(la, device)}\n\n{image(device, la.model, la.context_length, drawn)}"
        for la in ladders
        if la is not shown
    ]
    measured = {(la.model, la.context_length) for la in ladders}
    others += [
        f"**{m}, context {c}**: no records.\n\n{image(device, m, c, drawn)}" for m, c in sorted(drawn - measured)
    ]
    return details("Every other ladder", *others) if others else ""


def every_rung_block(ladders: list[Ladder], head: Yardstick | None, device: str) -> str:
    mfu = f"MFU of {head.words}" if head else "no MFU in the records"
    tables = [
        f"Context {c}: {est_label(ladders)} ({mfu}); OOM: out of memory, n/a: cannot run here.\n\n"
        + md_table(pivot_table(ladders, c, head))
        for c in sorted({la.context_length for la in ladders})
    ]
    compiled = compile_table(ladders)
    if not compiled.empty:
        tables += ["Compile time per compiled rung, apart from its step time:", md_table(compiled)]
    csv = f"[full table]({link(device, CSV)}) (every rung, with reasons, configurations and every MFU the records give)"
    return details("Every rung", *tables, csv)


def profiles_of(records: list[dict], ladders: list[Ladder]) -> list[Profile]:
    bests = {(la.model, la.context_length): la.best for la in ladders}
    return [
        profile_from(r, bests.get((r["cell"]["model"], int(r["cell"]["context_length"]))))
        for r in records
        if r["kind"] == "ladder_profile"
    ]


def section(records: list[dict], device: str, grid: dict) -> str:
    """The answer, the table of best rungs, the first ladder's figure and waterfall, what bounds it,
    the method; every other ladder and every rung in folds; the source."""
    ladders = ladders_from(records, grid.get("rungs"))
    if not ladders:
        return f"The speed ladder was not measured on `{device}`.\n"
    rungs = [r for la in ladders for r in la.rungs]
    head = headline(rungs)
    alt = alternative_of(head, rungs)
    ceilings = ceilings_from(records)
    profiles = profiles_of(records, ladders)
    shown = featured(ladders, profiles)
    drawn = set(jobs(grid))
    unstable = any(r.step_ms is not None and r.step_ms.unstable for r in rungs)
    blocks = [
        answer_text(answer_facts(ladders, head), head, alt, ladders[0] if len(ladders) == 1 else None),
        md_table(sizes_table(ladders, head)) + (f"\n{unstable_note()}" if unstable else ""),
        image(device, shown.model, shown.context_length, drawn),
        waterfall_text(shown, device),
        *bounds_blocks(ladders, profiles, ceilings, device),
        method_text(ladders, head, alt, device),
        cpu_line(ladders, profiles, head) if device == "cpu" else "",
        others_block(ladders, shown, drawn, device),
        every_rung_block(ladders, head, device),
        source_line(records, device),
    ]
    return "\n\n".join(b.strip("\n") for b in blocks if b and b.strip()) + "\n"


def est_label(ladders: list[Ladder]) -> str:
    stats_used = sorted({r.step_statistic for la in ladders for r in la.rungs if r.ok}) or ["median"]
    return f"{'/'.join(stats_used)} ms per step"


# -- main ------------------------------------------------------------------------------------------


def parse_grid(text: str | None) -> dict:
    if not text:
        return {}
    path = Path(text)
    return json.loads(path.read_text() if not text.lstrip().startswith("{") and path.is_file() else text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", required=True)
    p.add_argument("--out", required=True, help="results/<device>: tables/, figures/, sections/ go under it")
    p.add_argument("--grid", default="{}", help="the ladder grid (config.yaml grids.<gpu|cpu>.ladder) as JSON")
    p.add_argument("--records", nargs="*", default=[])
    args = p.parse_args(argv)
    grid, out = parse_grid(args.grid), Path(args.out)
    records = [load_record(path) for path in sorted(args.records)]
    ladders = ladders_from(records, grid.get("rungs"))
    (out / CSV).parent.mkdir(parents=True, exist_ok=True)
    rung_frame(ladders).to_csv(out / CSV, index=False)
    head = headline([r for la in ladders for r in la.rungs])
    by_job = {(la.model, la.context_length): la for la in ladders}
    for model, ctx in jobs(grid):
        ladder = by_job.get((model, ctx))
        if ladder is None:
            figures.empty_figure(out / figure_path(model, ctx), f"{model} at context {ctx}: no ladder records")
        else:
            figures.waterfall(ladder, head, out / figure_path(model, ctx), drop_unsupported=args.device == "cpu")
    sections = out / "sections"
    sections.mkdir(parents=True, exist_ok=True)
    (sections / "speed_ladder.md").write_text(section(records, args.device, grid))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
