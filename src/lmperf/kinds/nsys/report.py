"""Report of the profiled cells: nsys_profile (a)–(e), each answer first (a template filled from ``facts``),
then its table and, for (d), its figure."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lmperf.core import stats
from lmperf.kinds.nsys import facts
from lmperf.profiling.kernels import CLASSES, compact_name, legend
from lmperf.report import common
from lmperf.report.common import count as plural

SECTIONS = ["nsys_profile"]
ALSO_READS = ("e2e",)  # the end-to-end records of the same fp32 cells: (a)'s unprofiled cross-check
CELLS_CSV, KERNELS_CSV, CLASS_SHARES = "tables/nsys.csv", "tables/nsys_kernels.csv", "figures/nsys_class_shares.png"
NONE = "_No fp32 records for this answer on this device._"


def outputs(grid: dict) -> list[str]:
    """Every table and figure the report writes, relative to ``--out`` (the same for every grid)."""
    return [CELLS_CSV, KERNELS_CSV, CLASS_SHARES]


def sp(s: stats.Estimate | None, unit: str = "×", scale: float = 1.0, digits: int = 2) -> str:
    """'1.27× (1.10–1.77×)': the cells' median and range; the value alone for one cell or equal ends."""
    if s is None:
        return "—"
    mid, lo, hi = (common.fmt(v * scale, digits) for v in (s.median, s.low, s.high))
    return f"{mid}{unit}" if lo == hi else f"{mid}{unit} ({lo}–{hi}{unit})"


def share(s: stats.Estimate | None) -> str:
    return sp(s, "%", 100, 1)


def short(label) -> str:
    """A kernel's short name in backticks, '—' for none."""
    return f"`{compact_name(label)}`" if isinstance(label, str) else "—"


def count(v):
    """A count per step (a mean over steps) as a whole number; '—' for none."""
    return "—" if pd.isna(v) else round(v)


def forward_table(inf: pd.DataFrame, unit: str) -> pd.DataFrame:
    """(a) Per fp32 inference cell: the forward per the profiler, the timer, the unprofiled e2e run."""
    return pd.DataFrame(
        {
            "model": inf.model,
            "context": inf.context_length,
            "profiler range (ms)": inf.inference_fwd_nvtx_ms,
            "timer, same process (ms)": inf.inference_fwd_timer.map(common.est),
            "e2e, unprofiled (ms)": inf.inference_fwd_e2e.map(common.est),
            "kernels (ms)": inf.inference_fwd_kernel_ms,
            f"{unit} busy": (inf.inference_fwd_kernel_ms / inf.inference_fwd_nvtx_ms).map(common.pct),
            "profiled vs e2e": facts.judged(zip(inf.inference_fwd_nvtx_ms, inf.inference_fwd_e2e)),
        }
    )


def top_kernel_table(inf: pd.DataFrame, unit: str) -> pd.DataFrame:
    """(b) Per fp32 inference cell: the forward's top kernel, its launches (calls) and share; forward + backward's."""
    fb = [
        "out of memory" if not isinstance(b, str) else "same" if b == f else short(b)
        for b, f in zip(inf.fb_top_kernel, inf.inference_fwd_top_kernel)
    ]
    return pd.DataFrame(
        {
            "model": inf.model,
            "context": inf.context_length,
            "top forward kernel": inf.inference_fwd_top_kernel.map(short),
            f"{'calls' if unit == 'CPU' else 'launches'} / forward": inf.inference_fwd_top_launches.map(count),
            "share of forward": inf.inference_fwd_top_share.map(common.pct),
            "kernels / forward": inf.inference_fwd_launches.map(count),
            "top forward + backward kernel": fb,
        }
    )


def non_matmul_table(kernels: pd.DataFrame, cells: int) -> pd.DataFrame:
    """(c) The kernels other than matmuls above the share: in how many cells, and how large."""
    return pd.DataFrame(
        {
            "kernel": [f"`{k}`" for k in kernels.label],
            "class": kernels["class"],
            f"cells (of {cells})": kernels.cells,
            "median share": kernels.median_share.map(common.pct),
            "largest share": kernels.max_share.map(common.pct),
        }
    )


def training_table(df: pd.DataFrame, d: facts.Facts) -> pd.DataFrame:
    """(d) Per fp32 cell with both records: class shares of the training step against the inference forward."""
    both = facts.ok(facts.ok(df, "inference"), "training")
    table = pd.DataFrame({"model": both.model, "context": both.context_length})
    table["matmul, inference"] = both.inference_fwd_matmul_share.map(common.pct)
    shares = [s | {"optimizer range": o} for s, o in zip(both.train_class_share, both.train_optimizer_phase_share)]
    for cls in ("matmul", "optimizer" if d.optimizer_named else "optimizer range", *d.classes):  # as (d)'s text
        table[f"{cls}, training step"] = [common.pct(s.get(cls)) for s in shares]
    if "att_softmax_ms" in both:
        softmax = both.att_softmax_ms / both.inference_fwd_kernel_ms
        table["attention softmax range, inference"] = softmax.map(common.pct)
    table["kernels / step"] = both.train_launches.map(count)
    return table


def attention_table(df: pd.DataFrame) -> pd.DataFrame:
    """(e) Per inference cell with the attention ranges: the softmax against the two matmuls."""
    columns = {"model": "model", "context_length": "context", "precision": "precision"}
    columns |= {"att_scores_matmul_ms": "QKᵀ matmul (ms)", "att_softmax_ms": "softmax (ms)"}
    columns |= {"att_final_matmul_ms": "PV matmul (ms)", "softmax_over_matmul_time": "softmax / matmuls, time"}
    columns |= {"softmax_over_matmul_flops": "softmax / matmuls, FLOPs"}
    return facts.attention_rows(df)[list(columns)].rename(columns=columns)


def cells_csv(df: pd.DataFrame) -> pd.DataFrame:
    """The per-cell frame as plain numbers: an stats.Estimate as its median and its interval's ends (``<name>_low``,
    ``<name>_high``), class-share dicts left out."""
    out = df[[c for c in df if not any(isinstance(v, dict) for v in df[c])]].copy()
    for c in [c for c in out if any(isinstance(v, stats.Estimate) for v in out[c])]:
        out[c], out[f"{c}_low"], out[f"{c}_high"] = (
            [getattr(v, p, None) for v in out[c]] for p in ("median", "low", "high")
        )
    return out


def answer_a(f: facts.Facts, unit: str) -> str:
    text = (
        f"{'Yes' if f.matches_timer else 'Not everywhere'}: the profiler's forward time (its range) is "
        f"{sp(f.over_timer)} the Python timer's in the same process, within the noise in "
        f"{f.timer_verdicts['within noise']} of {plural(f.cells, 'cell')}; the kernels keep the {unit} busy for "
        f"{share(f.busy)} of it."
    )
    if not (e2e := sum(f.e2e_verdicts.values())):
        return text + " No end-to-end record of these cells was given to compare with."
    text += (
        f" Against the unprofiled end-to-end runs it is {common.verdicts_said(f.e2e_verdicts)} of {plural(e2e, 'cell')}"
    )
    if not f.slower_busy:
        return text + "."
    why = "they wait on their launches, which the profiler lengthens" if f.slowed_where_idle else "not host-bound"
    return text + f"; in the slower ones the kernels fill {share(f.slower_busy)} of the unprofiled forward: {why}."


def answer_b(f: facts.Facts, unit: str) -> str:
    text = (
        f"{short(f.top)} takes the most {unit} time in the forward in {f.top_cells} of {plural(f.cells, 'cell')}, "
        f"{'called' if unit == 'CPU' else 'launched'} {sp(f.launches, '', digits=0)} times per forward."
    )
    if f.fb_cells and f.fb_same < f.fb_cells:
        most, n = f.fb_most
        text += f" With the backward it stays on top in {f.fb_same} of {plural(f.fb_cells, 'cell')}; most often on top"
        return text + f" there is {short(most)} ({plural(n, 'cell')})."
    return text + f" With the backward it stays on top in all {plural(f.fb_cells, 'cell')}." * bool(f.fb_cells)


def answer_c(f: facts.Facts, unit: str) -> str:
    threshold = common.pct(facts.NON_TRIVIAL_SHARE, 0)
    text = f"Kernels other than matmuls take {share(f.share)} of the forward's {unit} time; "
    if f.kernels.empty:
        return text + f"no single one reaches {threshold} of it in any of the {plural(f.cells, 'cell')}."
    first, classes = f.kernels.iloc[0], ", ".join(f"{n} {c}" for c, n in f.kernels["class"].value_counts().items())
    return text + (
        f"{plural(len(f.kernels), 'kernel')} pass {threshold} of it in some cell ({classes}), the most widespread "
        f"`{first.label}` ({plural(int(first.cells), 'cell')}, up to {common.pct(first.max_share)}). Besides fused "
        "attention, where it runs, they come from RMSNorm, RoPE, SwiGLU's gating, the residual adds and the plain "
        "attention's scaling, masking and softmax: each reads and writes a whole activation tensor for a few "
        "FLOPs per element, so memory traffic sets its time."
    )


def answer_d(f: facts.Facts, unit: str) -> str:
    adamw = "the AdamW kernels take" if f.optimizer_named else "AdamW runs as elementwise kernels, its range taking"
    text = (
        f"Matmuls take {share(f.matmul_inference)} of the {unit} time of an inference forward and "
        f"{share(f.matmul_training)} of a full training step: {'lower' if f.change_points.median < 0 else 'higher'} "
        f"in training (median change {common.fmt(abs(f.change_points.median), 1)} points over {plural(f.cells, 'cell')}). "
        f"In the training step {adamw} {share(f.optimizer)}; the others: "
        + ", ".join(f"{c} {share(s)}" for c, s in f.classes.items())
        + f". The backward's kernels take {sp(f.backward_over_forward)} the forward's time (two matmuls for each "
        "of the forward's, a gradient kernel for each elementwise one)."
    )
    if f.attention_softmax:
        text += (
            " The course's softmax is written out, so it runs as elementwise and reduction kernels (only "
            f"cross-entropy's is named softmax); by its range it takes {share(f.attention_softmax)} of the forward."
        )
    return text


def answer_e(f: facts.Facts) -> str:
    def rate(s: stats.Estimate) -> str:
        return sp(s, " TFLOP/s", 1e-12, 1) if s.median >= 1e12 else sp(s, " GFLOP/s", 1e-9, 1)

    per_flop = f"{sp(f.per_flop, digits=0)} slower" if f.per_flop.median > 1 else "not slower"
    return (
        f"The softmax takes {sp(f.time_ratio)} the time of the two attention matmuls together while doing "
        f"{sp(f.flops_ratio, digits=3)} their FLOPs ({plural(f.cells, f'{f.precision} cell')}): per FLOP it is "
        f"{per_flop}; the matmuls run at {rate(f.matmul_rate)}, the softmax at {rate(f.softmax_rate)}. A matmul "
        "does 2·d FLOPs per element of the T×T score matrix it reads or writes; the softmax about 5, in several "
        "kernels that each read and write the whole matrix, so its time follows the bytes it moves."
    )


def header(records: list[dict], on_cpu: bool) -> str:
    metrics = [r["metrics"] for r in records]
    versions = {f"{m['profiler']} {str(m.get('profiler_version')).split()[-1]}" for m in metrics}
    batch = ", ".join(sorted({str(r["provenance"]["settings"].get("batch_size")) for r in records}))
    steps = sorted({(m["warmup_steps"], m["measured_steps"]) for m in metrics})
    protocol = "; ".join(f"{plural(n, 'measured step')} after {plural(w, 'warm-up step')}" for w, n in steps)
    how = (  # on a CPU the "kernels" are ATen operators and the ranges torch.profiler's
        "These CPU records only show that the pipeline works: the kernels are ATen operators (their self time), "
        "counted to a phase by the torch.profiler range they ran in; matmul = `aten::mm`, `aten::bmm`, …"
        if on_cpu
        else "A kernel counts to a phase when the CUDA call that launched it started inside the phase's NVTX range "
        "(on any thread: backward kernels come from the autograd thread); matmul = cuBLAS/CUTLASS GEMMs by name, "
        "fused attention kernels (cuDNN, FlashAttention) a class of their own."
    )
    oom = facts.oom_cells(records)
    return common.blocks(
        f"Profiler: {', '.join(sorted(versions))}; batch {batch}, {protocol}. {how}",
        "Out of memory (recorded, not profiled): " + ", ".join(oom) + "." if oom else "Every cell fit in memory.",
    )


def class_shares(df: pd.DataFrame, path) -> list[str]:
    """(d)'s figure: stacked bars of each fp32 cell's kernel time by class, inference forward and training
    step (the cells (d) describes). Returns the rows' labels."""
    rows = facts.ok(df, "inference")
    if rows.empty:
        common.empty_figure(path, "no profiled cells" if len(df) else "no profile measured on this device")
        return []
    fig, axes = common.figure(1, 2, figsize=(11, 0.3 * len(rows) + 1.8))
    for ax, col, title in zip(axes[0], ("inference_class_share", "train_class_share"), ("inference", "training")):
        shares, left = [s if isinstance(s, dict) else {} for s in rows.get(col, [None] * len(rows))], 0.0
        for cls in (c for c in CLASSES if any(s.get(c) for s in shares)):
            values = pd.Series([s.get(cls) or 0.0 for s in shares])
            ax.barh(range(len(rows)), values, left=left, color=f"C{CLASSES.index(cls)}", label=cls)
            left = values + left
        ax.set(title=f"{title}, fp32: share of kernel time (none: out of memory)", xlim=(0, 1))
        names = [f"{r.model} {r.context_length} {r.precision}" for r in rows.itertuples()]
        ax.set_yticks(range(len(rows)), names)
        ax.invert_yaxis()
    axes[0][1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    common.save(fig, path)
    return names


def section(records: list[dict], e2e_records: list[dict], device: str) -> str:
    """The nsys_profile section of one device: its summary line, the header, then each answer's heading and parts
    (template, table, notes; NONE where it has no records), and the source."""
    if not records:
        return f"nsys_profile was not measured on `{device}` (no records).\n"
    on_cpu = all(r["provenance"]["device_slug"] == "cpu" for r in records)
    unit = "CPU" if on_cpu else "GPU"
    df, kernels = facts.frame(records, e2e_records), facts.kernels_frame(records)
    inf = facts.ok(df, "inference")
    a, b, c = facts.forward_check(df), facts.top_kernel(df), facts.non_matmul(df, kernels)
    d, e = facts.training_step(df), facts.attention(df)
    names = legend([*inf.get("inference_fwd_top_kernel", []), *inf.fb_top_kernel]) if b else ""
    summary = (b and d) and common.summary(
        f"Matmuls take {common.pct(d.matmul_inference.median)} of an inference forward's {unit} time and "
        f"{common.pct(d.matmul_training.median)} of a training step's (medians over cells), the optimizer "
        f"{common.pct(d.optimizer.median)}; top forward kernel {short(b.top)} ({b.top_cells} of {b.cells} cells)."
    )
    answers = {
        "(a) Forward time: the profiler against the Python timer": a
        and [
            answer_a(a, unit),
            "Inference forward (`torch.no_grad`), mean per forward; e2e: the same cell's end-to-end record (a "
            "separate, unprofiled process), median over its trials with its interval where it has several; busy: "
            f"kernel time over the range. [full table]({common.link(device, CELLS_CSV)})",
            common.md_table(forward_table(inf, unit)),
        ],
        "(b) The top forward kernel, and forward + backward": b
        and [
            answer_b(b, unit),
            common.md_table(top_kernel_table(inf, unit)),
            common.details("Kernel names in full", names) if names else "",
            f"Every phase's top kernels per cell, both precisions: [{KERNELS_CSV}]({common.link(device, KERNELS_CSV)}).",
        ],
        f"(c) Kernels other than matmuls above {common.pct(facts.NON_TRIVIAL_SHARE, 0)} of forward {unit} time": c
        and [answer_c(c, unit), common.md_table(non_matmul_table(c.kernels, c.cells)) * (not c.kernels.empty)],
        "(d) A full training step against inference": d
        and [
            answer_d(d, unit),
            common.md_table(training_table(df, d)),
            f"![kernel time by class, inference forward and training step]({common.link(device, CLASS_SHARES)})",
        ],
        "(e) Inside self-attention: softmax against the matmuls": e
        and [
            answer_e(e),
            "Kernel time inside the course's three attention ranges, inference forward, per forward (all layers). "
            "FLOPs: each matmul 2·B·H·T²·d (every score is computed, as in the plain implementation); softmax 5 per "
            "score.",
            common.md_table(attention_table(df)),
        ],
    }
    parts = (common.blocks(f"### {h}", *(p or [NONE])) for h, p in answers.items())
    e2e = sum(isinstance(v, stats.Estimate) for v in df.inference_fwd_e2e)
    source = f"_Source: {plural(len(records), 'record')}, {plural(e2e, 'end-to-end record')}; {common.device_line(records)}._"
    return common.blocks(summary, header(records, on_cpu), *parts, source)


def write(loaded: list[dict], grid: dict, device: str, out: Path) -> None:
    """The section and every output of ``outputs`` (empty ones where no record was measured) under ``out``."""
    records = [r for r in loaded if r["kind"] == "nsys"]
    e2e_records = [r for r in loaded if r["kind"] in ALSO_READS]
    common.write_text(out / "sections" / "nsys_profile.md", section(records, e2e_records, device))
    df = facts.frame(records, e2e_records)  # empty without records: the workflow asks for every output all the same
    common.write_csv(cells_csv(df), out / CELLS_CSV)
    common.write_csv(facts.kernels_frame(records), out / KERNELS_CSV)
    class_shares(df, out / CLASS_SHARES)


main = common.report_cli(__doc__, write)

if __name__ == "__main__":
    raise SystemExit(main())
