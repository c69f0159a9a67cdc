"""Report of the end-to-end cells: benchmarking_script (a)-(c), benchmarking_mixed_precision (c),
torch_compile (b), the step timer against CUDA events, and the whole model with each attention: each
section the answer first (a template filled from ``facts``), then its table and figure (a panel per context,
sizes along x, 95% intervals as error bars). No torch here. In its tables a time prints as its median with
its 95% interval over trials (``56.2 [55.9, 56.6]``, units in the column name), † where unstable; a comparison
as its ratio and its ``stats.compare`` verdict.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from lmperf.core import trials as trial_rules
from lmperf.core.stats import UNSTABLE_WIDTH, Estimate, ratio
from lmperf.kinds.e2e import facts as F
from lmperf.report import common as C
from lmperf.report.common import listing as names

ALSO_READS = ("e2e_compile",)
TABLES = ("e2e", "e2e_compile")
FIGURES = ("phase_times", "precision_speedup", "compile")
FIGURE = "figures/e2e_{}.png"  # a figure's path under --out
NOT_MEASURED = "_The end-to-end cells were not measured on this device._\n"
# the thresholds as the prose names them
LOW, HOST, GPU_BOUND, WIDE = (
    C.pct(x, 0) for x in (F.LOW_CV, F.HOST_BOUND_BUSY, trial_rules.GPU_BOUND_BUSY, UNSTABLE_WIDTH)
)
WARMUP_WHY = {
    "cuda": "The first steps pay one-time costs: loading kernels into the CUDA context, cuBLAS handles and "
    "algorithm selection, the caching allocator's first `cudaMalloc` calls, and AdamW creating its state.",
    "cpu": "The first steps pay one-time costs: the allocator and thread pools growing to size, first-touch "
    "page faults on fresh buffers, dispatch caches filling, and AdamW creating its state.",
}
BF16_ON_CPU = (
    "On a CPU bf16 is not the fast path it is on a GPU: without native instructions (AMX, AVX-512 BF16) its "
    "matmuls are slow, and autocast adds a cast of every matmul's inputs; these ratios show that the bf16 "
    "path runs, not what bf16 gains on a GPU."
)

DASH, OOM = "—", "out of memory"
VERDICT_MARK = {"faster": "faster", "slower": "slower", "within noise": "≈"}
SHORT = {"forward": "fwd", "backward": "bwd", "step": "step", "inference": "inference fwd"}


def share(e: Estimate | None) -> str:
    """A fraction's estimate in percent: ``38% [35%, 41%]``, its interval (a few trials' may pass 100%) within 0–100%."""
    interval = f" [{max(e.low, 0):.0%}, {min(e.high, 1):.0%}]" if e and e.low is not None else ""
    return DASH if e is None else f"{e.median:.0%}{interval}"


def speedup(row: F.Pair, phase: str) -> str:
    """A row's speed-up in ``phase``: ``1.55× faster`` (≈: within the noise)."""
    word = row.verdict(phase)
    return DASH if word is None else f"{C.est(row.speedup(phase), 2, '×')} {VERDICT_MARK[word]}"


def host(row: F.Pair, names: tuple[str, str] | None = None) -> str:
    """The ``host-bound`` column: ``host-bound`` (of a pair, which ways), ``no``, or — where not measured."""
    bound = [F.host_bound(b) for b in row.busy]
    if names is None:  # one cell: the other side
        return {True: "host-bound", False: "no", None: DASH}[bound[1]]
    return DASH if bound == [None, None] else " and ".join(n for n, b in zip(names, bound) if b) or "no"


def md(rows) -> str:
    """A markdown table of the rows' strings as given; columns with nothing measured (all —) left out."""
    df = pd.DataFrame(rows).fillna(DASH).astype(str)
    return "_(no records)_" if df.empty else C.md_table(df[[c for c in df.columns if not (df[c] == DASH).all()]])


def timing_table(t: F.TimingFacts) -> Iterator[dict]:
    for r in t.rows:
        m, params = r.metrics, r.metrics.get("parameter_count")
        row = {"model": r.model, "parameters (M)": C.num(params and params / 1e6, 1), "context": str(r.context_length)}
        for phase, (_, e) in r.times.items():
            row[f"{phase} (ms, mean ± std)"] = f"{C.est(e)} ± {C.num(r.stds.get(phase))}" if e else OOM
        row.update({f"{SHORT[p]} CV": C.pct(v) for p, v in r.cvs.items()})
        row |= {"GPU busy": share(r.busy[1]), "host-bound": host(r)}
        yield row | {"MFU (train)": C.pct(m.get("training_step_mfu"))}


def warmup_table(w: F.WarmupFacts) -> Iterator[dict]:
    for r in w.rows:
        row = {"model": r.model, "warm-up steps": str(r.warmup_steps)}
        for phase, (_, e) in r.times.items():
            row.update({f"{phase} (ms, mean)": C.est(e), f"{SHORT[phase]} CV": C.pct(r.cvs[phase])})
            row[f"{phase} vs {w.default} warm-up"] = r.verdict(phase) or DASH
        yield {**row, "fwd 1st / median": C.num(r.first_over_median), "host-bound": host(r)}


def precision_pivot(p: F.PrecisionFacts) -> list[dict]:
    """Training-step speed-up from bf16 (fp32 / bf16), a row per size and a column per context."""
    cells: dict[str, dict[str, str]] = {}
    for r in p.rows:
        cells.setdefault(r.model, {"model": r.model})[f"ctx {r.context_length}"] = speedup(r, "step")
    return list(cells.values())


def pair_table(rows, ways: tuple[str, str], extra=lambda r: {}) -> Iterator[dict]:
    """Per row: its cell, ``extra(row)``, each phase's time either way and the speed-up, host-bound."""
    for r in rows:
        precision = {} if "fp32" in ways else {"precision": r.precision}  # unless the precision is what differs
        row = {"model": r.model, "context": str(r.context_length), **precision, **extra(r)}
        for phase, times in r.times.items():
            row.update({f"{SHORT[phase]} {way} (ms)": C.est(e, missing=OOM) for way, e in zip(ways, times)})
            row[f"{SHORT[phase]} speed-up"] = speedup(r, phase)
        yield {**row, "host-bound": host(r, ways)}


def compile_columns(r: F.CompileRow) -> dict:
    """pair_table's extra columns of a compiled row: the compile job's cold compile times."""
    return {f"compile, {p} (s)": C.num(r.cold.get(f"{p}_compile_s")) for p in ("training", "inference")}


def attention_columns(r: F.AttentionRow) -> dict:
    """pair_table's extra columns of another attention's row: which, and its training peak against plain's."""
    peak, peak_ratio = C.num(r.peak_mib[1], 0), C.num(r.peak_ratio)
    return {"attention": r.attention, "training peak (MiB)": peak, "peak / plain's": peak_ratio}


def timer_table(series: dict) -> Iterator[dict]:
    for phase in F.TIMER_PHASES:
        if devs := sorted(d for (_, p), s in series.items() if p == phase for d in s):
            row = {"phase": phase.replace("_", " "), f"samples over {F.TIMER_CHECK_MIN_MS:.0f} ms": str(len(devs))}
            row["median deviation (%)"] = f"{100 * devs[len(devs) // 2]:.2f}"
            yield {**row, "worst absolute deviation (%)": f"{100 * max(map(abs, devs)):.2f}"}


def records_frame(records: list[dict]) -> Iterator[dict]:
    """One row per record: its cell, attention, status, trials and every scalar metric; an interval
    ``x_interval`` as ``x_low`` and ``x_high``; sorted as the report's tables."""
    for r in sorted(records, key=lambda r: (C.model_rank(r["cell"]["model"]), *r["cell"].values(), F.attention_of(r))):
        row = {**r["cell"], "attention": F.attention_of(r), "status": r["status"], "reason": r.get("reason")}
        for name, value in r["metrics"].items():
            if name.endswith("_interval") and isinstance(value, list):
                row[name.replace("_interval", "_low")], row[name.replace("_interval", "_high")] = value
            elif value is None or isinstance(value, (int, float, str, bool)):
                row[name] = value
        yield {**row, "trials": F.trials(r)}


def outputs(grid: dict) -> list[str]:
    """Every table and figure this report writes, relative to ``--out`` (the same whatever the records)."""
    return [f"tables/{name}.csv" for name in TABLES] + [FIGURE.format(name) for name in FIGURES]


def sentence(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def verdict_counts(rows: list[F.Pair], phase: str, short: bool = False) -> str:
    """'faster beyond the noise in 14 of 18 cells, slower in 3 (a, b and c) and within the noise in 1 (d)' with
    the speed-ups' range: '(1.11×–1.84×)'; ``short``: 'faster in 14, slower in 3, within the noise in 1 of 18 cells'."""
    by = {v: [r.label for r in rows if r.verdict(phase) == v] for v in C.VERDICT_WORDS}
    cells, span = C.count(len(rows), "cell"), C.span([r.speedup(phase).median for r in rows])
    if short:
        return f"{C.verdicts_said(C.count_verdicts(r.verdict(phase) for r in rows))} of {cells} ({span})"
    parts = []  # the verdicts met, the first out of all cells; the cells named unless faster or many
    for v, labels in ((v, labels) for v, labels in by.items() if labels):
        first = not parts
        part = C.VERDICT_WORDS[v] + (" beyond the noise" if first and v != "within noise" else "")
        part += f" in {len(labels)}" + (f" of {cells}" if first else "")
        parts.append(part + (f" ({names(labels)})" if v != "faster" and len(labels) <= 4 else ""))
    return parts[0] + (", " + names(parts[1:]) if parts[1:] else "") + f" ({span})"


def pair_summary(rows: list[F.Pair], phase: str) -> str:
    """Verdict counts with the speed-ups' range, and the largest cell's ratio with its interval: '2.84× [2.80,
    2.88] faster'; a slowdown as one: '1.47× [1.30, 1.69] slower'; else '(within the noise)'."""
    last, verdict = rows[-1], rows[-1].verdict(phase)
    base, other = last.times[phase]
    e = ratio(other, base) if verdict == "slower" else last.speedup(phase)  # a slowdown as other / base
    said = {"faster": "faster", "slower": "slower"}.get(verdict, "(within the noise)")
    return f"{verdict_counts(rows, phase, short=True)}; {last.label} {C.est(e, unit='×')} {said}"


def figure_line(device: str, name: str, alt: str) -> str:
    """A figure as linked from ``report/<device>/answers.md``."""
    return f"![{alt}]({C.link(device, FIGURE.format(name))})"


def source(records: list[dict], device: str, kind: str = "e2e") -> str:
    return C.source_line([r for r in records if r["kind"] == kind], device)


def timing_answer(t: F.TimingFacts) -> str:
    ok, noisy, oom = t.ok, t.noisy, [r.label for r in t.rows if not r.training_ok]
    if not ok:
        return "No fp32 training step was measured at the default warm-up on this device."
    fast, slow = min(ok, key=F.PhaseRow.forward_ms), max(ok, key=F.PhaseRow.forward_ms)
    forward = f"{C.est(fast.times['forward'][1])} ms ({fast.label})"
    forward += f" to {C.est(slow.times['forward'][1])} ms ({slow.label})" if slow is not fast else ""
    ratios = [r.times["backward"][1].median / r.forward_ms() for r in ok]
    cvs, high = [r.cv for r in ok if r.cv is not None], ", ".join(f"{r.label} ({C.pct(r.cv)})" for r in noisy)
    spread = f"{LOW} or more in {len(noisy)} of {C.count(len(cvs), 'cell')}: {high}" if noisy else "under " + LOW
    measured = [r for r in ok if r.busy[1] is not None]
    host = [r for r in measured if F.host_bound(r.busy[1])]
    busy = C.span([100 * r.busy[1].median for r in (host or measured)], "%", 0) if measured else ""
    bound = f"The GPU is busy {busy} of the step in every measured cell: none is host-bound."
    if host:
        bound = f"The GPU is busy under {HOST} of the step in {names(r.label for r in host)} ({busy}): host-bound, the time depends on the CPU."
    unstable = names(r.label for r in ok if r.unstable)
    trials = f"Each time is the median over up to {t.trials} trials (separate processes) with its 95% interval"
    trials += f"; unstable (interval wider than {WIDE} of the median): {unstable}." if unstable else "."
    if t.gpu_bound_at_two:
        trials += (
            f" {C.count(t.gpu_bound_at_two, 'cell')} of the grid stopped at two trials: the GPU was busy at least "
            f"{GPU_BOUND} of the step in both, and the 95% interval of their training step time was narrower than "
            f"{WIDE} of its median."
        )
    if t.trials == 1:
        trials = "Each cell is one trial (one process): no time carries an interval, the spread between processes is not measured."
    return sentence(
        f"With {t.warmup_steps} warm-up steps (fp32), a forward takes {forward} and a backward {C.span(ratios)} the "
        f"forward (median {C.num(statistics.median(ratios), 2)}×).",
        f"{names(oom)} run out of memory for a training step." if oom else "",
        f"Variability over the measured steps (± std and CV, std/mean: a trial's, the median over its trials) is {spread}."
        if cvs
        else "",
        bound if measured else "",
        trials,
    )


def warmup_answer(w: F.WarmupFacts, device: str) -> str:
    cold, few = w.judged(fewer=False), w.judged(fewer=True)
    firsts = [r.first_over_median for r in cold if r.first_over_median is not None]
    slower = [r for r in cold if r.verdict("forward") == "slower"]
    without = "Without warm-up " + (
        f"the first measured forward takes {C.span(firsts)} the median of the others, and " if firsts else ""
    )
    without += f"the mean forward is slower than with {w.default} warm-up steps beyond the noise for {len(slower) or 'none'} of {C.count(len(cold), 'size')}."
    differ = [r for r in few if r.verdict("forward") != "within noise"]
    counts = " or ".join(str(n) for n in sorted({r.warmup_steps for r in few}))
    fewer = f"With {counts} warm-up step{'s' * (counts != '1')} it is within the noise of {w.default}'s in {len(few) - len(differ) or 'none'} of {C.count(len(few), 'cell')}"
    fewer += "".join(f"; {r.model} after {r.warmup_steps} is {r.verdict('forward')}" for r in differ) + "."
    return sentence(without if cold else "", fewer if few else "", WARMUP_WHY["cpu" if device == "cpu" else "cuda"])


def section_benchmarking_script(records: list[dict], grid: dict, device: str) -> str:
    t = F.TimingFacts(records, grid["warmup_steps"])
    ctx = (grid.get("warmup_sweep") or {}).get("context_lengths", [None])[0]
    w = F.WarmupFacts(records, t.warmup_steps, ctx)
    summary = "No fp32 training step was measured at the default warm-up here."
    if t.ok:
        slow = max(t.ok, key=F.PhaseRow.forward_ms)
        fwd, bwd = slow.times["forward"][1], slow.times["backward"][1]
        firsts = [r.first_over_median for r in w.judged(fewer=False) if r.first_over_median is not None]
        summary = (
            f"{slow.model} forward {C.est(fwd, unit=' ms')} at context {slow.context_length}; backward "
            f"{C.num(bwd.median / fwd.median, 1)}× the forward"
            + (f"; without warm-up the first forward takes {C.span(firsts, digits=1)} the rest." if firsts else ".")
        )
    s = next(r["provenance"]["settings"] for r in records if r["kind"] == "e2e")
    sync = (
        "calling `torch.cuda.synchronize()` after each; one more training step then runs under `torch.profiler`, and "
        f"a cell whose kernels fill under {HOST} of a measured step (`GPU busy`) is marked host-bound"
        if device != "cpu"
        else "on the CPU (nothing to synchronize; no CUDA events, GPU busy share, peak memory or MFU here)"
    )
    sweep = ["No warm-up sweep was measured on this device."]
    if w.rows:
        sweep = [
            warmup_answer(w, device),
            md(warmup_table(w)),
            "`1st / median`: the first measured step over the median of the others; the verdicts compare each mean "
            f"with the {w.default}-warm-up cell's.",
        ]
    return C.blocks(
        C.summary(summary),
        "### (a) The benchmark\n\n`python -m lmperf e2e` builds a model of the given size and a random batch "
        f"(batch {s['batch_size']}, vocabulary {s['vocab_size']}), runs `w` warm-up steps, then times each phase "
        f"of `n` steps (forward with the loss, backward, AdamW step) with `timeit.default_timer`, {sync}. "
        "Inference forwards under `torch.no_grad` follow, timed the same way. Each trial of a cell is a process "
        f"of its own (`results/{device}/e2e/`).",
        f"### (b) Forward and backward, {t.warmup_steps} warm-up steps",
        timing_answer(t),
        md(timing_table(t)),
        figure_line(device, "phase_times", "forward and backward time per size"),
        f"Every phase, inference included, in the [full table]({C.link(device, 'tables/e2e.csv')}).",
        "### (c) Fewer warm-up steps" + (f" (context {ctx}, fp32)" if w.rows else ""),
        *sweep,
        source(records, device),
    )


def section_mixed_precision(records: list[dict], grid: dict, device: str) -> str:
    p = F.PrecisionFacts(records, grid["warmup_steps"])
    head = "### (c) bf16 mixed precision in the end-to-end benchmark"
    if not p.judged:
        return C.blocks(head, "No cell was measured in both fp32 and bf16 on this device.", source(records, device))
    trend = "Median speed-up per size: " + ", ".join(f"{m} {C.num(v, 2)}×" for m, v in p.by_size.items()) + "."
    trend += f" From {p.faster_from} on bf16 is faster at every context." if p.faster_from else ""
    host = [r.label for r in p.judged if F.host_bound(r.busy[1])]
    why = f"In {names(host)} the GPU is busy under {HOST} of the bf16 step: host-bound, so faster matmuls shorten it little."
    return C.blocks(
        C.summary(f"bf16 autocast: the training step is {pair_summary(p.judged, 'step')}."),
        head,
        sentence(
            f"bf16 autocast makes the training step {verdict_counts(p.judged, 'step')}.",
            BF16_ON_CPU if device == "cpu" else trend,
            why if host else "",
        ),
        f"`torch.autocast(dtype=torch.bfloat16)` around forward and loss, fp32 parameters and optimizer, {grid['warmup_steps']} "
        "warm-up steps. Training-step speed-up from bf16 (fp32 time / bf16 time; ≈: within the noise):",
        md(precision_pivot(p)),
        C.details("Forward, backward and step times", md(pair_table(p.rows, ("fp32", "bf16")))),
        figure_line(device, "precision_speedup", "bf16 training-step speed-up per size"),
        source(records, device),
    )


def section_compile(records: list[dict], grid: dict, device: str) -> str:
    c = F.CompileFacts(records, grid["warmup_steps"])
    head = "### (b) The model under `torch.compile`, block by block"
    step, infer = F.judged(c.rows, "step"), F.judged(c.rows, "inference")
    if not (step and infer):
        return C.blocks(
            head, "No compiled cell has an eager cell of the same coordinates to compare with.", source(records, device)
        )
    oom = [r for r in c.rows if r.times["step"][1] is None]
    oom_text = f"{names(r.label for r in oom)} run out of memory for a compiled training step"
    oom_text += ", as eager does." if all(r.times["step"][0] is None for r in oom) else "."
    train, no_grad = (
        C.span(c.cold(p), " s", 1) if c.cold(p) else "— (none completed)" for p in ("training", "inference")
    )
    at_once = ""  # what the compile records say of their concurrency
    if c.at_once > 1:
        at_once = f", up to {c.at_once} at once"
    elif c.at_once == 1 and c.job_cells > 1:
        at_once = ", one at a time"
    job = (
        "Compiling happens before the measured cells, cold, in a job of its own that compiled "
        f"{C.count(c.job_cells, 'cell')}{at_once} (records in `e2e_compile/`): compiling one block's graph (all blocks "
        f"share it) and the final norm's took {train} per cell for training and {no_grad} for the no-grad forward "
        "(Dynamo's compile time). A measured cell loads the graphs from the on-disk cache where its machine has them "
        f"({len(c.loaded)} of {C.count(len(c.rows), 'record')} count{'s' * (len(c.loaded) == 1)} cache hits), else "
        "compiles them; either way in its warm-up steps, and no measured step compiles."
    )
    answer = sentence(
        "Compiled block by block (`torch.compile` of each Transformer block and of the final norm; the embedding, "
        f"output projection and loss stay eager), the training step is {verdict_counts(step, 'step')}; the "
        f"inference forward is {verdict_counts(infer, 'inference')}.",
        oom_text if oom else "",
        f"Not compiled (eager only): {names(c.uncompiled)}." if c.uncompiled else "",
    )
    return C.blocks(
        C.summary(f"Compiled block by block, the training step is {pair_summary(step, 'step')}."),
        head,
        answer,
        job if c.job_cells else "Compilation happens in the warm-up steps, so no measured step includes it.",
        md(pair_table(c.rows, ("eager", "compiled"), compile_columns)),
        figure_line(device, "compile", "compiled against eager training-step speed-up per size"),
        source(records, device),
        source(records, device, "e2e_compile") if c.job_cells else "",
    )


def section_timer_check(records: list[dict], grid: dict, device: str) -> str:
    head = "### Step timer against CUDA events"
    series = F.timer_deviations(records)
    if device == "cpu":
        return "Not measured here: a CPU has no CUDA events to check the step timer against.\n"
    if not series:
        return C.blocks(head, "Not measured here: no record has CUDA-event samples to compare the step timer with.")
    devs = [d for s in series.values() for d in s]
    worst, cell, phase = max((abs(d), cell, phase) for (cell, phase), s in series.items() for d in s)
    within, median = sum(abs(d) <= F.TIMER_AGREE_SHARE for d in devs), C.pct(statistics.median(devs), 2)
    answer = (
        f"The step timer {'agrees' if within == len(devs) else 'does not always agree'} with CUDA events: over "
        f"{len(devs)} phase samples longer than {F.TIMER_CHECK_MIN_MS:.0f} ms in {len({c for c, _ in series})} of the "
        f"{len(F.course_cells(records))} cells of the course's model, the median deviation (timer / events − 1) is "
        f"{median} and the worst {C.pct(worst, 2)} ({cell}, {phase.replace('_', ' ')}); "
        f"{within} of them are within {C.pct(F.TIMER_AGREE_SHARE, 0)}."
    )
    said = f"within {C.pct(worst, 2)} over" if within == len(devs) else f"in {within} of"
    return C.blocks(
        C.summary(f"The step timer agrees with CUDA events {said} {len(devs)} phases (median deviation {median}).")
        + f"\n{head}",  # the summary on the heading's first line: the assembler drops it, the heading stays
        answer,
        md(timer_table(series)),
        source(records, device),
    )


def section_attention_in_model(records: list[dict], grid: dict, device: str) -> str:
    head = "### In the whole model"
    rows = F.attention_rows(records)
    if not rows:
        return C.blocks(head, "No cell of this device runs the whole model with another attention than plain.")
    parts, said = [], []
    for name in sorted({r.attention for r in rows}):
        mine = F.judged(r for r in rows if r.attention == name)
        peaks = [r.peak_ratio for r in mine if r.peak_ratio is not None]
        if mine:
            said.append(f"`{name}`: {verdict_counts(mine, 'step', short=True)}")
            parts.append(
                f"With `{name}` in every layer the training step is {verdict_counts(mine, 'step')} against plain's"
                + (f", at {C.span(peaks)} its peak memory." if peaks else ".")
            )
    what = (
        "The end-to-end cell with each attention in every layer (setting `attention`) against the same cell with the "
        "course's `plain`; `flash` is `lmperf.kernels.flash.flash_attention`: "
        + ("the tiled PyTorch version on a CPU." if device == "cpu" else "our Triton kernels.")
    )
    return C.blocks(
        C.summary(f"Whole model, training step against plain attention: {'; '.join(said)}."),
        head,
        sentence(*parts),
        what,
        md(pair_table(rows, ("plain", "other"), attention_columns)),
        source(records, device),
    )


WRITERS = {
    "benchmarking_script": section_benchmarking_script,
    "benchmarking_mixed_precision_c": section_mixed_precision,
    "torch_compile_b": section_compile,
    "timer_check": section_timer_check,
    "flash_benchmarking_model": section_attention_in_model,
}
SECTIONS = list(WRITERS)


def write(records: list[dict], grid: dict, device: str, out: Path) -> None:
    records = [r for r in records if r["kind"] in ("e2e", *ALSO_READS)]
    measured = any(r["kind"] == "e2e" for r in records)
    for name, section in WRITERS.items():
        C.write_text(out / "sections" / f"{name}.md", section(records, grid, device) if measured else NOT_MEASURED)
    for name in TABLES:
        C.write_csv(records_frame(r for r in records if r["kind"] == name), out / "tables" / f"{name}.csv")
    w = grid.get("warmup_steps")
    phases = {p: (lambda r, p=p: r.times[p][1]) for p in F.STEP_PHASES}
    step = {"training step": lambda r: r.speedup("step")}
    for name, rows, lines, ylabel in (
        ("phase_times", F.TimingFacts(records, w).ok, phases, f"ms (fp32, {w} warm-up steps)"),
        ("precision_speedup", F.PrecisionFacts(records, w).judged, step, "speed-up (fp32 / bf16)"),
        ("compile", F.judged(F.CompileFacts(records, w).rows), step, "speed-up (eager / compiled)"),
    ):
        draw(out / FIGURE.format(name), rows, lines, ylabel, log=name == "phase_times")


def draw(path: Path, rows, lines: dict, ylabel: str, log: bool) -> None:
    """A panel per context, sizes along x, a line per ``lines`` entry (label -> row -> Estimate or None), error bars."""
    contexts = sorted({r.context_length for r in rows})
    if not contexts:
        return C.empty_figure(path, "nothing measured to draw")
    fig, axes = C.figure(1, len(contexts))
    for ax, ctx in zip(axes[0], contexts):
        for label, value in lines.items():
            points = [(r.model, e) for r in rows if r.context_length == ctx and (e := value(r)) is not None]
            if points:
                bars = [(e.median - e.low, e.high - e.median) if e.low is not None else (0, 0) for _, e in points]
                medians = [e.median for _, e in points]
                ax.errorbar([m for m, _ in points], medians, yerr=list(zip(*bars)), marker="o", capsize=3, label=label)
        ax.set(title=f"context {ctx}", xlabel="model", yscale="log" if log else "linear")
        ax.tick_params(axis="x", rotation=45)
        if not log:
            ax.axhline(1.0, color="grey", lw=0.8)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=8)
    C.save(fig, path)


main = C.report_cli(__doc__, write)

if __name__ == "__main__":
    raise SystemExit(main())
