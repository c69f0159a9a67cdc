"""The answers of memory_profiling (a)-(e): short templates filled from the facts, each followed by
its table and figure. Links are written as seen from ``report/<device>/answers.md``.
"""

from __future__ import annotations

from lmperf.core import stats
from lmperf.kinds.memory import bf16 as B
from lmperf.kinds.memory import facts as F
from lmperf.kinds.memory import tables as T
from lmperf.kinds.memory.allocations import ResidualFacts, TopFacts
from lmperf.kinds.memory.figures import timeline_name

# Why a training step peaks where it does, by the phase of its peak.
PHASE_WHY = {
    "optimizer_step": "parameters, gradients, AdamW's two moments and its update temporary are live together",
    "backward": "the activations saved for backward are still live as the gradients fill in",
    "forward": "the forward's saved activations and working set are live",
    "zero_grad": "the gradients are still live",
}


def blocks(*parts: str) -> str:
    """Markdown blocks separated by one blank line, ending in one newline; empty parts dropped."""
    return "\n\n".join(p.strip("\n") for p in parts if p and p.strip("\n")) + "\n"


def fold(summary: str, *parts: str) -> str:
    body = blocks(*parts)
    return f"<details><summary>{summary}</summary>\n\n{body}\n</details>" if body.strip() else ""


def link(device: str, folder: str, name: str) -> str:
    return f"../../results/{device}/{folder}/{name}"


def image(device: str, alt: str, name: str) -> str:
    return f"![{alt}]({link(device, 'figures', name)})"


def span_gib(span: tuple[float, float] | None) -> str:
    """'4.85–28.42' GiB, or one value where both ends print the same."""
    if span is None:
        return "—"
    lo, hi = T.gib(span[0]), T.gib(span[1])
    return lo if lo == hi else f"{lo}–{hi}"


def listing(items) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1] if items else ""


def contexts_words(contexts) -> str:
    return ("context " if len(contexts) == 1 else "contexts ") + listing(contexts)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def unstable_note(table: str) -> str:
    """The meaning of the unstable mark, said once under a table that uses it."""
    if T.UNSTABLE_MARK not in table:
        return ""
    return f"{T.UNSTABLE_MARK} unstable: its 95% interval is wider than {T.pct(stats.UNSTABLE_WIDTH, 0)} of its median."


# -- (a) -----------------------------------------------------------------------------------------


def stages_answer(f: F.StageFacts, parameters_mib: float | None) -> str:
    out = []
    share = T.pct(F.VISIBLE_SHARE, 0)
    n, shown = len(f.training), sum(bool(r.visible) for r in f.training)
    if f.verdict == "yes":
        out.append(
            f"Yes: in every training cell ({shown} of {n}) each stage moves active memory by at least {share} of "
            f"the cell's peak. The forward raises it by {span_gib(f.forward_rise_mib)} GiB (what autograd saves "
            f"for backward); the backward releases it as it allocates the gradients and ends {span_gib(f.gradients_mib)} GiB "
            f"above the step's start; the optimizer step adds a {span_gib(f.step_transient_mib)} GiB transient "
            f"and zero_grad frees {span_gib(f.zero_grad_frees_mib)} GiB."
        )
    elif f.verdict is not None:
        hidden = sorted({h for r in f.training for h in r.hidden})
        out.append(
            f"{'Partly' if f.verdict == 'partly' else 'No'}: every stage moves active memory by at least {share} "
            f"of the peak in {shown} of {n} training cells; elsewhere these move it less: {', '.join(hidden)}."
        )
    if f.inference_base_mib is not None:
        params = f" ({T.gib(parameters_mib)} GiB of parameters, analytic)" if parameters_mib else ""
        out.append(
            f"A forward-only step stands on {span_gib(f.inference_base_mib)} GiB{params} and rises at most "
            f"{T.gib(f.inference_rise_mib)} GiB above it: each layer's activations are freed once the next "
            "layer has used them."
        )
    return " ".join(out)


def timeline_links(device: str, cells: list[dict]) -> list[str]:
    """One line per (model, context, precision): its timelines, the full step first."""
    by: dict[tuple, list[dict]] = {}
    for c in cells:
        by.setdefault((c["model"], c["precision"] != "fp32", c["context_length"], c["precision"]), []).append(c)
    lines = []
    for (model, _, ctx, precision), cs in sorted(by.items()):
        shown = " ".join(
            image(device, "full step" if c["mode"] == "training" else "forward only", timeline_name(c))
            for c in sorted(cs, key=lambda c: c["mode"] != "training")
        )
        lines.append(f"- {model}, context {ctx}, {precision}: {shown}")
    return lines


def section_a(records: list[dict], device: str, cells: list[dict], parameters_mib: float | None) -> str:
    f = F.stage_facts(records)
    ctx = max((c["context_length"] for c in cells), default=None)
    first = [c for c in cells if c["context_length"] == ctx and c["precision"] == "fp32"] or cells[:2]
    rest = [c for c in cells if c not in first]
    return blocks(
        "### (a) Active-memory timelines",
        stages_answer(f, parameters_mib),
        "\n".join(timeline_links(device, first)),
        T.md_table(T.stage_table(f)) if f.rows else "",
        fold(f"Timelines of the other {len(rest)} cells", "\n".join(timeline_links(device, rest))) if rest else "",
        "Each timeline is one step after warm-up, recorded with PyTorch's allocator history (Python stacks) and "
        "replayed from its trace: active memory against the allocator's event number. Marker allocations at "
        "each phase boundary place the phases in the allocation order itself, whatever the GPU's asynchrony.",
    )


# -- (b) -----------------------------------------------------------------------------------------


def peaks_answer(f: F.PeakFacts, batch: int | None) -> str:
    out = [
        f"Forward only, the peak is {span_gib(f.span('inference'))} GiB; a full training step peaks at "
        f"{span_gib(f.span('training'))} GiB" + (f" (batch {batch})." if batch else ".")
    ]
    by_phase = f.contexts_by_phase()
    if by_phase:
        parts = [
            f"in the {T.phase_name(phase)} at {contexts_words(ctxs)}"
            + (f" ({PHASE_WHY[phase]})" if phase in PHASE_WHY else "")
            for phase, ctxs in sorted(by_phase.items(), key=lambda kv: kv[1])
        ]
        out.append(f"The step peaks {listing(parts)}.")
    if f.analytic_error is not None:
        out.append(f"The analytic account predicts every training peak within {T.pct(f.analytic_error)}.")
    return " ".join(out)


def two_peaks_text(g: F.TwoPeaks | None) -> str:
    if g is None:
        return ""
    head = (
        f"The allocator's peak (`torch.cuda.max_memory_allocated`, whole blocks) reads above the replayed trace's "
        f"(requested bytes, the curve of (a)) by at most {T.gib(g.gap_mib)} GiB ({g.cell[2]}, context "
        f"{g.cell[1]}, {g.cell[3]}): {g.per_allocation_mib:.2f} MiB for each of the {g.live_allocations} "
        "allocations live at the peak, "
    )
    slack = f"{F.BLOCK_SLACK_MIB:g} MiB"
    if g.reconciled:
        return (
            head + f"within the {slack} per allocation that the caching allocator adds by handing out a block unsplit."
        )
    return head + f"more than the {slack} per allocation that block rounding explains: the two peaks do not reconcile."


def oom_text(f: F.PeakFacts) -> str:
    lines = [
        f"- {o.precision}, context {o.context}, {o.mode}: out of memory "
        + (
            "; ".join(
                f"in {T.phase_name(p)}, requesting {req:,.0f} MiB with {free:,.0f} MiB free" for p, req, free in o.where
            )
            if o.where
            else f"({o.reason})"
        )
        + "."
        for o in f.out_of_memory
    ]
    return ("Out of memory:\n\n" + "\n".join(lines)) if lines else ""


def composition_fold(rows: tuple[F.Composition, ...]) -> str:
    if not rows:
        return ""
    err = F.saved_error(rows)
    early = [
        f"{c.precision} at context {c.context}: {T.gib(c.live_mib['gradients'])} of its "
        f"{T.gib(c.account['gradients_mib'])} GiB"
        for c in rows
        if c.account.get("gradients_mib") and c.live_mib.get("gradients", 0) < 0.99 * c.account["gradients_mib"]
    ]
    return fold(
        "What the training peak holds: measured at the peak, and the analytic account",
        "Measured: the allocations live at the peak event, named from the storages of parameters, gradients and "
        "AdamW state. Its gradients are those allocated by the peak"
        + (f"; a peak before the backward ends holds only part of them ({'; '.join(early)})." if early else "."),
        T.md_table(T.live_table(rows)),
        "Analytic (`lmperf.kinds.memory.account`): each component at full size. Its peak is the larger of the end of "
        "the forward (parameters, AdamW state, what autograd saves for backward) and the optimizer step "
        "(parameters, gradients, AdamW state, one parameter-sized temporary)."
        + (
            f" Its closed form of the bytes saved for backward is within {T.pct(err)} of the hooks'."
            if err is not None
            else ""
        ),
        T.md_table(T.account_table(rows)),
    )


def section_b(records: list[dict], device: str, batch: int | None) -> str:
    f = F.peak_facts(records, "fp32")
    head = "### (b) Peak memory per context length (fp32)"
    if not f.rows:
        return blocks(head, "No fp32 cell was measured here.")
    table = T.md_table(T.peak_table(f))
    return blocks(
        head,
        peaks_answer(f, batch),
        table,
        unstable_note(table),
        two_peaks_text(f.two_peaks),
        oom_text(f),
        composition_fold(F.compositions(records)),
        f"Peaks are GiB (1024³ bytes) over the one recorded step; every column of every cell: "
        f"[memory.csv]({link(device, 'tables', 'memory.csv')}).",
    )


# -- (c) -----------------------------------------------------------------------------------------


def _peak_words(f: B.PrecisionFacts) -> str:
    """How many peaks bf16 leaves within the noise, and each one it moves."""
    if not f.peaks:
        return ""
    same = [c for c in f.peaks if c.verdict == "within noise"]
    text = f"bf16 leaves {len(same)} of {len(f.peaks)} peaks within the noise"
    phases = dict(f.bf16_peak_phases)
    same_steps = [c for c in same if c.mode == "training"]
    if same_steps and all(phases.get(c.context) == "optimizer_step" for c in same_steps):
        text += (
            f" (the full-step peak at {contexts_words([c.context for c in same_steps])} falls in the optimizer "
            "step, where what is live is fp32 state that autocast does not touch)"
        )
    moved = [
        f"{'lowers' if c.verdict == 'lower' else 'raises'} the {'full-step' if c.mode == 'training' else 'forward-only'} "
        f"peak at context {c.context} by {T.pct(abs(c.change))} ({T.gib(c.fp32.median)} → {T.gib(c.bf16.median)} GiB)"
        for c in f.peaks
        if c.verdict != "within noise"
    ]
    return text + ("; it " + "; it ".join(moved) if moved else "") + "."


def _forward_end_words(f: B.PrecisionFacts) -> str:
    out = []
    for verdict, word in (("higher", "raises"), ("lower", "lowers")):
        hit = [e for e in f.forward_ends if e.change.verdict == verdict]
        if not hit:
            continue
        values = ", ".join(f"{T.gib(e.change.fp32.median)} → {T.gib(e.change.bf16.median)} GiB" for e in hit)
        sentence = f"{'Before the peak, bf16' if not out else 'it'} {word} end-of-forward memory at {contexts_words([e.change.context for e in hit])} ({values})"
        copies = T.gib(hit[0].weight_copies_mib)
        if verdict == "higher" and all(e.copies_outweigh for e in hit):
            sentence += (
                f": autograd saves a bf16 copy of every matmul weight for the backward ({copies} GiB, analytic), "
                "more than the activation bytes bf16 saves there"
            )
        elif verdict == "lower" and not any(e.copies_outweigh for e in hit):
            sentence += (
                f": the activation bytes bf16 saves outweigh the {copies} GiB of bf16 weight copies autograd keeps"
            )
        out.append(sentence)
    return "; ".join(out) + "." if out else ""


def section_c(records: list[dict], device: str, with_figure: bool = True) -> str:
    f = B.precision_facts(records)
    head = "### (c) bf16 mixed precision"
    if not f.peaks and not f.fit_changes:
        return blocks(head, "No cell was measured in both fp32 and bf16 here.")
    margin = max((c.margin for c in f.peaks), default=2 * B.SAME_MEMORY_MARGIN)
    fits = "; ".join(f"context {c} ({m}): fp32 {a}, bf16 {b}" for c, m, a, b in f.fit_changes)
    single = margin > B.SAME_MEMORY_MARGIN
    table = T.md_table(T.change_table(f))
    return blocks(
        head,
        " ".join(s for s in (_peak_words(f), _forward_end_words(f)) if s),
        table,
        unstable_note(table),
        image(device, "fp32 against bf16: peaks and end-of-forward memory", "memory_peaks.png") if with_figure else "",
        "What autograd saved for the backward explains the end-of-forward change: its hooks measure it, and the "
        "account splits it into the activation bytes bf16 saves and the bf16 weight copies it adds.",
        T.md_table(T.saved_table(f)) if f.forward_ends else "",
        f"Fit changes with precision: {fits}." if fits else "",
        "bf16 runs `torch.autocast(dtype=torch.bfloat16)` around the forward and the loss, with fp32 parameters "
        "and AdamW. End-of-forward memory is the replayed trace's active memory as the backward starts. "
        + (
            f"A change within {T.pct(margin, 0)} counts as within the noise (each cell is one recorded step)."
            if single
            else f"A change counts only where the 95% interval of the ratio lies beyond {T.pct(margin, 0)} of 1."
        ),
    )


# -- (d) -----------------------------------------------------------------------------------------


def section_d(f: ResidualFacts, device: str) -> str:
    other = ", ".join(f"{c}: {f.mib_at(c):g} MiB" for c in f.other_contexts)
    seen = f.confirmation
    confirm = ""
    if seen is not None:
        confirm = (
            f"The recorded {seen.precision} {seen.mode} step at context {f.context} holds {seen.count} allocations "
            f"of exactly {f.nbytes:,} bytes, which confirms it."
            if seen.count
            else f"No allocation of exactly {f.nbytes:,} bytes was recorded at context {f.context}."
        )
    return blocks(
        "### (d) One fp32 residual-stream activation",
        f"**{f.mib:g} MiB.** The residual stream has shape (batch, context, d_model); at the reference "
        f"hyper-parameters, the {f.model} model (d_model = {f.d_model}) with batch {f.batch} at context {f.context}"
        + (", the longest this problem profiles" if f.other_contexts and f.longest else "")
        + ", one fp32 activation takes",
        f"    {f.batch} · {f.context} · {f.d_model} · 4 bytes = {f.nbytes:,} bytes; "
        f"{f.nbytes:,} / 1024² = {f.mib:g} MiB",
        " ".join(s for s in (f"At the other profiled lengths (same batch): {other}." if other else "", confirm) if s),
        fold("Allocations of exactly B·T·d_model·4 bytes in each recorded step", T.md_table(T.matches_table(f)))
        if f.matches
        else "",
    )


# -- (e) -----------------------------------------------------------------------------------------


def top_answer(f: TopFacts) -> str:
    listed = f.kinds()
    kinds = ", ".join(f"{n} × {size:g} MiB {what if what != '—' else 'unnamed'}" for what, n, size in listed)
    if len(listed) == 1:
        what, _, size = listed[0]
        kinds = f"all {size:g} MiB {what if what != '—' else 'unnamed'}"
    phases = listing(
        sorted(
            {
                "before the recorded step"
                if g.allocated_in == "before recording"
                else f"in the {T.phase_name(g.allocated_in)}"
                for g in f.groups
            }
        )
    )
    return (
        f"At the {'training' if f.mode == 'training' else 'forward-only'} peak ({f.model}, context {f.context}, "
        f"{f.precision}: {T.gib(f.peak_mib)} GiB in the {T.phase_name(f.phase)}, {f.live} live allocations) the "
        f"{f.count} largest are {kinds}, allocated {phases}; innermost model lines: "
        + ", ".join(f"`{x}`" for x in f.model_lines())
        + "."
    )


def scores_note(tops: list[TopFacts]) -> str:
    hit = [t for t in tops if any(g.what.startswith("score-sized") for g in t.groups)]
    if not hit:
        return ""
    b, h, t, _ = hit[0].score_shape
    return (
        f"A score-sized tensor has the B·H·T² = {b}·{h}·{t}² elements of one layer's attention scores; "
        "its frames show whether it is the scores or a step of the softmax."
    )


def section_e(tops: list[TopFacts], device: str) -> str:
    head = "### (e) The largest allocations at the peak"
    if not tops:
        return blocks(head, "No recorded step lists its largest allocations here.")
    first, rest = tops[0], tops[1:]
    return blocks(
        head,
        " ".join([*(top_answer(t) for t in tops), scores_note(tops)]),
        T.md_table(T.top_table(first)),
        *(
            fold(
                f"The {'full-step' if t.mode == 'training' else 'forward-only'} cell's largest allocations",
                T.md_table(T.top_table(t)),
            )
            for t in rest
        ),
        "Frames are the innermost outside torch (Python stacks; allocations made by the autograd engine's own "
        "thread in the backward have none); storages of parameters, gradients and AdamW state are named by "
        f"address. Every cell's list: [memory_top_allocations.csv]({link(device, 'tables', 'memory_top_allocations.csv')}).",
    )
