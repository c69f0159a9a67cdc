"""Report of the profiled cells: nsys_profile (a)–(e), each answer first, then its table and figure.

Facts come from ``lmperf.kinds.nsys.facts`` (verdicts included), tables from ``tables``, figures
from ``figures``; this module holds the short templates and the command line the workflow calls:

    python -m lmperf.kinds.nsys.report --device h100 --out results/h100 --grid '{…}' \
        --records results/h100/nsys/*.json results/h100/e2e/*_fp32_eager_w5.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import pandas as pd

from lmperf.core.record import load_record
from lmperf.kinds.nsys import cells, facts, figures, tables
from lmperf.kinds.nsys.names import kernel_legend, short
from lmperf.kinds.nsys.text import Words, blocks, fmt, md_table, pct, plural, words_for

SECTIONS = ["nsys_profile"]
# the end-to-end records of the same fp32 cells: (a)'s cross-check against an unprofiled process
ALSO_READS = ("e2e",)
CELLS_CSV = "tables/nsys.csv"
KERNELS_CSV = "tables/nsys_kernels.csv"


def outputs(grid: dict) -> list[str]:
    """Every table and figure the report writes, relative to ``--out`` (the same for every grid)."""
    return [CELLS_CSV, KERNELS_CSV, *figures.FIGURES]


def link(device: str, path: str) -> str:
    """A results path as linked from report/<device>/answers.md."""
    return f"../../results/{device}/{path}"


# ---------------------------------------------------------------------------------------------
# Templates: one per answer, filled from its facts


def answer_a(f: facts.ForwardCheck, w: Words) -> str:
    agree = "Yes" if f.matches_timer else "Not everywhere"
    text = (
        f"{agree}: the profiler's forward time (its {w.range}) is {f.over_timer.text(unit='×')} the Python "
        f"timer's in the same process, within the noise in {f.timer_verdicts['within noise']} of "
        f"{plural(f.cells, 'cell')}; the {w.kernel}s keep the {w.unit} busy for {f.busy.pct()} of it."
    )
    if not f.e2e_cells:
        return text + " No end-to-end record of these cells was given to compare with."
    v = f.e2e_verdicts
    text += (
        f" Against the unprofiled end-to-end runs it is within the noise in {v['within noise']} of "
        f"{plural(f.e2e_cells, 'cell')}"
        + (f", faster in {v['faster']}" if v["faster"] else "")
        + (f" and slower in {v['slower']}" if v["slower"] else "")
        + "."
    )
    if v["slower"]:
        models = ", ".join(f"{m} up to {fmt(r)}×" for m, r in f.slower_models)
        under = f"under {pct(facts.BUSY, 0)}"
        text += (
            f" In the slower ones ({models}) the {w.kernel}s fill {f.slower_busy.pct()} of the unprofiled forward, "
            f"{under} in {f.slower_idle} of {f.slower_busy.n}; in the others {f.other_busy.pct()}, {under} in "
            f"{f.other_idle} of {f.other_busy.n}"
        )
        if f.slowdown_where_idle:
            text += ": the slowed forwards are mostly those that wait on their " + (
                "dispatch, and the profiler lengthens each operator's dispatch"
                if w.on_cpu
                else "launches, and tracing every CUDA call lengthens each launch"
            )
        else:
            text += f": how busy the {w.unit} is does not tell the slowed forwards apart, so the records do not say why"
        text += "."
    return text


def note_a(f: facts.ForwardCheck, w: Words) -> str:
    parts = []
    if f.training_over_timer.n:
        parts.append(
            f"The training step's forward (with the loss) gives {f.training_over_timer.text(unit='×')} its timer."
        )
    if f.nvtx_pairs:
        v = f.nvtx_verdicts
        parts.append(
            f"With no profiler attached, switching the {w.range}s on makes the forward {f.nvtx_cost.text(unit='×')} "
            f"as long as with them off ({plural(f.nvtx_pairs, 'size')}, shortest context, medians of its forwards): "
            f"slower beyond the noise in {v['slower']}, within it in {v['within noise']}"
            + (f", faster in {v['faster']}" if v["faster"] else "")
            + "."
        )
    return " ".join(parts)


def answer_b(f: facts.TopKernel, w: Words) -> str:
    launches = "; ".join(
        f"{model} " + ", ".join(f"{fmt(n, 0)} (ctx {ctx})" for ctx, n in per_ctx) for model, per_ctx in f.launches
    )
    others = ", ".join(f"{short(k)} ({plural(n, 'cell')})" for k, n in f.others)
    text = (
        f"{short(f.top)} takes the most {w.unit} time in the forward in {f.top_cells} of {plural(f.cells, 'cell')}"
        + (f" (the others: {others})" if others else "")
        + f"; {w.launches} of it per forward: {launches}."
    )
    if f.fb_cells:
        text += (
            f" Profiled with the backward, it is still the top {w.kernel} in {f.fb_same} of {plural(f.fb_cells, 'cell')}"
            + (
                f"; the most frequent top {w.kernel} of forward + backward is {short(f.fb_most[0])} "
                f"({plural(f.fb_most[1], 'cell')})."
                if not f.same_in_backward and f.fb_most
                else "."
            )
        )
    return text


def said(v: dict[str, int]) -> str:
    """'faster in 6, within the noise in 2' from verdict counts."""
    words = {"faster": "faster", "within noise": "within the noise", "slower": "slower"}
    return ", ".join(f"{words[k]} in {n}" for k, n in v.items() if n)


def answer_bf16(f: facts.Bf16Forward, w: Words) -> str:
    where = (
        f"still mostly in matmul {w.kernel}s"
        if f.mostly_matmul
        else f"mostly in non-matmul {w.kernel}s; the most frequent top {w.kernel} is {short(f.top[0])} "
        f"({f.top_class} class, {plural(f.top[1], 'cell')})"
    )
    return (
        f"Under bf16 autocast ({plural(f.cells, 'cell')} beside fp32's) the forward's {w.kernel}s take "
        f"{f.time_ratio.text(unit='×')} fp32's time ({said(f.time_verdicts)} of {f.cells}): the matmul "
        f"{w.kernel}s {f.matmul_ratio.text(unit='×')} their fp32 time"
        + (f" (other matmul {w.kernel}s run)" if f.new_matmuls else "")
        + f", every other {w.kernel} {f.other_ratio.text(unit='×')}. So matmuls "
        + ("fall" if f.matmul_share_bf16.median < f.matmul_share_fp32.median else "rise")
        + " from "
        f"{f.matmul_share_fp32.pct()} to {f.matmul_share_bf16.pct()} of the forward's {w.kernel} time: the bf16 "
        f"forward's time is {where}."
    )


def answer_c(f: facts.NonMatmul, w: Words) -> str:
    threshold = pct(facts.NON_TRIVIAL_SHARE, 0)
    if not f.any:
        return (
            f"None: non-matmul {w.kernel}s take {f.share.pct()} of the forward's {w.unit} time, and no single one "
            f"reaches {threshold} of it in any of the {plural(f.cells, 'cell')}."
        )
    first = f.kernels.iloc[0]
    classes = ", ".join(f"{n} {c}" for c, n in Counter(f.kernels["class"]).most_common())
    return (
        f"Non-matmul {w.kernel}s take {f.share.pct()} of the forward's {w.unit} time; "
        f"{plural(len(f.kernels), w.kernel)} pass {threshold} of it in some cell ({classes}), the most widespread "
        f"`{first.label}` ({plural(int(first.cells), 'cell')}, up to {pct(first.max_share)}). They come from "
        "RMSNorm, RoPE, SwiGLU's gating, the residual adds and the unfused attention's scaling, masking and "
        "softmax: each reads and writes a whole activation tensor for a few FLOPs per element, so memory "
        "traffic sets its time."
    )


def answer_d(f: facts.TrainingStep, w: Words) -> str:
    direction = "lower" if f.matmul_lower else "higher"
    optimizer = (
        f"the AdamW {w.kernel}s take {f.optimizer.pct()}"
        if f.optimizer_named
        else f"AdamW runs as elementwise {w.kernel}s (its optimizer_step range takes {f.optimizer.pct()})"
    )
    text = (
        f"Matmuls take {f.matmul_inference.pct()} of the {w.unit} time of an inference forward and "
        f"{f.matmul_training.pct()} of a full training step: {direction} in training, in "
        f"{(f.lower_in_training if f.matmul_lower else f.cells - f.lower_in_training)} of "
        f"{plural(f.cells, 'cell')} (median change {fmt(abs(f.change_points), 1)} points). In the training "
        f"step {optimizer}, elementwise {w.kernel}s {f.elementwise_training.pct()} "
        f"(against {fmt(100 * f.elementwise_inference.median, 1)}% in inference), reductions {f.reduction_training.pct()}; the backward's {w.kernel}s "
        f"take {f.backward_over_forward.text(unit='×')} the forward's time (two matmuls for each of the "
        f"forward's, a gradient {w.kernel} for each elementwise one)."
    )
    if f.attention_softmax.n:
        text += (
            f" The course's softmax is written out, so it runs as elementwise and reduction {w.kernel}s (only "
            f"cross-entropy's fused log-softmax is named softmax); by its {w.range} it takes "
            f"{f.attention_softmax.pct()} of the inference forward."
        )
    return text


def _rate(s) -> str:
    unit, scale = ("TFLOP/s", 1e-12) if s.median >= 1e12 else ("GFLOP/s", 1e-9)
    return s.text(scale=scale, unit=f" {unit}", digits=1)


def answer_e(f: facts.Attention, w: Words) -> str:
    per_flop = (
        f"per FLOP it is {f.per_flop.text(unit='×', digits=0)} slower"
        if f.softmax_slower_per_flop
        else f"per FLOP it is not slower ({f.per_flop.text(unit='×')} the matmuls' time per FLOP)"
    )
    text = (
        f"The softmax takes {f.time_ratio.text(unit='×')} the time of the two attention matmuls together while "
        f"doing {f.flops_ratio.text(unit='×', digits=3)} their FLOPs ({plural(f.cells, f'{f.precision} cell')}): "
        f"{per_flop}; the matmuls run at {_rate(f.matmul_rate)}, the softmax at {_rate(f.softmax_rate)}. A matmul "
        "does 2·d FLOPs per element of the T×T score matrix it reads or writes; the softmax about 5, in several "
        f"{w.kernel}s that each read and write the whole matrix, so its time follows the bytes it moves."
    )
    if f.bf16_time_ratio.n and f.precision != "bf16":
        text += f" In the bf16 cells the softmax takes {f.bf16_time_ratio.text(unit='×')} the matmuls' time."
    return text


# ---------------------------------------------------------------------------------------------
# Sections: the answer, then its table and figure


def header(records: list[dict], w: Words) -> str:
    metrics = [r["metrics"] for r in records]
    # 'NVIDIA Nsight Systems version 2025.3.1.0' -> '2025.3.1.0'
    versions = sorted({str(m["profiler_version"]).split()[-1] for m in metrics if m.get("profiler_version")})
    settings = [r["provenance"].get("settings") or {} for r in records]
    steps = sorted({(m.get("warmup_steps"), m.get("measured_steps")) for m in metrics})
    batch = ", ".join(sorted({str(s.get("batch_size")) for s in settings}))
    protocol = "; ".join(f"{plural(n, 'measured step')} after {plural(wu, 'warm-up step')}" for wu, n in steps)
    lines = []
    if w.on_cpu:
        lines.append(
            "These CPU records only show that the pipeline works: torch.profiler records the CPU operators "
            "(their self time) where a GPU has kernels; NVTX ranges, GPU kernels and the ranges' cost without "
            "a profiler are not measured on a CPU."
        )
    attributed = (
        "Operators count to a phase by the profiler range they ran in; matmul = `aten::mm`, `aten::bmm`, … by name."
        if w.on_cpu
        else f"Kernels count to a phase when the CUDA call that launched them started inside its {w.range} (on any "
        "thread: backward kernels come from the autograd thread); matmul = cuBLAS/CUTLASS kernels by name."
    )
    lines.append(
        f"Profiler: {w.profiler}" + (f" ({', '.join(versions)})" if versions else "") + f"; batch {batch}, "
        f"{protocol}. {attributed}"
    )
    oom = cells.oom_cells(records)
    lines.append(
        "Out of memory (recorded, not profiled): " + ", ".join(oom) + "." if oom else "Every cell fit in memory."
    )
    return "\n\n".join(lines)


def section_a(df: pd.DataFrame, w: Words, device: str) -> str:
    heading = "### (a) Forward time: the profiler against the Python timer"
    f = facts.forward_check(df)
    if not f.cells:
        return blocks(heading, "_No fp32 inference records on this device._")
    table = tables.forward_table(df, w)
    unstable = any(tables.UNSTABLE_MARK in str(v) for v in table.values.ravel())
    return blocks(
        heading,
        answer_a(f, w),
        "Inference forward (`torch.no_grad`), mean per forward; e2e: the same cell's end-to-end record (a "
        "separate, unprofiled process), median over its trials with its interval where it has several; "
        f"{w.unit} busy: {w.kernel} time over the {w.range}. "
        f"[full table]({link(device, CELLS_CSV)})",
        md_table(table),
        f"{tables.UNSTABLE_MARK} unstable: its interval is wider than a tenth of its median." if unstable else "",
        note_a(f, w),
    )


def section_b(df: pd.DataFrame, kernels: pd.DataFrame, w: Words, device: str) -> str:
    heading = f"### (b) The top forward {w.kernel}, and forward + backward"
    f = facts.top_kernel(df)
    if not f.cells:
        return blocks(heading, "_No fp32 inference records on this device._")
    inf = cells.ok(df, "inference")
    shown = [*inf.inference_fwd_top_kernel, *inf.fb_top_kernel]
    parts = [heading, answer_b(f, w), md_table(tables.top_kernel_table(df, w))]
    bf16 = facts.bf16_forward(df, kernels)
    if bf16.cells:
        pairs = cells.ok(df, "inference", "bf16")
        shown += [*pairs.inference_fwd_top_kernel, *pairs.inference_fwd_top_matmul]
        parts += [answer_bf16(bf16, w), md_table(tables.bf16_table(df, w))]
    legend = kernel_legend(shown)
    if legend:
        parts.append(f"<details><summary>{w.kernel.capitalize()} names in full</summary>\n\n{legend}\n\n</details>")
    parts.append(f"Every phase's top {w.kernel}s per cell: [{KERNELS_CSV}]({link(device, KERNELS_CSV)}).")
    return blocks(*parts)


def section_c(df: pd.DataFrame, kernels: pd.DataFrame, w: Words) -> str:
    heading = f"### (c) Non-matmul {w.kernel}s above {pct(facts.NON_TRIVIAL_SHARE, 0)} of forward {w.unit} time"
    f = facts.non_matmul(df, kernels)
    if not f.cells:
        return blocks(heading, "_No fp32 inference records on this device._")
    table = md_table(tables.non_matmul_table(f.kernels, f.cells, w)) if f.any else ""
    return blocks(heading, answer_c(f, w), table)


def section_d(df: pd.DataFrame, w: Words, device: str) -> str:
    heading = "### (d) A full training step against inference"
    f = facts.training_step(df)
    if not f.cells:
        return blocks(heading, "_Needs fp32 inference and training records of the same cells._")
    return blocks(
        heading,
        answer_d(f, w),
        "Share of each phase's kernel time by class:"
        if not w.on_cpu
        else "Share of each phase's operator time by class:",
        md_table(tables.training_table(df, w)),
        f"![{w.kernel} time by class, inference forward and training step]({link(device, figures.CLASS_SHARES)})",
    )


def section_e(df: pd.DataFrame, w: Words, device: str) -> str:
    heading = "### (e) Inside self-attention: softmax against the matmuls"
    f = facts.attention(df)
    if not f.cells:
        return blocks(heading, f"_No inference records with the attention {w.range}s on this device._")
    return blocks(
        heading,
        answer_e(f, w),
        f"{w.kernel.capitalize()} time inside the course's three attention {w.range}s, inference forward, per "
        "forward (all layers). FLOPs: each matmul 2·B·H·T²·d (every score is computed, as in the plain "
        "implementation); softmax 5 per score (max, subtract, exp, sum, divide).",
        md_table(tables.attention_table(df, w)),
        f"![softmax against the two attention matmuls]({link(device, figures.ATTENTION)})",
    )


def source_line(records: list[dict], e2e_used: int, device: str) -> str:
    names = sorted({r["provenance"]["device_name"] for r in records})
    commits = Counter((r["provenance"].get("git_commit") or "unknown")[:7] for r in records)
    said = ", ".join(f"`{c}`" + (f" ({n})" if len(commits) > 1 else "") for c, n in commits.most_common())
    said = said.replace("`unknown`", "unknown")
    return (
        f"_Source: {plural(len(records), 'record')} in `results/{device}/nsys/` and "
        f"{plural(e2e_used, 'end-to-end record')} in `results/{device}/e2e/`; {', '.join(names)}; "
        f"commit{'s' if len(commits) > 1 else ''} {said}._"
    )


def section(records: list[dict], e2e_records: list[dict], device: str) -> str:
    """The nsys_profile section of one device."""
    if not records:
        return f"nsys_profile was not measured on `{device}` (no records).\n"
    w = words_for(records)
    df = cells.frame(records, e2e_records)
    kernels = cells.kernels_frame(records)
    return blocks(
        header(records, w),
        section_a(df, w, device),
        section_b(df, kernels, w, device),
        section_c(df, kernels, w),
        section_d(df, w, device),
        section_e(df, w, device),
        source_line(records, int((df.inference_fwd_e2e.notna() | df.training_fwd_e2e.notna()).sum()), device),
    )


def write(records: list[dict], e2e_records: list[dict], device: str, out: Path) -> None:
    """Every output of ``outputs`` and every section, under ``out``; with no records, the sections alone."""
    (out / "sections").mkdir(parents=True, exist_ok=True)
    (out / "sections" / "nsys_profile.md").write_text(section(records, e2e_records, device))
    if not records:
        return
    w = words_for(records)
    df = cells.frame(records, e2e_records)
    (out / "tables").mkdir(parents=True, exist_ok=True)
    tables.cells_csv(df).to_csv(out / CELLS_CSV, index=False)
    cells.kernels_frame(records).to_csv(out / KERNELS_CSV, index=False)
    figures.draw(df, w, out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", required=True)
    p.add_argument("--out", required=True, help="results/<device>: tables/, figures/ and sections/ go under it")
    p.add_argument("--grid", default="{}", help="the kind's config slice as JSON (config.yaml grids.gpu.nsys)")
    p.add_argument("--records", nargs="*", default=[], help="nsys records, and e2e records of the same cells")
    args = p.parse_args(argv)
    json.loads(args.grid)  # a malformed slice fails here, named
    loaded = [load_record(path) for path in sorted(args.records)]
    records = [r for r in loaded if r["kind"] == "nsys"]
    e2e_records = [r for r in loaded if r["kind"] in ALSO_READS]
    write(records, e2e_records, args.device, Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
