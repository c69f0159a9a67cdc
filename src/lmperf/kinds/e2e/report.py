"""Report of the end-to-end cells: tables, figures and the answer sections they support.

Sections written (markdown fragments for report/answers.md): benchmarking_script,
benchmarking_mixed_precision_c, torch_compile_b, timer_check (the step timer against CUDA
events) and flash_benchmarking_model (the whole model with each attention implementation).
Every number in them is computed here from the records. All but the last use the cells with the
course's attention (``plain``).

    python -m lmperf.kinds.e2e.report --device cpu --default-warmup 2 --csv … --sections-dir …
        --figures-dir … --records results/cpu/e2e/*.json --compile-records results/cpu/e2e_compile/*.json
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd

from lmperf.report.common import (
    blocks,
    empty_figure,
    figure,
    figures_link,
    fmt,
    load,
    md_table,
    model_order,
    pct,
    report_parser,
    save,
    source_line,
    span,
    write_csv,
    write_text,
)

# SAME: speed-ups within it of 1 read as about as fast; LAUNCH_BOUND_GROWTH: the launch-bound test's
# factor, shared with the comparison across devices
from lmperf.report.devices import LAUNCH_BOUND_GROWTH, SAME, attention_of

PHASES = ("forward", "backward", "optimizer_step", "training_step", "forward_backward", "inference_forward")
CELL_KEYS = ("model", "context_length", "precision", "compile", "warmup_steps")
# A coefficient of variation (std/mean) under this is "negligible" variability in the prose.
LOW_CV = 0.05
# bf16 "pays off" when it makes the training step at least this much faster at every length.
PAYOFF_SPEEDUP = 1.2
# The timer/event agreement check applies to phases longer than this (only steps longer than 10 ms are compared).
TIMER_CHECK_MIN_MS = 10.0
# A (cell, phase) series "agrees" with the CUDA events when every sample's |timer / events − 1| is at
# most this share.
TIMER_AGREE_SHARE = 0.02
# A compiled cell whose first training step (compilation included) takes under this share of the
# median first step of the same model's other compiled cells is named as a likely warm-cache compile:
# the e2e record does not say whether Inductor's cache was cold, and every length compiles a graph
# of the same size.
WARM_COMPILE_SHARE = 0.25


def frame(records: list[dict]) -> pd.DataFrame:
    """One row per record: cell coordinates, status and per-phase summary statistics."""
    rows = []
    for r in records:
        m = r["metrics"]
        row = {k: r["cell"][k] for k in CELL_KEYS}
        row["attention"] = attention_of(r)
        row.update(
            status=r["status"],
            training_status=m.get("training_status"),
            inference_status=m.get("inference_status"),
            reason=r.get("reason"),
        )
        for phase in PHASES:
            mean, std = m.get(f"{phase}_ms_mean"), m.get(f"{phase}_ms_std")
            samples = m.get(f"{phase}_ms_samples") or []
            row[f"{phase}_ms_mean"] = mean
            row[f"{phase}_ms_std"] = std
            row[f"{phase}_ms_median"] = m.get(f"{phase}_ms_median")
            row[f"{phase}_cv"] = std / mean if mean else None
            row[f"{phase}_first_over_median"] = (
                samples[0] / statistics.median(samples[1:]) if len(samples) > 1 else None
            )
        for key in (
            "training_step_mfu",
            "inference_forward_mfu",
            "training_step_tokens_per_s",
            "training_peak_allocated_mib",
            "process_start_to_first_measured_step_s",
            "parameter_count",
            # torch_compile (b): the first step's and first forward's wall time (compilation, mostly)
            "training_first_step_ms",
            "inference_first_forward_ms",
            # compiled cells: hits of torch.compile's on-disk caches (None in records before they were kept)
            "compile_cache_hits",
        ):
            row[key] = m.get(key)
        settings = r["provenance"].get("settings") or {}
        row["batch_size"], row["vocab_size"] = settings.get("batch_size"), settings.get("vocab_size")
        row["compile_scope"] = compile_scope(r) if row["compile"] == "compiled" else None
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    order = {name: i for i, name in enumerate(model_order())}
    df["_order"] = df["model"].map(order)
    return (
        df.sort_values(["_order", "context_length", "precision", "compile", "warmup_steps"])
        .drop(columns="_order")
        .reset_index(drop=True)
    )


def _mean_std(row, phase) -> str:
    if row.get(f"{phase}_ms_mean") is None or pd.isna(row.get(f"{phase}_ms_mean")):
        return "OOM" if "oom" in (row.get("training_status"), row.get("inference_status"), row.get("status")) else "—"
    return f"{fmt(row[f'{phase}_ms_mean'])} ± {fmt(row[f'{phase}_ms_std'])}"


def _main_cells(df: pd.DataFrame, default_warmup: int, precision: str = "fp32") -> pd.DataFrame:
    return df[(df.compile == "eager") & (df.warmup_steps == default_warmup) & (df.precision == precision)]


def section_benchmarking_script(df: pd.DataFrame, default_warmup: int, device: str) -> str:
    out = [
        "### (a) The benchmark",
        "`python -m lmperf.kinds.e2e.cell` builds the model of a given size, a random batch "
        f"({_setting(df, 'batch_size', 'batch')}, {_setting(df, 'vocab_size', 'vocab')}), runs `w` warm-up steps and then times `n` steps with "
        "`timeit.default_timer`, "
        + (
            "calling `torch.cuda.synchronize()` before and after every phase "
            if device != "cpu"
            else "on the CPU (no device to synchronize with), for every phase "
        )
        + "(forward incl. loss, backward, AdamW step), then times inference forwards under "
        "`torch.no_grad`. One process per cell, one JSON record per cell "
        f"(`results/{device}/e2e/`).",
        "",
    ]
    main = _main_cells(df, default_warmup)
    out.append(f"### (b) Forward and backward, {default_warmup} warm-up steps (fp32, mean ± std, ms)")
    if main.empty:
        out.append("_No fp32 records at the default warm-up on this device._")
        return "\n".join(out) + "\n"
    table = pd.DataFrame(
        {
            "model": main.model,
            "parameters": [_millions(v) for v in main.parameter_count],
            "context": main.context_length,
            "forward": [_mean_std(r, "forward") for _, r in main.iterrows()],
            "backward": [_mean_std(r, "backward") for _, r in main.iterrows()],
            "optimizer step": [_mean_std(r, "optimizer_step") for _, r in main.iterrows()],
            "inference fwd": [_mean_std(r, "inference_forward") for _, r in main.iterrows()],
            "fwd CV": [pct(v) for v in main.forward_cv],
            "bwd CV": [pct(v) for v in main.backward_cv],
            "MFU (train)": [pct(v) for v in main.training_step_mfu],
        }
    )
    out.append(md_table(table))
    ok = main[main.training_status == "ok"]
    oom = main[main.training_status == "oom"]
    ratio = ok.backward_ms_mean / ok.forward_ms_mean
    paragraphs = []
    if not ok.empty:
        lo, hi = ratio.min(), ratio.max()
        sentences = [
            f"Backward takes {fmt(lo)}× to {fmt(hi)}× the forward time across the {len(ok)} configurations "
            f"that fit (median {fmt(ratio.median())}×).",
            variability_text(ok, df, default_warmup, device),
        ]
        mfu = ok.training_step_mfu.dropna()
        if not mfu.empty:
            best = ok.loc[ok.training_step_mfu.idxmax()]
            sentences.append(
                f"The training step reaches at most {pct(best.training_step_mfu)} model FLOP utilisation "
                f"({best.model}, context {best.context_length}) against the device's fp32 peak."
            )
        paragraphs.append(" ".join(sentences))
    if not oom.empty:
        cells = ", ".join(f"{r.model}/ctx {r.context_length}" for r in oom.itertuples())
        paragraphs.append(f"Out of memory for a training step: {cells}.")
    return blocks("\n".join(out), *paragraphs) + _section_warmup(df, default_warmup, device)


WARMUP_WHY = {
    "cuda": "Why: the first steps pay one-time costs that later steps do not — loading CUDA kernels "
    "into the context, cuBLAS handle creation and algorithm selection, the caching allocator "
    "growing its pool with fresh `cudaMalloc` calls, and AdamW creating its state on the first "
    "optimizer step. Without warm-up these land in the measured samples, inflating the mean and "
    "the standard deviation.",
    "cpu": "Why: the first steps pay one-time costs — the allocator and thread pools growing to their "
    "working size, first-touch page faults on fresh buffers, operator dispatch caches filling, and "
    "AdamW creating its state on the first optimizer step. Without warm-up these land in the "
    "measured samples, inflating the mean and the standard deviation.",
}


def _setting(df: pd.DataFrame, key: str, word: str) -> str:
    """'batch 4' from the records' settings ('batch 4, 8' where they differ)."""
    values = sorted({int(v) for v in df[key].dropna()}) if key in df else []
    return f"{word} " + (", ".join(f"{v:,}" for v in values) if values else "—")


def _millions(count) -> str:
    return "—" if count is None or pd.isna(count) else f"{count / 1e6:,.1f}M"


def _max_cv(row) -> float:
    return max(v for v in (row.forward_cv, row.backward_cv) if v is not None and not pd.isna(v))


def launch_bound(df: pd.DataFrame, model: str, ctx: int, warmup_steps: int, precision: str = "fp32") -> bool | None:
    """Doubling the context raises the forward time by less than LAUNCH_BOUND_GROWTH (None: no pair),
    compared between cells of one warm-up count."""
    cells = df[
        (df.model == model) & (df.precision == precision) & (df.compile == "eager") & (df.warmup_steps == warmup_steps)
    ]
    here = cells[cells.context_length == ctx].forward_ms_median.dropna()
    double = cells[cells.context_length == 2 * ctx].forward_ms_median.dropna()
    if here.empty or double.empty:
        return None
    return bool(double.iloc[0] / here.iloc[0] < LAUNCH_BOUND_GROWTH)


def variability_text(ok: pd.DataFrame, df: pd.DataFrame, default_warmup: int, device: str = "gpu") -> str:
    """Where the forward and backward CV is under LOW_CV (negligible) and where it is not, and why."""
    ok = ok.dropna(subset=["forward_cv", "backward_cv"])
    if ok.empty:
        return ""
    cv = ok.apply(_max_cv, axis=1)
    high = ok[cv >= LOW_CV]
    text = (
        f"Variability after {default_warmup} warm-up steps: the coefficient of variation (std/mean) of forward "
        f"and backward is under {pct(LOW_CV, 0)} (`LOW_CV`, our threshold for negligible) in {len(ok) - len(high)} "
        f"of {len(ok)} cells"
    )
    if high.empty:
        return text + f" — all of them (at most {pct(cv.max())}), so it is negligible everywhere."
    steady_models = [m for m in dict.fromkeys(ok.model) if (cv[ok.model == m] < LOW_CV).all()]
    contexts = sorted(ok.context_length.unique())
    steady_from = next((c for c in contexts if (cv[ok.context_length >= c] < LOW_CV).all()), None)
    where = []
    if steady_models:
        where.append(
            f"for {', '.join(steady_models)} at every context (at most {pct(cv[ok.model.isin(steady_models)].max())})"
        )
    if steady_from is not None:
        where.append(f"for every size at context ≥ {steady_from}")
    text += (
        (": negligible " + " and ".join(where) if where else "")
        + ("; above it in every one: " if len(high) == len(ok) else "; above it only for ")
        + ", ".join(f"{r.model}/{r.context_length} ({pct(_max_cv(r))})" for r in high.itertuples())
        + "."
    )
    judged = {
        f"{r.model}/{r.context_length}": launch_bound(df, r.model, r.context_length, warmup_steps=default_warmup)
        for r in high.itertuples()
    }
    judged = {cell: b for cell, b in judged.items() if b is not None}
    bound = [cell for cell, b in judged.items() if b]
    free = [cell for cell, b in judged.items() if not b]
    cpu = device == "cpu"
    word = "overhead-bound" if cpu else "launch-bound"
    test = (
        f"doubling the context raises {{}} median forward time, not the mean the table shows, by less than "
        f"{fmt(LAUNCH_BOUND_GROWTH)}×, `LAUNCH_BOUND_GROWTH`; medians are robust to the jitter itself"
    )
    if bound:
        text += (
            f" Of those, {len(bound)} of {len(judged)} are {word} ({', '.join(bound)}: {test.format('their')}): "
            + (
                "their steps are set by per-operator overhead on the CPU (Python, dispatch, allocation), not by "
                "the arithmetic, so the spread is that overhead's jitter"
                if cpu
                else "their steps are set by how fast the CPU launches kernels, so the spread is CPU launch jitter"
            )
            + (", not too few warm-up steps." if not free else ".")
        )
        if free:
            text += f" The other {len(free)} ({', '.join(free)}) are not {word} by that test."
    elif judged:
        none_test = test.format("each one's").replace("by less than", "by at least")
        text += f" None of the {len(judged)} of them with a cell at twice the context is {word} ({none_test})."
    return text


def _section_warmup(df: pd.DataFrame, default_warmup: int, device: str) -> str:
    sweep_ctx = df[df.warmup_steps != default_warmup].context_length.unique()
    out = ["", "### (c) Fewer warm-up steps"]
    if len(sweep_ctx) == 0:
        return "\n".join(out + ["_No warm-up sweep records on this device._"]) + "\n"
    ctx = int(sweep_ctx[0])
    sweep = df[
        (df.context_length == ctx) & (df.compile == "eager") & (df.precision == "fp32") & (df.training_status == "ok")
    ]
    table = sweep[
        [
            "model",
            "warmup_steps",
            "forward_ms_mean",
            "forward_cv",
            "forward_first_over_median",
            "backward_ms_mean",
            "backward_cv",
            "backward_first_over_median",
        ]
    ].copy()
    for col in ("forward_cv", "backward_cv"):
        table[col] = [pct(v) for v in table[col]]
    table.columns = [
        "model",
        "warm-up",
        "fwd mean (ms)",
        "fwd CV",
        "fwd 1st/median",
        "bwd mean (ms)",
        "bwd CV",
        "bwd 1st/median",
    ]
    out.append(f"Context {ctx}, fp32; `1st/median` is the first measured step over the median of the others.\n")
    out.append(md_table(table))
    sentences = []
    for model, group in sweep.groupby("model", sort=False):
        by_w = group.set_index("warmup_steps")
        if 0 in by_w.index and default_warmup in by_w.index:
            w0, wd = by_w.loc[0], by_w.loc[default_warmup]
            sentences.append(
                f"{model}: with no warm-up the first forward takes {fmt(w0.forward_first_over_median)}× the median "
                f"and the forward CV is {pct(w0.forward_cv)} (mean {fmt(w0.forward_ms_mean)} ms) against "
                f"{pct(wd.forward_cv)} (mean {fmt(wd.forward_ms_mean)} ms) after {default_warmup} warm-up steps"
                + (f"; one warm-up step gives {pct(by_w.loc[1].forward_cv)}" if 1 in by_w.index else "")
                + "."
            )
    noisier, negligible = [], []
    for model, group in sweep.groupby("model", sort=False):
        by_w = group.set_index("warmup_steps")
        fewer = [w for w in by_w.index if 0 < w < default_warmup]
        if (
            default_warmup in by_w.index
            and fewer
            and all(by_w.loc[default_warmup].forward_cv > by_w.loc[w].forward_cv for w in fewer)
        ):
            (noisier if by_w.loc[default_warmup].forward_cv >= LOW_CV else negligible).append(model)
    fewer_words = " or ".join(str(w) for w in sorted(set(sweep.warmup_steps)) if 0 < w < default_warmup)
    if noisier:
        sentences.append(
            f"For {', '.join(noisier)} the forward CV after {default_warmup} warm-up steps is higher than "
            f"after {fewer_words} and at or above {pct(LOW_CV, 0)} (`LOW_CV`): beyond the first step, more "
            "warm-up does not remove their noise (see (b))."
        )
    if negligible:
        sentences.append(
            f"For {', '.join(negligible)} the forward CV is {'also ' if noisier else ''}higher after "
            f"{default_warmup} warm-up steps than after "
            f"{fewer_words}, but under {pct(LOW_CV, 0)} (`LOW_CV`) either way: a difference within what we "
            "call negligible."
        )
    if sentences:
        out.append(" ".join(sentences))
        out.append("\n" + WARMUP_WHY["cpu" if device == "cpu" else "cuda"])
    return "\n".join(out) + "\n"


def bf16_on_cpu(step_speedups: pd.Series) -> str:
    """Why bf16 is no faster, or slower, on a CPU: said in CPU terms, with the measured range."""
    slower = int((step_speedups < 1 - SAME).sum())
    faster = int((step_speedups > 1 + SAME).sum())
    return (
        f"With bf16 the training step runs at {span(step_speedups.min(), step_speedups.max())} fp32's speed "
        f"over {len(step_speedups)} cells: slower in {slower}, faster in {faster}, within {pct(SAME, 0)} of fp32 "
        f"(`SAME`, about as fast) in {len(step_speedups) - slower - faster}. bf16 on a CPU is not a fast path as it "
        "is on a GPU: whether a CPU's bf16 matmuls beat its fp32 ones depends on its instruction set (AMX or "
        "AVX-512 BF16 run them natively; without them they take a slow fallback path, far below fp32's rate; "
        "speed_ladder's measured square-GEMM ceilings give this machine's rate in both precisions), autocast "
        "adds a cast of every matmul's inputs and weights, and the elementwise operators, much of a tiny "
        "model's step, gain little from bf16. With tiny models and a few measured steps the timings are also "
        "noisy. So these ratios only show that the bf16 path runs; they say nothing about what bf16 gains on a "
        "GPU."
    )


def section_mixed_precision(df: pd.DataFrame, default_warmup: int, device: str = "gpu") -> str:
    out = [
        "### (c) bf16 mixed precision in the end-to-end benchmark",
        "`torch.autocast(dtype=torch.bfloat16)` around forward and loss, fp32 parameters and optimizer; "
        "speedup = fp32 time / bf16 time.\n",
    ]
    fp32 = _main_cells(df, default_warmup, "fp32").set_index(["model", "context_length"])
    bf16 = _main_cells(df, default_warmup, "bf16").set_index(["model", "context_length"])
    both = fp32.merge(bf16, left_index=True, right_index=True, suffixes=("_fp32", "_bf16"), how="inner")
    if both.empty:
        return "\n".join(out + ["_No fp32/bf16 pairs on this device._"]) + "\n"
    table = pd.DataFrame(
        {
            "model": [i[0] for i in both.index],
            "context": [i[1] for i in both.index],
            "fwd fp32 (ms)": both.forward_ms_mean_fp32.values,
            "fwd bf16 (ms)": both.forward_ms_mean_bf16.values,
            "fwd speedup": (both.forward_ms_mean_fp32 / both.forward_ms_mean_bf16).values,
            "bwd fp32 (ms)": both.backward_ms_mean_fp32.values,
            "bwd bf16 (ms)": both.backward_ms_mean_bf16.values,
            "bwd speedup": (both.backward_ms_mean_fp32 / both.backward_ms_mean_bf16).values,
            "step speedup": (both.training_step_ms_mean_fp32 / both.training_step_ms_mean_bf16).values,
        }
    )
    out.append(md_table(table))
    ok = table.dropna(subset=["step speedup"])
    if device == "cpu":
        if not ok.empty:
            out.append(bf16_on_cpu(ok["step speedup"].astype(float)))
        return "\n".join(out) + "\n"
    if not ok.empty:
        per_model = ok.groupby("model", sort=False)["step speedup"].agg(["min", "max"])
        parts = [f"{m} {fmt(r['min'])}–{fmt(r['max'])}×" for m, r in per_model.iterrows()]
        sentences = ["Training-step speedup from bf16, by size (range over context lengths): " + "; ".join(parts) + "."]
        paying = [m for m, r in per_model.iterrows() if r["min"] >= PAYOFF_SPEEDUP]
        if paying:
            sentences.append(
                f"bf16 pays off (at least {fmt(PAYOFF_SPEEDUP)}×, `PAYOFF_SPEEDUP`, at every context length) from "
                f"**{paying[0]}** on"
                + ("" if paying == list(per_model.index[-len(paying) :]) else " (not monotonically in size)")
                + "."
            )
        else:
            sentences.append(f"At no size does bf16 make every training step at least {fmt(PAYOFF_SPEEDUP)}× faster.")
        first, last = per_model.index[0], per_model.index[-1]
        sentences.append(
            f"The benefit grows with size: the best speedup is {fmt(per_model.loc[first, 'max'])}× for {first} "
            f"and {fmt(per_model.loc[last, 'max'])}× for {last}, as larger matmuls keep the tensor cores busy "
            "while small models stay bound by kernel launches and elementwise work that bf16 does not "
            "speed up."
            if per_model.loc[last, "max"] > per_model.loc[first, "max"]
            else f"The benefit does not grow with size here ({first}: {fmt(per_model.loc[first, 'max'])}×, "
            f"{last}: {fmt(per_model.loc[last, 'max'])}×)."
        )
        out.append(" ".join(sentences))
    return "\n".join(out) + "\n"


def cold_compiles(records: list[dict]) -> pd.DataFrame:
    """The compile job's records (kind ``e2e_compile``), one row per compiled cell: its cold first
    training forward+backward and first no-grad forward (seconds; None where that part ran out of
    memory executing, after compiling), how many compiled at once, and each process's span."""
    rows = []
    for r in records:
        m, prov = r["metrics"], r["provenance"]
        rows.append(
            {
                "model": r["cell"]["model"],
                "context_length": r["cell"]["context_length"],
                "precision": r["cell"]["precision"],
                # Dynamo's compile time of each part (recorded whether or not executing it then ran out of
                # memory); records before it was kept: the part's first call, where it completed
                "cold_train_s": _compile_s(m, "training", "training_first_step_ms"),
                "cold_inference_s": _compile_s(m, "inference", "inference_first_forward_ms"),
                "concurrent": (prov.get("settings") or {}).get("concurrent_compiles"),
                "start": pd.Timestamp(prov["process_start_time"]) if prov.get("process_start_time") else None,
                "age_s": prov.get("process_age_s"),
            }
        )
    return pd.DataFrame(rows)


def _compile_s(metrics: dict, part: str, first_call_key: str) -> float | None:
    if metrics.get(f"{part}_compile_s") is not None:
        return metrics[f"{part}_compile_s"]
    if metrics.get(f"{part}_status") == "ok" and metrics.get(first_call_key) is not None:
        return metrics[first_call_key] / 1e3
    return None


def compile_job_sentence(cold: pd.DataFrame, device: str) -> str:
    """' Compiling cold …': the compile job's per-cell times and its wall time, from its records."""
    train, infer = cold.cold_train_s.dropna(), cold.cold_inference_s.dropna()
    most = int(cold.concurrent.max()) if cold.concurrent.notna().any() else None
    spans = cold.dropna(subset=["start", "age_s"])
    wall = ""
    if not spans.empty:
        end = max(row.start + pd.Timedelta(seconds=row.age_s) for row in spans.itertuples())
        wall = f" The {len(spans)} compiles took {fmt((end - spans.start.min()).total_seconds() / 60)} min of wall time in all."
    return (
        " Compiling happens before the measured cells, cold (each cell's cache emptied first) and "
        + (f"up to {most} cell{'s' if most != 1 else ''}" if most else "several cells")
        + " at once in a job of its "
        f"own (`lmperf.kinds.e2e.compile_job`, records in `results/{device}/e2e_compile/`): per cell, compiling "
        "the training graphs (forward and backward) took "
        + (span(train.min(), train.max(), " s") if not train.empty else "— (none completed)")
        + " and the no-grad graph "
        + (span(infer.min(), infer.max(), " s") if not infer.empty else "— (none completed)")
        + " (Dynamo's compile time: tracing, AOTAutograd, Inductor), each slowed by the compiles beside it "
        "(compiling alone is faster, but one at a time)."
        + (
            " Each process may allocate only its model's share of the GPU's memory, so executing the step after "
            "compiling mostly runs out of memory there, which loses no compiled graph."
            if device != "cpu"
            else ""
        )
        + wall
    )


def compile_scope(record: dict) -> str:
    """What a compiled cell's record compiled: "blocks" (`lmperf.kinds.e2e.cell.compile_blocks`), or "model"
    for records from before the setting, which compiled the whole model as one graph."""
    return (record["provenance"].get("settings") or {}).get("compile_scope", "model")


COMPILE_SCOPES = {"blocks": "block by block", "model": "as one graph (`torch.compile` of the whole model)"}
BLOCKS_EXPLAINED = (
    "Block by block is `torch.compile` of each Transformer block and of the final norm "
    "(`lmperf.kinds.e2e.cell.compile_blocks`): the identical blocks share one compiled graph, so a cold compile "
    "costs one block whatever the depth, and the embedding lookup, output projection and loss run eagerly; "
    "against one whole-model graph it gives up only fusion across a block's boundary."
)


def compile_scope_sentence(compiled: pd.DataFrame) -> str:
    """How the compiled cells compiled the model, from their records (a mix is counted)."""
    if compiled.empty or "compile_scope" not in compiled:
        return ""
    counts = compiled.compile_scope.fillna("model").value_counts()
    if len(counts) == 1:
        text = f"The compiled cells compile the model {COMPILE_SCOPES[counts.index[0]]}."
    else:
        parts = [f"{n} of {len(compiled)} {COMPILE_SCOPES[scope]}" for scope, n in counts.items()]
        text = "The compiled cells' records differ in how they compiled the model: " + ", ".join(parts) + "."
    return text + (" " + BLOCKS_EXPLAINED if "blocks" in counts else "")


def section_compile(
    df: pd.DataFrame, default_warmup: int, device: str = "gpu", cold: pd.DataFrame | None = None
) -> str:
    base = df[(df.warmup_steps == default_warmup)]
    scope = compile_scope_sentence(base[base.compile == "compiled"])
    out = [
        "### (b) The whole model under `torch.compile`",
        f"Eager against compiled, {default_warmup} warm-up steps (compilation happens in warm-up, or before the cell: "
        "see below)." + (f" {scope}" if scope else "") + "\n",
    ]
    eager = base[base.compile == "eager"].set_index(["model", "context_length", "precision"])
    comp = base[base.compile == "compiled"].set_index(["model", "context_length", "precision"])
    both = eager.merge(comp, left_index=True, right_index=True, suffixes=("_eager", "_compiled"), how="inner")
    if both.empty:
        return (
            "\n".join(
                out
                + [
                    "_No compiled cell of this device has a record yet (the header lists the grid's cells not measured)._"
                ]
            )
            + "\n"
        )
    table = pd.DataFrame(
        {
            "model": [i[0] for i in both.index],
            "context": [i[1] for i in both.index],
            "precision": [i[2] for i in both.index],
            "inference fwd eager (ms)": both.inference_forward_ms_mean_eager.values,
            "inference fwd compiled (ms)": both.inference_forward_ms_mean_compiled.values,
            "fwd speedup": (both.inference_forward_ms_mean_eager / both.inference_forward_ms_mean_compiled).values,
            "train step eager (ms)": both.training_step_ms_mean_eager.values,
            "train step compiled (ms)": both.training_step_ms_mean_compiled.values,
            "step speedup": (both.training_step_ms_mean_eager / both.training_step_ms_mean_compiled).values,
        }
    )
    # the first step's and first forward's wall time (compilation included); records before they were kept lack them
    # (a cell whose compiled training ran out of memory has no first step: its time is the time to the error)
    for column, key, status in (
        ("first train step compiled (s)", "training_first_step_ms_compiled", "training_status_compiled"),
        ("first inference fwd compiled (s)", "inference_first_forward_ms_compiled", "inference_status_compiled"),
    ):
        if key in both:
            seconds = both[key] / 1e3
            if status in both:
                seconds = seconds.where(both[status].isna() | (both[status] == "ok"))
            table[column] = seconds.values
    if cold is not None and not cold.empty:
        cold_by_cell = cold.set_index(["model", "context_length", "precision"])
        for column, key in (
            ("cold compile, training (s)", "cold_train_s"),
            ("cold compile, no-grad (s)", "cold_inference_s"),
        ):
            table[column] = [cold_by_cell[key].get(i) for i in both.index]
    out.append(md_table(table))
    if "compile_cache_hits_compiled" in both:  # not a column of the printed table: it says which first steps were warm
        table["compile cache hits"] = both["compile_cache_hits_compiled"].values
    ok = table.dropna(subset=["fwd speedup", "step speedup"])
    if not ok.empty:
        covered = ", ".join(
            f"{m} (context {', '.join(str(c) for c in sorted(set(g.context)))})"
            for m, g in ok.groupby("model", sort=False)
        )
        # contexts with an eager cell and no compiled one (a compiled cell that ran out of memory counts as compiled)
        eager_ctx = set(base[(base.compile == "eager") & base.precision.isin(set(ok.precision))].context_length)
        uncompiled = sorted(int(c) for c in eager_ctx - set(table.context))
        para = []  # one paragraph: the fragments after the first start with a space
        para.append(
            f"Measured for {covered}. Compiling speeds the inference forward up "
            f"{span(ok['fwd speedup'].min(), ok['fwd speedup'].max())} and the full training step (forward, "
            f"backward, AdamW) {span(ok['step speedup'].min(), ok['step speedup'].max())} over "
            + (f"these {len(ok)} cells." if len(ok) != 1 else "this cell.")
            + (
                f" Not compiled at context {', '.join(map(str, uncompiled))}, which benchmarking_script (b) measures eager: the "
                "compiled cells are those of `grids.<gpu|cpu>.e2e.compile` in config.yaml."
                if uncompiled
                else ""
            )
        )
        if cold is not None and not cold.empty:
            para.append(compile_job_sentence(cold, device))
            first = table["first train step compiled (s)"].dropna() if "first train step compiled (s)" in table else []
            hits = table["compile cache hits"].dropna() if "compile cache hits" in table else pd.Series(dtype=float)
            if len(first):
                para.append(
                    f" The measured cells then loaded their graphs from disk ({int((hits > 0).sum())} of {len(table)} "
                    "count hits of torch.compile's on-disk caches): their first training step took "
                    f"{span(min(first), max(first), ' s')}, tracing and loading included; the measured steps after "
                    "warm-up include no compilation either way."
                )
        elif "first train step compiled (s)" in table and table["first train step compiled (s)"].notna().any():
            warm = warm_compiles(table)
            first = table["first train step compiled (s)"].drop(index=[i for i, _ in warm]).dropna()
            para.append(
                f" Compiling is paid once, in the first step: its wall time is {span(first.min(), first.max(), ' s')}"
                " for the training graph (forward and backward)"
                + (" of the other cells" if warm else "")
                + " and, for the separate no-grad graph of inference, the first forward's column; the measured "
                "steps after warm-up do not include it."
            )
            for i, median in warm:
                row = table.loc[i]
                first_s = fmt(row["first train step compiled (s)"])
                if median is None:
                    para.append(
                        f" {row.model} at context {row.context}: its record counts {int(row['compile cache hits'])} "
                        f"hits of torch.compile's on-disk caches (Inductor's FX graphs, AOTAutograd), so its first "
                        f"training step ({first_s} s) was not a cold compile and is left out of that range."
                    )
                else:
                    para.append(
                        f" {row.model} at context {row.context}: its first training step took {first_s} s, under "
                        f"{pct(WARM_COMPILE_SHARE, 0)} (`WARM_COMPILE_SHARE`) of the median of {row.model}'s other "
                        f"compiled cells ({fmt(median)} s), while it compiles a graph of the same size: most likely "
                        "Inductor's cache already held its training graph (the record does not say whether the "
                        "cache was cold), so it is left out of that range."
                    )
        failed = comp[comp.training_status == "oom"] if "training_status" in comp else comp.iloc[0:0]
        if not failed.empty:
            para.append(
                " Compiled training runs out of memory at: "
                + ", ".join(f"{i[0]}/ctx {i[1]}/{i[2]}" for i in failed.index)
                + "."
            )
        out.append("".join(para))
    return "\n".join(out) + "\n"


def warm_compiles(table: pd.DataFrame) -> list[tuple[object, float | None]]:
    """(row index, None or the median of the others) for each compiled cell of the torch_compile (b) table
    whose first training step was not a cold compile. A record that counts torch.compile's cache hits says
    so itself (hits > 0: warm, None); one from before they were counted is judged by its first step:
    under ``WARM_COMPILE_SHARE`` of the median first step of its model's other compiled cells (at least
    two others needed)."""
    column = "first train step compiled (s)"
    hits = table["compile cache hits"] if "compile cache hits" in table else pd.Series(float("nan"), index=table.index)
    found = []
    for i, row in table.iterrows():
        if pd.isna(row[column]):
            continue
        if not pd.isna(hits[i]):
            if hits[i] > 0:
                found.append((i, None))
            continue
        others = table[(table.model == row.model) & (table.index != i)][column].dropna()
        if len(others) >= 2 and row[column] < WARM_COMPILE_SHARE * others.median():
            found.append((i, float(others.median())))
    return found


def timer_agreement(records: list[dict]) -> pd.DataFrame:
    """Per (cell, phase): timer vs CUDA-event time of the same samples longer than the threshold."""
    rows = []
    for r in records:
        m = r["metrics"]
        for phase in ("forward", "backward", "optimizer_step", "inference_forward"):
            timer = m.get(f"{phase}_ms_samples") or []
            events = m.get(f"{phase}_event_ms_samples") or []
            pairs = [(t, e) for t, e in zip(timer, events) if t > TIMER_CHECK_MIN_MS and e > 0]
            if pairs:
                devs = [t / e - 1 for t, e in pairs]
                rows.append(
                    {
                        **{k: r["cell"][k] for k in CELL_KEYS},
                        "phase": phase,
                        "n": len(pairs),
                        "median_deviation": statistics.median(devs),
                        "max_abs_deviation": max(abs(d) for d in devs),
                    }
                )
    return pd.DataFrame(rows)


def timer_coverage(records: list[dict], agree: pd.DataFrame, left_out: list[dict]) -> str:
    """' in all 60 cells of the course's model …': which cells the timer check compares (those of the
    course's model with a sample over the threshold, of how many) and the cells with another attention
    it leaves out (their coordinates would collide with plain's in a (cell, phase) series); '' where no
    cell has a sample to compare."""
    if agree.empty:
        return ""
    cells = len(agree[list(CELL_KEYS)].drop_duplicates())
    return " " + (
        (
            f"in all {cells} cells of the course's model (`plain` attention)"
            if cells == len(records)
            else f"in the {cells} of the {len(records)} cells of the course's model (`plain` attention) that have "
            "such samples"
        )
        + (
            f"; the {len(left_out)} cells of `e2e.attention_compare` (the whole model with "
            + ", ".join(f"`{name}`" for name in sorted({attention_of(r) for r in left_out}))
            + " attention) are left out"
            if left_out
            else ""
        )
    )


def section_timer_check(records: list[dict], left_out: list[dict] = ()) -> str:
    """The timer check over ``records`` (the course's model, plain attention); ``left_out``: the cells
    with another attention, named as not compared."""
    agree = timer_agreement(records)
    out = [
        "### Step timer against CUDA events",
        "Every CUDA cell records a CUDA event pair around each phase it times with `default_timer`; "
        f"this compares the two (deviation = timer / events − 1) for every sample longer than "
        f"{fmt(TIMER_CHECK_MIN_MS, 0)} ms{timer_coverage(records, agree, list(left_out))}.\n",
    ]
    if agree.empty:
        return "\n".join(out + ["_No CUDA-event samples on this device (CPU run): not applicable._"]) + "\n"
    n = int(agree.n.sum())
    within = sum(int(r.n) for r in agree.itertuples() if r.max_abs_deviation <= TIMER_AGREE_SHARE)
    summary = (
        agree.groupby("phase")
        .agg(
            samples=("n", "sum"),
            median_deviation=("median_deviation", "median"),
            worst_abs_deviation=("max_abs_deviation", "max"),
        )
        .reset_index()
    )
    table = pd.DataFrame(
        {
            "phase": [p.replace("_", " ") for p in summary.phase],
            f"samples over {fmt(TIMER_CHECK_MIN_MS, 0)} ms": summary.samples,
            "median deviation (%)": [f"{100 * v:.2f}" for v in summary.median_deviation],
            "worst absolute deviation (%)": [f"{100 * v:.2f}" for v in summary.worst_abs_deviation],
        }
    )
    out.append(md_table(table))
    worst = agree.loc[agree.max_abs_deviation.idxmax()]
    out.append(
        f"{n} phase samples over {fmt(TIMER_CHECK_MIN_MS, 0)} ms in {len(agree)} (cell, phase) series; "
        f"the series whose every sample is within {pct(TIMER_AGREE_SHARE, 0)} (`TIMER_AGREE_SHARE`) hold "
        f"{within} of them ({pct(within / n)}). "
        f"Median deviation {pct(agree.median_deviation.median(), 2)}; the worst sample deviates "
        f"{pct(worst.max_abs_deviation, 2)} ({worst.model}, ctx {worst.context_length}, {worst.precision}, "
        f"{worst.phase})."
    )
    return "\n".join(out) + "\n"


def figures(df: pd.DataFrame, records: list[dict], default_warmup: int, figures_dir: Path) -> None:
    order = [m for m in model_order() if m in set(df.model)] if not df.empty else []
    main = _main_cells(df, default_warmup) if not df.empty else df
    # Phase times against size, one panel per context length.
    path = figures_dir / "e2e_phase_times.png"
    if main.empty:
        empty_figure(path, "no fp32 records")
    else:
        ctxs = sorted(main.context_length.unique())
        fig, axes = figure(1, len(ctxs), sharey=True)
        for ax, ctx in zip(axes[0], ctxs):
            sub = main[main.context_length == ctx].set_index("model").reindex(order)
            for phase in ("forward", "backward", "optimizer_step"):
                ax.plot(order, sub[f"{phase}_ms_mean"], marker="o", label=phase.replace("_", " "))
            ax.set_yscale("log")
            ax.set_title(f"context {ctx}")
            ax.set_xlabel("model")
            ax.tick_params(axis="x", rotation=45)
        axes[0][0].set_ylabel("ms per step (fp32)")
        axes[0][0].legend(fontsize=8)
        save(fig, path)
    # fp32 / bf16 training-step speedup against size.
    path = figures_dir / "e2e_precision_speedup.png"
    bf16 = _main_cells(df, default_warmup, "bf16") if not df.empty else df
    if main.empty or bf16.empty:
        empty_figure(path, "no fp32/bf16 pairs")
    else:
        fig, axes = figure()
        ax = axes[0][0]
        for ctx in sorted(main.context_length.unique()):
            a = main[main.context_length == ctx].set_index("model").reindex(order)
            b = bf16[bf16.context_length == ctx].set_index("model").reindex(order)
            ax.plot(order, a.training_step_ms_mean / b.training_step_ms_mean, marker="o", label=f"ctx {ctx}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_ylabel("training step fp32 / bf16")
        ax.set_xlabel("model")
        ax.tick_params(axis="x", rotation=45)
        ax.legend(fontsize=8)
        save(fig, path)
    # The warm-up effect: each measured training step, per warm-up count, one panel per model.
    path = figures_dir / "e2e_warmup.png"
    sweep = [
        r
        for r in records
        if r["cell"]["compile"] == "eager"
        and r["cell"]["precision"] == "fp32"
        and r["metrics"].get("training_step_ms_samples")
    ]
    sweep_ctx = sorted({r["cell"]["context_length"] for r in sweep if r["cell"]["warmup_steps"] != default_warmup})
    if not sweep_ctx:
        empty_figure(path, "no warm-up sweep records")
    else:
        sweep = [r for r in sweep if r["cell"]["context_length"] == sweep_ctx[0]]
        models = [m for m in order if any(r["cell"]["model"] == m for r in sweep)]
        fig, axes = figure(1, len(models))
        for ax, model in zip(axes[0], models):
            for r in sorted((r for r in sweep if r["cell"]["model"] == model), key=lambda r: r["cell"]["warmup_steps"]):
                samples = r["metrics"]["training_step_ms_samples"]
                ax.plot(range(1, len(samples) + 1), samples, marker=".", label=f"w={r['cell']['warmup_steps']}")
            ax.set_yscale("log")
            ax.set_title(f"{model}, ctx {sweep_ctx[0]}")
            ax.set_xlabel("measured step")
        axes[0][0].set_ylabel("training step (ms)")
        axes[0][0].legend(fontsize=8)
        save(fig, path)
    # Eager against compiled.
    path = figures_dir / "e2e_compile.png"
    comp = df[(df.compile == "compiled") & (df.warmup_steps == default_warmup)] if not df.empty else df
    if comp.empty:
        empty_figure(path, "no compiled cell measured yet")
    else:
        fig, axes = figure()
        ax = axes[0][0]
        labels, eager_ms, comp_ms = [], [], []
        for r in comp.itertuples():
            e = df[
                (df.model == r.model)
                & (df.context_length == r.context_length)
                & (df.precision == r.precision)
                & (df.compile == "eager")
                & (df.warmup_steps == default_warmup)
            ]
            if e.empty:
                continue
            labels.append(f"{r.model}\n{r.precision}")
            eager_ms.append(e.training_step_ms_mean.iloc[0])
            comp_ms.append(r.training_step_ms_mean)
        xs = range(len(labels))
        ax.bar([x - 0.2 for x in xs], eager_ms, width=0.4, label="eager")
        ax.bar([x + 0.2 for x in xs], comp_ms, width=0.4, label="compiled")
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylabel("training step (ms)")
        ax.legend(fontsize=8)
        save(fig, path)


def attention_table(records: list[dict]) -> pd.DataFrame:
    """Cells measured with another attention than plain, each beside plain's cell of the same coordinates."""
    by_key: dict[tuple, dict[str, dict]] = {}
    for r in records:
        by_key.setdefault(tuple(r["cell"][k] for k in CELL_KEYS), {})[attention_of(r)] = r
    rows = []
    for key, by_attention in by_key.items():
        if set(by_attention) == {"plain"}:
            continue
        plain = by_attention.get("plain")
        plain_m = plain["metrics"] if plain and plain["status"] == "ok" else {}
        for name in sorted(by_attention, key=lambda n: (n != "plain", n)):
            r = by_attention[name]
            m = r["metrics"] if r["status"] == "ok" else {}
            row = dict(zip(("model", "context", "precision"), key[:3]))
            row["attention"] = name
            row["status"] = r["status"]
            for label, metric in (
                ("training step (ms, median)", "training_step_ms_median"),
                ("inference forward (ms, median)", "inference_forward_ms_median"),
                ("training peak (MiB)", "training_peak_allocated_mib"),
            ):
                row[label] = m.get(metric)
            for label, metric in (
                ("training step / plain's", "training_step_ms_median"),
                ("peak / plain's", "training_peak_allocated_mib"),
            ):
                ours, base = m.get(metric), plain_m.get(metric)
                row[label] = ours / base if ours and base else None
            rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    order = {name: i for i, name in enumerate(model_order())}
    return (
        df.assign(_o=df["model"].map(order))
        .sort_values(["_o", "context", "precision"], kind="stable")
        .drop(columns="_o")
        .reset_index(drop=True)
    )


def section_attention_in_model(records: list[dict]) -> str:
    df = attention_table(records)
    head = "### In the whole model\n\n"
    if df.empty:
        return head + (
            "No record on this device yet of a cell that runs the whole model with another attention than "
            "plain: `grids.<gpu|cpu>.e2e.attention_compare` in config.yaml lists them (the report's header "
            "names those of the grid still missing).\n"
        )
    lines = [
        head + "The end-to-end cell (forward, backward and AdamW step of the whole model, "
        "`python -m lmperf.kinds.e2e.cell --attention NAME`) with each attention implementation in every layer; "
        "ratios are against the same cell with the course's `plain` attention. `flash` is "
        "`lmperf.kernels.flash.flash_attention`: our Triton kernels on CUDA, the tiled PyTorch version on a CPU.\n",
    ]
    peaks = ["training peak (MiB)", "peak / plain's"]
    if df["training peak (MiB)"].isna().all():
        # no column of blanks: say why there is no peak memory instead
        df = df.drop(columns=peaks)
        cpu = all(r["provenance"].get("device_slug") == "cpu" for r in records)
        lines[0] += "No peak memory columns: " + (
            "the peak is CUDA's allocator statistic (`torch.cuda.max_memory_allocated`), which a CPU run does "
            "not have.\n"
            if cpu
            else "none of these records has a training peak.\n"
        )
    lines.append(md_table(df))
    for name in sorted(set(df["attention"]) - {"plain"}):
        part = df[df["attention"] == name]
        ratios = part["training step / plain's"].dropna()
        mems = part["peak / plain's"].dropna() if "peak / plain's" in part else pd.Series([], dtype=float)
        if ratios.empty:
            continue
        text = (
            f"With `{name}` a training step takes {span(ratios.min(), ratios.max())} plain's time "
            f"over {len(ratios)} {'cell' if len(ratios) == 1 else 'cells'}"
        )
        if not mems.empty:
            text += f", at {span(mems.min(), mems.max())} its peak memory"
        lines.append(text + ".")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = report_parser(__doc__.splitlines()[0])
    p.add_argument("--default-warmup", type=int, required=True)
    p.add_argument("--csv", required=True)
    p.add_argument("--compile-records", nargs="*", default=[], help="the compile job's records (e2e_compile)")
    args = p.parse_args(argv)
    all_records = load(args.records)
    compile_records = load(args.compile_records)
    write_csv(frame(all_records), args.csv)
    records = [r for r in all_records if attention_of(r) == "plain"]  # the course's model
    df = frame(records)
    sections = Path(args.sections_dir)
    source = source_line(records, args.device, "e2e")
    fig = figures_link(args.device)
    write_text(
        sections / "benchmarking_script.md",
        section_benchmarking_script(df, args.default_warmup, args.device)
        + f"\n![phase times]({fig}/e2e_phase_times.png) ![warm-up]({fig}/e2e_warmup.png)\n"
        + source,
    )
    write_text(
        sections / "benchmarking_mixed_precision_c.md",
        section_mixed_precision(df, args.default_warmup, args.device)
        + f"\n![bf16 speedup]({fig}/e2e_precision_speedup.png)\n"
        + source,
    )
    write_text(
        sections / "torch_compile_b.md",
        section_compile(df, args.default_warmup, args.device, cold_compiles(compile_records))
        + f"\n![compile]({fig}/e2e_compile.png)\n"
        + source
        + (source_line(compile_records, args.device, "e2e_compile") if compile_records else ""),
    )
    others = [r for r in all_records if attention_of(r) != "plain"]
    write_text(sections / "timer_check.md", section_timer_check(records, others) + source)
    write_text(
        sections / "flash_benchmarking_model.md",
        section_attention_in_model(all_records) + source_line(all_records, args.device, "e2e"),
    )
    figures(df, records, args.default_warmup, Path(args.figures_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
