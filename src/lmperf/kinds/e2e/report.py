"""Report of the end-to-end cells: benchmarking_script (a)-(c), benchmarking_mixed_precision (c),
torch_compile (b), the step timer against CUDA events, and the whole model with each attention.

Each section is the answer first (a short template filled from ``facts``), then its table
(``tables``) and figure (``figures``); the CSV files hold every record's numbers.

    python -m lmperf.kinds.e2e.report --device h100 --out results/h100 --grid '{"warmup_steps": 5}' \
        --records results/h100/e2e/*.json results/h100/e2e_compile/*.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path

from lmperf.core.record import load_record
from lmperf.kinds.e2e import facts as F
from lmperf.kinds.e2e import figures
from lmperf.kinds.e2e import tables as T
from lmperf.kinds.e2e.tables import blocks, count, names, sentence

SECTIONS = [
    "benchmarking_script",
    "benchmarking_mixed_precision_c",
    "torch_compile_b",
    "timer_check",
    "flash_benchmarking_model",
]
ALSO_READS = ("e2e_compile",)
TABLES = ("e2e", "e2e_compile")
NOT_MEASURED = "_The end-to-end cells were not measured on this device._\n"
# the thresholds as the prose names them: by their meaning
LOW, HOST = T.pct(F.LOW_CV, 0), T.pct(F.HOST_BOUND_BUSY, 0)


def outputs(grid: dict) -> list[str]:
    """Every table and figure this report writes, relative to ``--out`` (the same whatever the records)."""
    return [f"tables/{name}.csv" for name in TABLES] + [figures.path_of(name) for name in figures.NAMES]


def default_warmup(grid: dict, records: list[dict]) -> int | None:
    """The grid's warm-up count; without a grid, the one most of the records used."""
    if grid.get("warmup_steps") is not None:
        return int(grid["warmup_steps"])
    counts = Counter(r["cell"]["warmup_steps"] for r in records if r["kind"] == "e2e")
    return counts.most_common(1)[0][0] if counts else None


def sweep_context(grid: dict, records: list[dict], default: int | None) -> int | None:
    """The warm-up sweep's context: the grid's, else that of the records at another warm-up count."""
    lengths = (grid.get("warmup_sweep") or {}).get("context_lengths")
    if lengths:
        return int(lengths[0])
    others = sorted({k[1] for k in F.course_cells(records) if k[4] != default})
    return others[0] if others else None


def link(device: str, path: str) -> str:
    """A path under ``results/<device>/`` as linked from ``report/<device>/answers.md``."""
    return f"../../results/{device}/{path}"


def figure_line(device: str, name: str, alt: str) -> str:
    return f"![{alt}]({link(device, figures.path_of(name))})"


def source(records: list[dict], device: str, kind: str) -> str:
    """Which records a section read: how many, where, measured at which commit(s)."""
    mine = [r for r in records if r["kind"] == kind]
    commits = sorted({r["provenance"]["git_commit"][:7] for r in mine})
    at = f", measured at commit{'s' if len(commits) > 1 else ''} {', '.join(f'`{c}`' for c in commits)}"
    return f"_Source: {count(len(mine), 'record')} in `results/{device}/{kind}/`{at if commits else ''}._"


# -- benchmarking_script --------------------------------------------------------------------------


def method_text(records: list[dict], device: str) -> str:
    settings = next((r["provenance"].get("settings") or {} for r in records if r["kind"] == "e2e"), {})
    sync = (
        "calling `torch.cuda.synchronize()` after each"
        if device != "cpu"
        else "on the CPU (nothing to synchronize; no CUDA events, peak memory or model FLOP utilisation here)"
    )
    return (
        "### (a) The benchmark\n\n`python -m lmperf.kinds.e2e.cell` builds a model of the given size and a random "
        f"batch (batch {settings.get('batch_size', '—')}, vocab {settings.get('vocab_size', '—'):,}), runs `w` "
        "warm-up steps, then times each phase of `n` steps (forward with the loss, backward, AdamW step) with "
        f"`timeit.default_timer`, {sync}; then inference forwards under `torch.no_grad`. One process and one "
        f"record per cell (`results/{device}/e2e/`)."
    )


def trials_text(t: F.TimingFacts) -> str:
    if t.trials == 1:
        return "Each cell is one trial (one process), so no time carries an interval: the spread between processes is not measured here."
    unstable = [r.label for r in t.ok if r.unstable]
    return f"Each time is the median over up to {t.trials} trials (separate processes) with its 95% interval." + (
        f" Unstable (interval wider than {100 * T.UNSTABLE_WIDTH:.0f}% of the median): {names(unstable)}."
        if unstable
        else ""
    )


def busy_text(t: F.TimingFacts, device: str) -> str:
    """Host-bound from the GPU's measured busy share; nothing where the records do not measure it."""
    measured = [r for r in t.ok if r.busy is not None]
    if device == "cpu" or not measured:
        return (
            ""
            if device == "cpu" or not t.noisy
            else "These records do not measure how busy the GPU was, so they do not say whether the noisy cells are host-bound."
        )
    host = [r for r in measured if r.host_bound]
    busy = T.span([100 * r.busy.median for r in (host or measured)], "%", 0)
    if not host:
        return f"The GPU is busy {busy} of the step in every measured cell: none is host-bound."
    return f"The GPU is busy under {HOST} of the step in {names(r.label for r in host)} ({busy}): host-bound, their time depends on the CPU."


def timing_answer(t: F.TimingFacts, device: str) -> str:
    ok = t.ok
    if not ok:
        return "No fp32 training step was measured at the default warm-up on this device."
    fast, slow = (f(ok, key=lambda r: r.times["forward"].median) for f in (min, max))
    ratios = t.backward_over_forward
    first = (
        f"With {t.warmup_steps} warm-up steps (fp32), a forward takes {T.est(fast.times['forward'])} ms "
        f"({fast.label}) to {T.est(slow.times['forward'])} ms ({slow.label}) and a backward {T.span(ratios)} the "
        f"forward (median {T.num(statistics.median(ratios), 2)}×)."
    )
    oom = f"{names(r.label for r in t.oom)} run out of memory for a training step." if t.oom else ""
    judged, noisy = t.judged, t.noisy
    if not noisy:
        spread = f"Variability is low everywhere: the CV (std/mean over the measured steps) is under {LOW} in all {len(judged)} cells (at most {T.pct(max(r.cv for r in judged))})."
    else:
        spread = (
            f"Variability is low (CV, std/mean over the measured steps, under {LOW}) in {len(judged) - len(noisy)} of "
            f"{len(judged)} cells and high in " + ", ".join(f"{r.label} ({T.pct(r.cv)})" for r in noisy) + "."
        )
    return sentence(first, oom, spread, busy_text(t, device))


WARMUP_WHY = {
    "cuda": "The first steps pay one-time costs: loading kernels into the CUDA context, cuBLAS handles and "
    "algorithm selection, the caching allocator's first `cudaMalloc` calls, and AdamW creating its state.",
    "cpu": "The first steps pay one-time costs: the allocator and thread pools growing to size, first-touch "
    "page faults on fresh buffers, dispatch caches filling, and AdamW creating its state.",
}


def warmup_answer(w: F.WarmupFacts, device: str) -> str:
    cold, few, parts = w.cold, w.few, []
    if cold:
        slower = [r for r in cold if r.verdict("forward") == "slower"]
        firsts = [r.firsts["forward"] for r in cold if r.firsts["forward"] is not None]
        cvs = [100 * r.cvs["forward"] for r in cold if r.cvs["forward"] is not None]
        parts.append(
            (
                f"Without warm-up the first measured forward takes {T.span(firsts)} the median of the others, so "
                if firsts
                else "Without warm-up "
            )
            + f"the mean forward is slower than with {w.default} warm-up steps beyond the noise for "
            + (f"all {len(cold)} sizes" if len(slower) == len(cold) else f"{len(slower)} of {len(cold)} sizes")
            + (f", with a CV of {T.span(cvs, '%', 0)}." if cvs else ".")
        )
    if few:
        differ = [r for r in few if r.verdict("forward") != "within noise"]
        parts.append(
            f"With {' or '.join(str(n) for n in sorted({r.warmup_steps for r in few}))} warm-up steps the mean "
            f"forward is within the noise of {w.default}'s in {len(few) - len(differ)} of {len(few)} cells"
            + (
                "; " + ", ".join(f"{r.model} after {r.warmup_steps} is {r.verdict('forward')}" for r in differ)
                if differ
                else ""
            )
            + "."
        )
    return sentence(*parts, WARMUP_WHY["cpu" if device == "cpu" else "cuda"])


def section_benchmarking_script(records: list[dict], grid: dict, device: str) -> str:
    warmup = default_warmup(grid, records)
    t = F.timing_facts(records, warmup)
    table = T.timing_table(t)
    b = blocks(
        f"### (b) Forward and backward, {t.warmup_steps} warm-up steps",
        timing_answer(t, device),
        T.md(table),
        sentence(trials_text(t), T.unstable_note(table)),
        figure_line(device, "phase_times", "forward and backward time per size"),
        f"Every phase, inference included, in the [full table]({link(device, 'tables/e2e.csv')}).",
    )
    ctx = sweep_context(grid, records, warmup)
    w = F.warmup_facts(records, warmup, ctx) if ctx is not None else None
    if w is None or not w.rows:
        c = blocks("### (c) Fewer warm-up steps", "No warm-up sweep was measured on this device.")
    else:
        c = blocks(
            f"### (c) Fewer warm-up steps (context {w.context_length}, fp32)",
            warmup_answer(w, device),
            T.md(T.warmup_table(w)),
            "`1st / median`: the first measured step over the median of the others; the verdicts compare "
            f"each mean with the {w.default}-warm-up cell's.",
            figure_line(device, "warmup", "forward time of each measured step per warm-up count"),
        )
    return blocks(method_text(records, device), b, c, source(records, device, "e2e"))


# -- benchmarking_mixed_precision (c) ---------------------------------------------------------------

BF16_ON_CPU = (
    "On a CPU bf16 is not the fast path it is on a GPU: matmuls in bf16 are fast only with native "
    "instructions (AMX, AVX-512 BF16) and take a slow path without them, autocast adds a cast of every "
    "matmul's inputs, and much of a tiny model's step is elementwise work; these ratios show that the bf16 "
    "path runs, not what bf16 gains on a GPU."
)


def verdict_counts(rows: list[F.Pair], phase: str) -> str:
    """'faster beyond the noise in 14 of 18 cells, slower in 3 (a, b and c) and within the noise in 1 (d)'."""
    by = {v: [r for r in rows if r.verdict(phase) == v] for v in ("faster", "slower", "within noise")}
    others = [
        f"{word} in {len(by[v])}" + (f" ({names(r.label for r in by[v])})" if len(by[v]) <= 4 else "")
        for v, word in (("slower", "slower"), ("within noise", "within the noise"))
        if by[v]
    ]
    text = f"faster beyond the noise in {len(by['faster'])} of {count(len(rows), 'cell')}"
    return text + (", " + " and ".join(others) if others else "")


def precision_answer(p: F.PrecisionFacts) -> str:
    first = f"bf16 autocast makes the training step {verdict_counts(p.judged, 'step')}."
    if p.cpu:
        return sentence(first, BF16_ON_CPU)
    medians = {m: statistics.median(v) for m, v in p.by_size.items()}
    trend = (
        f"The speed-up {'grows' if p.grows_with_size else 'does not grow'} with size beyond the noise, comparing the "
        "smallest and largest size at each context (median over contexts: "
        + ", ".join(f"{m} {T.num(v, 2)}×" for m, v in medians.items())
        + ")"
        + (f"; from {p.faster_from} on bf16 is faster at every context." if p.faster_from else ".")
    )
    host = p.host_bound
    why = (
        f"In {names(r.label for r in host)} the GPU is busy under {HOST} of the bf16 step: host-bound, so faster matmuls shorten it little."
        if host
        else ""
    )
    return sentence(first, trend if len(medians) > 1 else "", why)


def section_mixed_precision(records: list[dict], grid: dict, device: str) -> str:
    warmup = default_warmup(grid, records)
    p = F.precision_facts(records, warmup, device == "cpu")
    head = "### (c) bf16 mixed precision in the end-to-end benchmark"
    if not p.judged:
        return blocks(
            head, "No cell was measured in both fp32 and bf16 on this device.", source(records, device, "e2e")
        )
    full = T.precision_table(p)
    return blocks(
        head,
        precision_answer(p),
        f"`torch.autocast(dtype=torch.bfloat16)` around forward and loss, fp32 parameters and optimizer, {warmup} "
        "warm-up steps. Training-step speed-up from bf16 (fp32 time / bf16 time; ≈: within the noise):",
        T.md(T.precision_pivot(p)),
        "<details><summary>Forward, backward and step times</summary>\n\n" + T.md(full) + "\n\n</details>",
        T.unstable_note(full),
        figure_line(device, "precision_speedup", "bf16 training-step speed-up per size"),
        source(records, device, "e2e"),
    )


# -- torch_compile (b) ------------------------------------------------------------------------------

SCOPE_HEAD = {
    "blocks": "### (b) The model under `torch.compile`, block by block",
    "model": "### (b) The whole model under `torch.compile`",
}
SCOPE_WORDS = {
    "blocks": "block by block (`torch.compile` of each Transformer block and of the final norm, "
    "`lmperf.kinds.e2e.cell.compile_blocks`; the embedding, output projection and loss stay eager)",
    "model": "as one graph (`torch.compile` of the whole model)",
}
# what one cell's compile time covers, by scope
COMPILED_GRAPHS = {
    "blocks": "one block's graph (all blocks share it) and the final norm's",
    "model": "the whole model's graphs",
}


def compile_job_text(c: F.CompileFacts, scope: str) -> str:
    if not c.job_cells:
        return "Compilation happens in the warm-up steps, so no measured step includes it."
    wall = f", {T.num(c.job_wall_s / 60, 1)} min in all" if c.job_wall_s is not None else ""
    at_once = f"up to {count(c.job_at_once, 'cell')} at once" if c.job_at_once else "several cells at once"
    train = T.span(c.job_training_s, " s", 1) if c.job_training_s else "— (none completed)"
    infer = T.span(c.job_inference_s, " s", 1) if c.job_inference_s else "— (none completed)"
    return (
        f"Compiling happens before the measured cells, cold, in a job of its own ({at_once}{wall}; records in "
        f"`e2e_compile/`): per cell, compiling {COMPILED_GRAPHS.get(scope, 'the compiled graphs')} took {train} "
        f"for training (forward and backward) and {infer} for the no-grad forward (Dynamo's compile time). The "
        f"measured cells then loaded the compiled graphs from the on-disk cache ({len(c.loaded)} of "
        f"{len(c.rows)} records count cache hits), so no measured step includes compiling."
    )


def compile_answer(c: F.CompileFacts, scope: str) -> str:
    step, infer = F.judged(c.rows, "step"), F.judged(c.rows, "inference")
    if not (step and infer):
        return "No compiled cell has an eager cell of the same coordinates to compare with."
    first = (
        f"Compiled {SCOPE_WORDS.get(scope, 'with the compile scopes of the table’s records')}, the training step "
        f"(forward, backward, AdamW) is {verdict_counts(step, 'step')} ({T.span([r.speedup('step').median for r in step])}); "
        f"the inference forward is {verdict_counts(infer, 'inference')} "
        f"({T.span([r.speedup('inference').median for r in infer])})."
    )
    per_size: dict[str, list[float]] = {}
    for r in step:
        per_size.setdefault(r.model, []).append(r.speedup("step").median)
    sizes = ", ".join(f"{m} {T.num(statistics.median(v), 2)}×" for m, v in per_size.items())
    oom = c.training_oom
    return sentence(
        first,
        f"Median training-step speed-up per size: {sizes}." if len(per_size) > 1 else "",
        f"{names(r.label for r in oom)} run out of memory for a compiled training step"
        + (", as eager does." if all(r.times["step"][0] is None for r in oom) else ".")
        if oom
        else "",
        f"Not compiled at context {names(map(str, c.uncompiled))} (eager only)." if c.uncompiled else "",
    )


def section_compile(records: list[dict], grid: dict, device: str) -> str:
    c = F.compile_facts(records, default_warmup(grid, records))
    scope = next(iter(c.scopes)) if len(c.scopes) == 1 else "mixed"
    head = SCOPE_HEAD.get(scope, "### (b) The model under `torch.compile`")
    if not c.rows:
        return blocks(head, "No compiled cell was measured on this device.", source(records, device, "e2e"))
    mixed = "The compiled cells' records differ in how they compiled: " + ", ".join(
        f"{n} {SCOPE_WORDS.get(s, s).split(' (')[0]}" for s, n in sorted(c.scopes.items())
    )
    table = T.compile_table(c)
    return blocks(
        head,
        sentence(compile_answer(c, scope), mixed + "." if scope == "mixed" else ""),
        compile_job_text(c, scope),
        T.md(table),
        T.unstable_note(table),
        figure_line(device, "compile", "compiled against eager training-step speed-up per size"),
        source(records, device, "e2e"),
        source(records, device, "e2e_compile") if c.job_cells else "",
    )


# -- timer_check ------------------------------------------------------------------------------------


def timer_answer(t: F.TimerFacts) -> str:
    worst, cell, phase = t.worst
    samples, agreeing = len(t.deviations), t.agreeing_samples
    first = (
        f"The step timer {'agrees' if agreeing == samples else 'does not always agree'} with CUDA events: over "
        f"{samples} phase samples longer than {F.TIMER_CHECK_MIN_MS:.0f} ms in {t.compared_cells} of the {t.cells} "
        f"cells of the course's model, the median deviation (timer / events − 1) is "
        f"{T.pct(statistics.median(t.deviations), 2)} and the worst {T.pct(worst, 2)} ({cell}, {phase.replace('_', ' ')})."
    )
    within = T.pct(F.TIMER_AGREE_SHARE, 0)
    share = (
        f"Every (cell, phase) series stays within {within}."
        if agreeing == samples
        else f"The series whose every sample is within {within} hold {agreeing} of the {samples} samples "
        f"({T.pct(agreeing / samples)})."
    )
    left = (
        f"The {count(t.left_out_cells, 'cell')} with another attention ({', '.join(f'`{n}`' for n in t.left_out)}) "
        "are left out."
        if t.left_out_cells
        else ""
    )
    return sentence(first, share, left)


def section_timer_check(records: list[dict], device: str) -> str:
    head = "### Step timer against CUDA events"
    if device == "cpu":
        return blocks(head, "Not measured on a CPU: it has no CUDA events to compare the step timer with.")
    t = F.timer_facts(records)
    if not t.series:
        return blocks(
            head, f"No record of this device has CUDA-event samples longer than {F.TIMER_CHECK_MIN_MS:.0f} ms."
        )
    return blocks(head, timer_answer(t), T.md(T.timer_table(t)), source(records, device, "e2e"))


# -- flash_benchmarking: the whole model --------------------------------------------------------------


def attention_answer(rows: tuple[F.AttentionRow, ...]) -> str:
    parts = []
    for name in sorted({r.attention for r in rows} - {"plain"}):
        mine = [r for r in rows if r.attention == name and r.verdict("step")]
        if mine:
            peaks = [r.peak_ratio for r in mine if r.peak_ratio is not None]
            parts.append(
                f"With `{name}` in every layer the training step is {verdict_counts(mine, 'step')} against plain's "
                f"(speed-up {T.span([r.speedup('step').median for r in mine])})"
                + (f", at {T.span(peaks)} its peak memory." if peaks else ".")
            )
    return sentence(*parts)


def section_attention_in_model(records: list[dict], device: str) -> str:
    head = "### In the whole model"
    rows = F.attention_rows(records)
    if not rows:
        return blocks(head, "No cell of this device runs the whole model with another attention than plain.")
    what = (
        "The end-to-end cell (`python -m lmperf.kinds.e2e.cell --attention NAME`) with each attention in every "
        "layer, against the same cell with the course's `plain` attention; `flash` is "
        "`lmperf.kernels.flash.flash_attention`: "
        + ("the tiled PyTorch version on a CPU." if device == "cpu" else "our Triton kernels.")
    )
    table = T.attention_table(rows)
    return blocks(
        head, attention_answer(rows), what, T.md(table), T.unstable_note(table), source(records, device, "e2e")
    )


# -- main -------------------------------------------------------------------------------------------

WRITERS = {
    "benchmarking_script": section_benchmarking_script,
    "benchmarking_mixed_precision_c": section_mixed_precision,
    "torch_compile_b": section_compile,
    "timer_check": lambda records, grid, device: section_timer_check(records, device),
    "flash_benchmarking_model": lambda records, grid, device: section_attention_in_model(records, device),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", required=True)
    p.add_argument("--out", required=True, help="results/<device>: tables/, figures/ and sections/ go under it")
    p.add_argument("--grid", default="{}", help="the kind's config slice as JSON")
    p.add_argument("--records", nargs="*", default=[], help="e2e and e2e_compile records")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    grid = json.loads(args.grid)
    records = [r for r in (load_record(p) for p in sorted(args.records)) if r["kind"] in ("e2e", *ALSO_READS)]
    out = Path(args.out)
    measured = any(r["kind"] == "e2e" for r in records)
    for folder in ("sections", "tables"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    for name in SECTIONS:
        text = WRITERS[name](records, grid, args.device) if measured else NOT_MEASURED
        (out / "sections" / f"{name}.md").write_text(text)
    for name in TABLES:
        T.records_frame([r for r in records if r["kind"] == name]).to_csv(out / "tables" / f"{name}.csv", index=False)
    warmup = default_warmup(grid, records)
    ctx = sweep_context(grid, records, warmup) if measured else None
    figures.draw_all(
        out / "figures",
        F.timing_facts(records, warmup),
        F.warmup_facts(records, warmup, ctx) if ctx is not None else None,
        F.precision_facts(records, warmup, args.device == "cpu"),
        F.compile_facts(records, warmup),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
