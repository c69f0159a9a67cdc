"""Report of the memory cells: memory_profiling (a)-(e), each a template filled from ``facts`` and its
table; an active-memory timeline per grid cell and ``tables/memory.csv``."""

from __future__ import annotations

import itertools
from pathlib import Path

from lmperf.core.sizes import config_from_name
from lmperf.kinds.memory import facts as F
from lmperf.report import common as C

SECTIONS = ["memory_profiling"]
ALSO_READS: tuple[str, ...] = ()
# Why a training step peaks where it does, by the phase of its peak.
PHASE_WHY = {
    "optimizer_step": "parameters, gradients, AdamW's two moments and its update temporary are live together",
    "backward": "the activations saved for backward are still live as the gradients fill in",
}
PHASE_COLOURS = dict(forward="tab:blue", backward="tab:orange", optimizer_step="tab:green", zero_grad="tab:purple")
# bf16 and fp32 memory differ only beyond this (stats.compare doubles its margin for cells measured once)
MARGIN = f"{200 * F.SAME_MEMORY_MARGIN:g}%"


def grid_cells(grid: dict) -> list[dict]:
    """The grid's cells, one per (model, context, precision, mode)."""
    axes = [grid.get(k, []) for k in ("models", "context_lengths", "precisions")] + [F.MODES]
    return [dict(zip(("model", "context_length", "precision", "mode"), c)) for c in itertools.product(*axes)]


def outputs(grid: dict) -> list[str]:
    """Every table and figure this report writes for ``grid``, relative to ``--out``."""
    cells = grid_cells(grid)
    return (["tables/memory.csv"] if cells else []) + [f"figures/{timeline_name(c)}" for c in cells]


def gib(mib) -> str:
    return "—" if mib is None else f"{mib / 1024:.2f}"


def gibs(values: tuple | None) -> str:
    """A span in GiB, '4.85–28.42', or one value where both ends print the same."""
    return C.span([v / 1024 for v in values], "") if values else "—"


def contexts(ctxs: list) -> str:
    """'context 128', 'contexts 128 and 256', 'contexts 128, 256 and 512'."""
    return f"context{'s' * (len(ctxs) > 1)} {C.listing(ctxs)}"


def phase_name(phase: str | None) -> str:
    return (phase or "—").replace("_", " ")


def timeline_name(cell: dict) -> str:
    return f"memory_timeline_{cell['model']}_ctx{cell['context_length']}_{cell['precision']}_{cell['mode']}.png"


def timeline(record: dict | None, path, cell: dict, missing: str) -> None:
    """Active memory over the recorded step's allocator events, phases shaded, the peak and any OOM marked."""
    what = "full training step" if cell["mode"] == "training" else "forward only"
    title = f"{cell['model']}, context {cell['context_length']}, {cell['precision']}: {what}"
    m = (record or {}).get("metrics") or {}
    t = m.get("timeline") or {}
    if not t.get("event"):
        return C.empty_figure(path, f"{title}\n{missing}")
    fig, axes = C.figure(figsize=(8, 3.4))
    ax = axes[0][0]
    marks = list(m["phase_marks"])
    if marks and marks[-1]["phase"] != "end":  # a step cut short (out of memory): shade to the last event
        marks.append({"phase": "end", "event": t["event"][-1]})
    for k, (mark, nxt) in enumerate(zip(marks, marks[1:])):
        ax.axvspan(mark["event"], nxt["event"], color=PHASE_COLOURS.get(mark["phase"], "grey"), alpha=0.12, lw=0)
        x, y = (mark["event"] + nxt["event"]) / 2, 1.0 + 0.07 * (k % 2)  # staggered: short phases' labels apart
        label = phase_name(mark["phase"])
        ax.text(x, y, label, transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=7)
    ax.plot(t["event"], [v / 1024 for v in t["active_mib"]], lw=1, color="black", label="active")
    peak = m["replay_peak_active_mib"] / 1024
    ax.plot([m["peak_event"]], [peak], "o", color="red", ms=4, label=f"peak {peak:.2f} GiB")
    for k, o in enumerate(m.get("oom_events") or []):
        ax.axvline(o["event"], color="red", lw=1, ls=":", label="out of memory" if k == 0 else None)
    ax.set(xlabel="allocator event", ylabel="active memory (GiB)")
    ax.set_title(title, fontsize=9, pad=22)
    ax.legend(fontsize=7, loc="best")
    C.save(fig, path)


def timelines(device: str, cells: list[dict]) -> str:
    """One line per (model, context, precision): its full-step and forward-only timelines."""
    training = sorted(
        (c for c in cells if c["mode"] == "training"), key=lambda c: (c["precision"] != "fp32", c["context_length"])
    )
    link = lambda c: C.link(device, f"figures/{timeline_name(c)}")  # noqa: E731
    return "\n".join(
        f"- {c['model']}, context {c['context_length']}, {c['precision']}: ![full step]({link(c)}) "
        f"![forward only]({link({**c, 'mode': 'inference'})})"
        for c in training
    )


def section_a(all_steps: list[F.Step], device: str, cells: list[dict]) -> str:
    f = F.stage_facts(all_steps)
    training, s, shown = f.training, f.spans, f.shown
    share = f"at least {100 * F.VISIBLE_SHARE:g}% of"
    out = []
    if f.verdict == "yes":
        out.append(
            f"Yes: in every training cell ({shown} of {len(training)}) each stage moves active memory by {share} the "
            f"cell's peak. The forward raises it by {gibs(s['forward'])} GiB (what autograd saves for backward); the "
            f"backward releases that as it allocates the gradients and ends {gibs(s['gradients'])} GiB above the "
            f"step's start; the optimizer step adds a {gibs(s['transient'])} GiB transient and zero_grad frees "
            f"{gibs(s['zero_grad'])} GiB."
        )
    elif f.verdict:
        hidden = ", ".join(sorted({h for r in training for h in r.hidden}))
        out.append(
            f"{f.verdict.capitalize()}: every stage moves active memory by {share} the peak in {shown} of "
            f"{len(training)} training cells; elsewhere these move it less: {hidden}."
        )
    if f.inference_base:
        out.append(
            f"A forward-only step stands on {gibs(f.inference_base)} GiB ({gib(f.parameters_mib)} "
            f"GiB of parameters) and rises at most {gib(f.inference_rise)} GiB above it: each layer's activations are "
            "freed once the next layer has used them."
        )
    longest = max((c["context_length"] for c in cells), default=None)
    first = [c for c in cells if c["context_length"] == longest and c["precision"] == "fp32"]
    rest = [c for c in cells if c not in first]
    return C.blocks(
        "### (a) Active-memory timelines",
        " ".join(out),
        timelines(device, first),
        C.details(f"Timelines of the other {len(rest)} cells", timelines(device, rest)) if rest else "",
        "Each timeline is one step after warm-up, recorded with PyTorch's allocator history (Python stacks) and "
        "replayed from its trace: active memory against the allocator's event number. Marker allocations at "
        "each phase boundary place the phases in the allocation order itself, whatever the GPU's asynchrony.",
    )


def peak_text(s: F.Step | None) -> str:
    return "—" if s is None or s.status == "unsupported" else gib(s.peak.median) if s.peak else s.status.upper()


def section_b(f: F.PeakFacts, device: str, batch: int) -> str:
    head = "### (b) Peak memory per context length (fp32)"
    if not f.rows:
        return C.blocks(head, "No fp32 cell was measured here.")
    answer = [
        f"Forward only, the peak is {gibs(f.span('inference'))} GiB; a full training step peaks at "
        f"{gibs(f.span('training'))} GiB (batch {batch})."
    ]
    where = [
        f"in the {phase_name(p)} at {contexts(c)}" + (f" ({PHASE_WHY[p]})" if p in PHASE_WHY else "")
        for p, c in sorted(f.by_phase.items(), key=lambda kv: kv[1])
    ]
    answer += [f"The step peaks {' and '.join(where)}."] if where else []
    if f.account_error is not None:
        answer.append(
            "Parameters, gradients, AdamW's moments and temporary and what autograd saves for backward (its hooks) "
            f"account for the bytes requested at every training peak (replayed from the allocation trace) within "
            f"{C.pct(f.account_error)}."
        )
    columns = ["context", "forward only: peak (GiB)", "full step: peak (GiB)", "full step: phase of the peak"]
    columns += ["full step: requested at the peak (GiB)", "full step: the account's peak (GiB)", "the account's phase"]
    rows = [
        (str(ctx), peak_text(inf), peak_text(t), phase_name(t and t.metrics.get("peak_phase")))
        + (gib(t.metrics["replay_peak_active_mib"]) if t and "replay_peak_active_mib" in t.metrics else "—",)
        + ((gib(t.predicted[0]), t.predicted[1]) if t and t.predicted else ("—", "—"))
        for ctx, inf, t in f.rows
    ]
    ooms = "".join(f"\n- {s.precision}, context {s.context}, {s.mode}: {s.reason}" for s in f.out_of_memory)
    return C.blocks(
        head,
        " ".join(answer),
        C.md_table(rows, columns),
        f"Out of memory:\n{ooms}" if ooms else "",
        "Peaks are the allocator's (`torch.cuda.max_memory_allocated`: whole blocks, so a little above the "
        "requested bytes (a) replays), in GiB (1024³ bytes), over the one recorded step; the account is "
        f"`lmperf.kinds.memory.account`'s. Every column of every cell: [memory.csv]({C.link(device, 'tables/memory.csv')}).",
    )


def section_c(all_steps: list[F.Step]) -> str:
    f = F.precision_facts(all_steps)
    head = "### (c) bf16 mixed precision"
    if not f.peaks and not f.fit_changes:
        return C.blocks(head, "No cell was measured in both fp32 and bf16 here.")
    moved = [
        f"{'lowers' if c.verdict == 'lower' else 'raises'} the {'full-step' if c.mode == 'training' else 'forward-only'}"
        f" peak at context {c.context} by {C.pct(abs(c.change))} ({gib(c.fp32.median)} → {gib(c.bf16.median)} GiB)"
        for c in f.peaks
        if c.verdict != "within noise"
    ]
    out = []
    if f.peaks:
        kept = f"bf16 leaves {len(f.peaks) - len(moved)} of {len(f.peaks)} peaks within {MARGIN} of fp32's"
        out.append("; it ".join([kept, *moved]) + ".")
    for verdict, word in (("higher", "raises"), ("lower", "lowers")):
        hit = [e for e in f.forward_ends if e.verdict == verdict]
        if not hit:
            continue
        values = ", ".join(f"{gib(e.fp32.median)} → {gib(e.bf16.median)} GiB" for e in hit)
        text = f"It {word} end-of-forward memory at {contexts([e.context for e in hit])} ({values})"
        copies = (
            f"the bf16 copies of the matmul weights autograd saves for backward ({gib(hit[0].weight_copies_mib)} GiB)"
        )
        saved = f"the activation bytes bf16 saves ({', '.join(gib(e.activations_saved_mib) for e in hit)} GiB)"
        outweigh = {e.copies_outweigh for e in hit}
        if outweigh in ({True}, {False}):  # one explanation for every such context
            text += f": {copies} outweigh {saved}" if outweigh == {True} else f": {saved} outweigh {copies}"
        out.append(text + ".")
    rows = [
        (f"{c.what}, {'forward only' if c.mode == 'inference' else 'full step'}", str(c.context))
        + (gib(c.fp32.median), gib(c.bf16.median), f"{100 * c.change:+.1f}%")
        + (f"within {MARGIN}" if c.verdict == "within noise" else c.verdict,)
        for c in (*f.peaks, *f.forward_ends)
    ]
    fits = "; ".join(f"context {c} ({m}): fp32 {a}, bf16 {b}" for c, m, a, b in f.fit_changes)
    return C.blocks(
        head,
        " ".join(out),
        C.md_table(rows, ["what", "context", "fp32 (GiB)", "bf16 (GiB)", "change", "verdict"]),
        f"Fit changes with precision: {fits}." if fits else "",
        "bf16 runs `torch.autocast(dtype=torch.bfloat16)` around the forward and the loss, with fp32 parameters "
        "and AdamW. End-of-forward memory is the replayed trace's active memory as the backward starts; the "
        "activation bytes are what autograd's saved-tensor hooks counted. A change counts only where the ratio lies "
        f"beyond {MARGIN} of 1 (`lmperf.core.stats.compare` doubles its margin for cells measured once, as every memory cell is).",
    )


def section_d(grid: dict) -> str:
    model, batch, ctx = grid["reference_model"], grid["batch_size"], grid["reference_context_length"]
    config = config_from_name(model)
    nbytes = batch * ctx * config.d_model * 4
    mib = nbytes / 2**20
    return C.blocks(
        "### (d) One fp32 residual-stream activation",
        f"**{mib:g} MiB.** The residual stream has shape (batch, context, d_model); at the reference "
        f"hyper-parameters, the {model} model (d_model = {config.d_model}) with batch {batch} at context {ctx}, "
        "one fp32 activation takes",
        f"    {batch} · {ctx} · {config.d_model} · 4 bytes = {nbytes:,} bytes; {nbytes:,} / 1024² = {mib:g} MiB",
    )


def section_e(all_steps: list[F.Step]) -> str:
    f = F.top_facts(all_steps, "training") or F.top_facts(all_steps, "inference")
    head = "### (e) The largest allocations at the peak"
    if not f:
        return C.blocks(head, "No recorded step lists its largest allocations here.")
    s, (b, h, t, _) = f.step, f.score_shape
    kinds = ", ".join(f"{n} × {size:g} MiB {'unnamed' if what == '—' else what}" for what, n, size in f.kinds())
    answer = (
        f"At the {'training' if s.mode == 'training' else 'forward-only'} peak ({s.model}, context {s.context}, "
        f"{s.precision}: {gib(s.metrics['replay_peak_active_mib'])} GiB in the "
        f"{phase_name(s.metrics.get('peak_phase'))}, {s.metrics.get('live_allocations_at_peak')} live allocations) "
        f"the {sum(g[4] for g in f.groups)} largest are {kinds}."
    )
    if any("score-sized" in g[1] for g in f.groups):
        answer += (
            f" A score-sized tensor has the B·H·T² = {b}·{h}·{t}² elements of one layer's attention scores; its "
            "frames show whether it is the scores or a step of the softmax."
        )
    columns = ["size (MiB)", "count", "what", "allocated in", "innermost frames outside torch"]
    rows = [
        (f"{size:g}", str(n), what, where, " ← ".join(f"`{x}`" for x in frames) or "(none)")
        for size, what, where, frames, n in f.groups
    ]
    return C.blocks(
        head,
        answer,
        C.md_table(rows, columns),
        "Frames are the innermost outside torch (Python stacks; allocations made by the autograd engine's own "
        "thread in the backward have none); storages of parameters and AdamW state are named by address.",
    )


def section(records: list[dict], grid: dict, device: str) -> str:
    """The memory_profiling fragment: the reference model's answers (or, with none measured, what is not)."""
    if not records:
        return f"Memory was not measured on this device (`{device}`): there are no memory records.\n"
    all_steps = F.steps(records)
    residual = section_d(grid) if grid.get("reference_model") else ""
    if not F.measured(all_steps):
        why = f"Not measured on this device (`{device}`): {records[0].get('reason')}"
        if device == "cpu":  # their timelines, empty, are not linked
            why = f"Not measured on a CPU (PyTorch's allocator history needs CUDA; {len(records)} cells ran without it)"
        return C.blocks(f"{why}; only (d), which needs no history, is answered.", residual)
    mine = [s for s in all_steps if s.model == grid.get("reference_model")] or all_steps  # one model per answer
    peaks = F.peak_facts(mine)
    phases = sorted(peaks.by_phase.items(), key=lambda kv: kv[1])
    where = ", ".join(f"in the {phase_name(p)}" + (f" at {C.listing(c)}" if len(phases) > 1 else "") for p, c in phases)
    where = f" (its peak {where})" if where else ""
    return C.blocks(
        C.summary(
            f"{mine[0].model}, fp32: a forward peaks at {gibs(peaks.span('inference'))} GiB, a training step "
            f"at {gibs(peaks.span('training'))} GiB{where}, over {contexts([r[0] for r in peaks.rows])}."
        ),
        section_a(mine, device, grid_cells(grid)),
        section_b(peaks, device, mine[0].batch),
        section_c(mine),
        residual,
        section_e(mine),
        C.source_line(records, device),
    )


def write(records: list[dict], grid: dict, device: str, out: Path) -> None:
    records = [r for r in records if r["kind"] == "memory"]
    if grid_cells(grid):  # one row per cell, every scalar the answers draw on
        rows = [
            {"model": s.model, "context_length": s.context, "precision": s.precision, "mode": s.mode}
            | {"status": s.status, "reason": s.reason}
            | {k: v for k, v in s.metrics.items() if isinstance(v, (int, float, str))}
            | dict(zip(("account_peak_mib", "account_peak_phase"), s.predicted or (None, None)))
            for s in F.steps(records)
        ]
        C.write_csv(rows, out / "tables" / "memory.csv")
    by_cell = {timeline_name(r["cell"]): r for r in records}
    missing = "not measured on a CPU (no allocator history)" if device == "cpu" else "no record to draw"
    for cell in grid_cells(grid):
        timeline(by_cell.get(timeline_name(cell)), out / "figures" / timeline_name(cell), cell, missing)
    C.write_text(out / "sections" / f"{SECTIONS[0]}.md", section(records, grid, device))


main = C.report_cli(__doc__, write)

if __name__ == "__main__":
    raise SystemExit(main())
