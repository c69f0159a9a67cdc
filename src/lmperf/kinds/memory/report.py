"""Report of the memory cells: peak tables, active-memory timelines and the memory_profiling answer.

Writes the fragment ``memory_profiling.md`` ((a)-(e)), ``tables/memory.csv`` (one row per cell),
``tables/memory_top_allocations.csv``, one timeline figure per cell
(``figures/memory_timeline_<model>_ctx<ctx>_<precision>_<mode>.png``) and the fp32-against-bf16
peak figure ``figures/memory_peaks.png``. Everything is read from the records (the snapshot
pickles are not needed); every number in the prose is computed here.

    python -m lmperf.kinds.memory.report --device cpu --csv … --top-csv … --sections-dir … \
        --figures-dir … --reference-model 2.7B --batch-size 4 --reference-context-length 512 \
        --records results/cpu/memory/*.json
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lmperf.core.sizes import config_from_name
from lmperf.kinds.memory.account import (
    MIB,
    analytic_account,
    residual_stream_bytes,
    vocab_from_parameter_count,
)
from lmperf.report.common import (
    blocks,
    empty_figure,
    figure,
    figures_link,
    fmt,
    load,
    md_table,
    pct,
    report_parser,
    save,
    source_line,
    write_csv,
    write_text,
)

GIB_PER_MIB = 1 / 1024
# A stage "shows" in the timeline when its net change or its excursion above its start is at
# least this share of the cell's peak.
VISIBLE_SHARE = 0.01
# The allocator's peak (torch.cuda.max_memory_allocated) counts whole blocks; the replay counts the
# trace's requested bytes. A cached block is handed out unsplit when the rest would be under 1 MiB
# (the large pool's split threshold), so each live allocation may count up to this much more.
BLOCK_SLACK_MIB = 1.0
# Components that "dominate" a peak hold at least this share of it.
DOMINANT_SHARE = 0.5
# bf16 and fp32 peaks of one cell are "close" when they differ by less than this share of fp32's.
CLOSE_PEAK_SHARE = 0.05


def inference_peak_changes(records: list[dict]) -> list[float]:
    """bf16 peak / fp32 peak − 1 of every (model, context) whose inference cell ran in both precisions."""
    peaks = {
        (r["cell"]["model"], r["cell"]["context_length"], r["cell"]["precision"]): r["metrics"].get(
            "peak_allocated_mib"
        )
        for r in records
        if r["cell"]["mode"] == "inference" and r["status"] == "ok"
    }
    return [
        bf16 / peaks[(model, ctx, "fp32")] - 1
        for (model, ctx, precision), bf16 in sorted(peaks.items())
        if precision == "bf16" and bf16 and peaks.get((model, ctx, "fp32"))
    ]


def close_peaks_clause(records: list[dict]) -> str:
    """How close bf16 and fp32 inference peaks are, against CLOSE_PEAK_SHARE; '' without a pair."""
    changes = inference_peak_changes(records)
    if not changes:
        return ""
    worst = max(abs(c) for c in changes)
    if worst < CLOSE_PEAK_SHARE:
        return (
            f", so bf16 and fp32 inference peaks are close: they differ by at most {pct(worst)} (under "
            f"{pct(CLOSE_PEAK_SHARE, 0)}, `CLOSE_PEAK_SHARE`; see (c))"
        )
    return (
        f"; yet bf16 and fp32 inference peaks differ by up to {pct(worst)} ({pct(CLOSE_PEAK_SHARE, 0)} or more, "
        "`CLOSE_PEAK_SHARE`; see (c))"
    )


def analytic(record: dict) -> dict:
    """The analytic account of a memory cell, recomputed from its cell by lmperf.kinds.memory.account
    (the account the record stored may predate a correction of the model)."""
    c = record["cell"]
    config = config_from_name(c["model"])
    stored = (record["metrics"].get("analytic") or {}).get("parameter_count")
    vocab = c.get("vocab_size") or (vocab_from_parameter_count(config, stored) if stored else config.vocab_size)
    config = config_from_name(c["model"], vocab_size=vocab)
    return analytic_account(config, c["batch_size"], c["context_length"], c["precision"], c["mode"])


# How the report names the phase of the analytic peak: the account's training peak is either its
# end-of-forward total or its optimizer-step total, whichever is larger (lmperf.kinds.memory.account).
ANALYTIC_END_OF_FORWARD = "end of forward"
ANALYTIC_OPTIMIZER_STEP = "optimizer_step"


def analytic_peak_phase(account: dict) -> str | None:
    """The phase that holds the analytic account's peak, from its two training totals (MiB): the end of
    the forward (parameters, AdamW state, saved activations and weight copies) where that is the larger,
    else the optimizer step (the measured phases' name); inference: the account's own phase (forward)."""
    fwd, step = account.get("end_of_forward_mib"), account.get("optimizer_step_mib")
    if fwd is None or step is None:
        return account.get("predicted_peak_phase")
    return ANALYTIC_END_OF_FORWARD if fwd >= step else ANALYTIC_OPTIMIZER_STEP


def timeline_name(cell: dict) -> str:
    return f"memory_timeline_{cell['model']}_ctx{cell['context_length']}_{cell['precision']}_{cell['mode']}.png"


def frame(records: list[dict]) -> pd.DataFrame:
    rows = []
    for r in records:
        c, m = r["cell"], r["metrics"]
        a = analytic(r) if r["status"] != "unsupported" else {}
        rows.append(
            {
                "model": c["model"],
                "context_length": c["context_length"],
                "precision": c["precision"],
                "mode": c["mode"],
                "status": r["status"],
                "reason": r.get("reason"),
                "peak_allocated_mib": m.get("peak_allocated_mib"),
                "peak_reserved_mib": m.get("peak_reserved_mib"),
                "replay_peak_active_mib": m.get("replay_peak_active_mib"),
                "replay_initial_active_mib": m.get("replay_initial_active_mib"),
                "peak_phase": m.get("peak_phase"),
                "analytic_peak_mib": a.get("predicted_peak_mib"),
                "analytic_peak_phase": analytic_peak_phase(a),
                "analytic_parameters_mib": a.get("parameters_mib"),
                "analytic_gradients_mib": a.get("gradients_mib"),
                "analytic_optimizer_state_mib": a.get("optimizer_state_mib"),
                "analytic_activations_mib": a.get("activations_mib"),
                "analytic_weight_copies_mib": a.get("weight_copies_mib"),
                "saved_for_backward_mib": m.get("saved_for_backward_mib"),
                **{f"measured_{k}_at_peak_mib": v for k, v in (m.get("breakdown_at_peak_mib") or {}).items()},
                "trace_events": m.get("trace_events"),
                "snapshot_path": m.get("snapshot_path"),
            }
        )
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    return df.sort_values(["model", "context_length", "mode", "precision"]).reset_index(drop=True)


def top_frame(records: list[dict]) -> pd.DataFrame:
    rows = []
    for r in records:
        for rank, a in enumerate(r["metrics"].get("top_allocations") or [], 1):
            rows.append(
                {
                    **{k: r["cell"][k] for k in ("model", "context_length", "precision", "mode")},
                    "rank": rank,
                    "size_mib": a["size_mib"],
                    "category": a.get("category"),
                    "name": a.get("name"),
                    "allocated_in": a["allocated_in"],
                    "frames": " ← ".join(a["frames"]),
                }
            )
    return pd.DataFrame(rows)


def _gib(mib) -> str:
    return "—" if mib is None or pd.isna(mib) else f"{mib * GIB_PER_MIB:.2f}"


def _peak_cell(row) -> str:
    """Peak for a table: GiB, or OOM (with the peak reached before it, when recorded)."""
    if row is None:
        return "—"
    if row["status"] == "unsupported":
        return "unsupported"
    if row["status"] == "oom":
        reached = row.get("replay_peak_active_mib")
        return "OOM" + (f" (reached {_gib(reached)})" if reached is not None and not pd.isna(reached) else "")
    return _gib(row["peak_allocated_mib"])


def _lookup(df, ctx, precision, mode):
    sub = df[(df.context_length == ctx) & (df.precision == precision) & (df["mode"] == mode)]
    return None if sub.empty else sub.iloc[0]


# -- (a) the stages in the timeline --------------------------------------------------------------


def stage_signatures(metrics: dict) -> dict:
    """Per phase: net change and excursion above its start (MiB), from the recorded phases."""
    out = {}
    for p in metrics.get("phases") or []:
        out[p["phase"]] = {
            "net_mib": p["end_active_mib"] - p["start_active_mib"],
            "excursion_mib": p["peak_active_mib"] - p["start_active_mib"],
            "peak_mib": p["peak_active_mib"],
            "start_mib": p["start_active_mib"],
            "end_mib": p["end_active_mib"],
        }
    return out


def stages_distinguishable(sig: dict, peak_mib: float) -> tuple[bool, list[str]]:
    """Training: the forward must rise, the backward must change active memory (activations
    released, gradients allocated), the optimizer step must show a transient and zero_grad a drop,
    each by at least VISIBLE_SHARE of the peak. Returns the verdict and the signatures that failed."""
    b = sig.get("backward", {})
    need = {
        "forward rises": sig.get("forward", {}).get("net_mib", 0) >= VISIBLE_SHARE * peak_mib,
        "backward changes active memory": max(
            abs(b.get("net_mib", 0)), b.get("excursion_mib", 0), b.get("peak_mib", 0) - b.get("end_mib", 0)
        )
        >= VISIBLE_SHARE * peak_mib,
        "optimizer step has a transient": sig.get("optimizer_step", {}).get("excursion_mib", 0)
        >= VISIBLE_SHARE * peak_mib,
        "zero_grad drops": -sig.get("zero_grad", {}).get("net_mib", 0) >= VISIBLE_SHARE * peak_mib,
    }
    return all(need.values()), [k for k, ok in need.items() if not ok]


def stage_rows(records: list[dict]) -> list[dict]:
    """One row per recorded cell: where each stage starts, ends and peaks (GiB)."""
    rows = []
    for r in sorted(
        records,
        key=lambda r: (r["cell"]["mode"] != "training", r["cell"]["precision"] != "fp32", r["cell"]["context_length"]),
    ):
        m, c = r["metrics"], r["cell"]
        sig, peak = stage_signatures(m), m.get("replay_peak_active_mib")
        if not sig or peak is None:
            continue
        f, b, o, z = (sig.get(k, {}) for k in ("forward", "backward", "optimizer_step", "zero_grad"))
        row = {
            "mode": c["mode"],
            "precision": c["precision"],
            "context": c["context_length"],
            "start": _gib(f.get("start_mib")),
            "forward: end (max)": f"{_gib(f.get('end_mib'))} ({_gib(f.get('peak_mib'))})",
            "backward: peak → end": f"{_gib(b['peak_mib'])} → {_gib(b['end_mib'])}" if b else "—",
            "optimizer step: transient": _gib(o.get("excursion_mib")) if o else "—",
            "zero_grad frees": _gib(-z["net_mib"]) if z else "—",
            "peak (phase)": f"{_gib(peak)} ({m.get('peak_phase')})",
        }
        if c["mode"] == "training":
            ok, failed = stages_distinguishable(sig, peak)
            row["every stage visible"] = "yes" if ok else "no: " + ", ".join(failed)
        else:
            row["every stage visible"] = "(forward only)"
        rows.append(row)
    return rows


def section_a(records: list[dict], device: str) -> str:
    out = [
        "### (a) Active-memory timelines",
        "One recorded step after warm-up per cell (`torch.cuda.memory._record_memory_history`, Python stacks); "
        "the curve is the active memory replayed from the snapshot's `device_traces` (alloc / free_completed), "
        "x = allocator event number. Phases are marked by marker allocations placed in the trace at each "
        "boundary (forward incl. loss, backward, optimizer step, zero_grad), so the boundaries sit exactly in "
        "the allocation order whatever the GPU's asynchrony.\n",
    ]
    fig = f"../results/{device}/figures"
    by_ctx: dict = {}
    for r in records:
        by_ctx.setdefault((r["cell"]["model"], r["cell"]["context_length"], r["cell"]["precision"]), []).append(r)
    for (model, ctx, prec), rs in sorted(by_ctx.items(), key=lambda kv: (kv[0][0], kv[0][2] != "fp32", kv[0][1])):
        links = " ".join(
            f"![{r['cell']['mode']}]({fig}/{timeline_name(r['cell'])})"
            for r in sorted(rs, key=lambda r: r["cell"]["mode"])
            if r["status"] != "unsupported"
        )
        if links:
            out.append(f"- {model}, context {ctx}, {prec}: {links}")
    out.append("")
    rows = stage_rows(records)
    unsupported = [r for r in records if r["status"] == "unsupported"]
    if not rows and unsupported:
        return "\n".join(out + [f"_Unsupported on this device: {unsupported[0].get('reason')}._"]) + "\n"
    if not rows:
        return "\n".join(out) + "\n"
    out.append(
        f"What each stage does to active memory (GiB; a stage counts as visible when it moves active memory "
        f"by at least {pct(VISIBLE_SHARE, 0)} of the cell's peak, `VISIBLE_SHARE`):\n"
    )
    out.append(md_table(pd.DataFrame(rows)))
    training = [r for r in rows if r["mode"] == "training"]
    visible = [r for r in training if r["every stage visible"] == "yes"]
    sentences = []
    if training:
        sentences.append(
            f"In a full step the forward raises active memory (activations saved for backward), the backward "
            f"releases them as it allocates the gradients, the optimizer step shows AdamW's transient and zero_grad "
            f"frees the gradients: every stage moves memory by at least {pct(VISIBLE_SHARE, 0)} of the peak in "
            f"{len(visible)} of {len(training)} training cells, so the stages can be told apart from the curve"
            + (
                "."
                if len(visible) == len(training)
                else " there; in the others the stages named in the table move it less."
            )
        )
    inference = [r for r in records if r["cell"]["mode"] == "inference" and r["status"] == "ok"]
    if inference:
        sentences.append(
            "An inference forward (`torch.no_grad`) stands on a flat base (the parameters) and rises only by one "
            "layer's working set at a time: activations are freed once the next layer has consumed them, and under "
            "bf16 autocast each matmul's bf16 weight copy is freed after its matmul too (`x @ self.weight.T` casts "
            "a view, which autocast does not cache)" + close_peaks_clause(records) + "."
        )
    out.append(" ".join(sentences))
    return "\n".join(out) + "\n"


# -- (b), (c) the peaks --------------------------------------------------------------------------


def peak_table(df: pd.DataFrame, precision: str) -> pd.DataFrame:
    rows = []
    for ctx in sorted(df.context_length.unique()):
        inf, tr = _lookup(df, ctx, precision, "inference"), _lookup(df, ctx, precision, "training")
        rows.append(
            {
                "context": int(ctx),
                "forward only (GiB)": _peak_cell(inf),
                "full step (GiB)": _peak_cell(tr),
                "full step, replay (GiB)": _gib(tr["replay_peak_active_mib"]) if tr is not None else "—",
                "full step, analytic (GiB)": _gib(tr["analytic_peak_mib"]) if tr is not None else "—",
                "reserved, full step (GiB)": _gib(tr["peak_reserved_mib"]) if tr is not None else "—",
                "peak phase": tr["peak_phase"] if tr is not None and isinstance(tr["peak_phase"], str) else "—",
            }
        )
    return pd.DataFrame(rows)


def section_b(df: pd.DataFrame, records: list[dict]) -> str:
    out = [
        "### (b) Peak memory per context length (fp32)",
        "Peak allocated (`torch.cuda.max_memory_allocated` over the recorded step, GiB = 1024³ bytes); `replay` is "
        "the peak of the replayed trace (requested bytes, the curve of (a)); `analytic` is the account below "
        "(parameters, gradients, AdamW state and temporaries, saved activations).\n",
    ]
    fp32 = df[df.precision == "fp32"]
    if fp32.empty:
        return "\n".join(out + ["_No fp32 records on this device._"]) + "\n"
    if (fp32.status == "unsupported").all():
        return "\n".join(out + [f"_Unsupported on this device: {fp32.reason.iloc[0]}._"]) + "\n"
    return blocks(
        "\n".join(out),
        md_table(peak_table(df, "fp32")),
        two_peaks_text(records),
        _oom_text(records),
        _account_text(df, records),
    )


def two_peaks_text(records: list[dict]) -> str:
    """Why a cell's allocator peak reads above its replayed peak, checked against BLOCK_SLACK_MIB."""
    gaps = []
    for r in records:
        m = r["metrics"]
        if r["status"] != "ok" or m.get("peak_allocated_mib") is None or m.get("replay_peak_active_mib") is None:
            continue
        n = m.get("live_allocations_at_peak") or 0
        gaps.append((m["peak_allocated_mib"] - m["replay_peak_active_mib"], n, r["cell"]))
    if not gaps:
        return ""
    gap, n, cell = max(gaps, key=lambda g: g[0])
    per = gap / n if n else float("inf")
    within = per <= BLOCK_SLACK_MIB
    return (
        f"\nEach cell has two measured peaks: the allocator's (`full step`, whole blocks) and the replay's "
        f"(`replay`, the requested bytes the trace records). The largest gap, {_gib(gap)} GiB ({cell['precision']}, "
        f"context {cell['context_length']}, {cell['mode']}), is {fmt(per)} MiB per allocation live at the peak "
        f"({n}): "
        + (
            f"within the {fmt(BLOCK_SLACK_MIB)} MiB per allocation (`BLOCK_SLACK_MIB`) that the caching "
            "allocator adds by handing out a cached block unsplit when the rest would be under 1 MiB."
            if within
            else f"more than the {fmt(BLOCK_SLACK_MIB)} MiB per allocation (`BLOCK_SLACK_MIB`) "
            "that block rounding explains; the two peaks do not reconcile."
        )
        + "\n"
    )


def _oom_text(records: list[dict]) -> str:
    """Where each out-of-memory cell failed, from the allocator's `oom` event in its history."""
    lines = []
    for r in sorted(records, key=lambda r: (r["cell"]["precision"] != "fp32", r["cell"]["context_length"])):
        if r["status"] != "oom":
            continue
        c, events = r["cell"], r["metrics"].get("oom_events") or []
        where = "; ".join(
            f"in {e['phase']}, requesting {fmt((e.get('requested_bytes') or 0) / MIB)} MiB with "
            f"{fmt((e.get('device_free_bytes') or 0) / MIB)} MiB free on the device"
            for e in events
        )
        lines.append(
            f"- {c['precision']}, context {c['context_length']}, {c['mode']}: out of memory"
            + (f" {where}" if where else f" ({r.get('reason')})")
            + "."
        )
    return ("\nOut of memory:\n\n" + "\n".join(lines) + "\n") if lines else ""


def _account_text(df: pd.DataFrame, records: list[dict]) -> str:
    """The analytic account beside the measured breakdown, for the training cells with metrics."""
    rows = []
    for r in sorted(records, key=lambda r: (r["cell"]["precision"] != "fp32", r["cell"]["context_length"])):
        m, c = r["metrics"], r["cell"]
        b = m.get("breakdown_at_peak_mib")
        if c["mode"] != "training" or not b or r["status"] == "unsupported":
            continue
        a = analytic(r)
        if not a:
            continue
        rows.append(
            {
                "precision": c["precision"],
                "context": c["context_length"],
                "params (meas/anal)": f"{_gib(b['parameters'])} / {_gib(a['parameters_mib'])}",
                "grads (meas/anal)": f"{_gib(b['gradients'])} / {_gib(a['gradients_mib'])}",
                "AdamW state (meas/anal)": f"{_gib(b['optimizer_state'])} / {_gib(a['optimizer_state_mib'])}",
                "other at peak (meas)": _gib(b["other"]),
                "saved activations (hooks / anal)": f"{_gib(m.get('saved_for_backward_mib'))} / "
                f"{_gib(a['activations_mib'] + a['weight_copies_mib'])}",
                "peak (meas / anal)": f"{_gib(m.get('replay_peak_active_mib'))} / {_gib(a['predicted_peak_mib'])}",
                "peak phase (meas / anal)": f"{m.get('peak_phase')} / {analytic_peak_phase(a)}",
            }
        )
    if not rows:
        return ""
    text = [
        "",
        "Measured composition of the training peak (live allocations at the peak event, named from the "
        "storages of parameters, gradients and AdamW state noted at the phase marks; `other` is activations, "
        "autograd's saved bf16 weight copies and temporaries) beside the analytic account (GiB). `saved activations` compares "
        "the bytes autograd's saved-tensor hooks saw in the recorded forward with the closed form "
        "(`lmperf.kinds.memory.account.saved_activation_bytes`, plus, under bf16, the bf16 copy of every matmul weight "
        "that autograd saves for the backward: the matmul's input gradient needs it; autocast itself caches none, "
        "since `weight.T` is a view). The analytic peak "
        "is the larger of end-of-forward (parameters + AdamW state + saved activations and weight copies) and optimizer step "
        "(parameters + gradients + AdamW state + one parameter-sized temporary of the foreach AdamW); its phase "
        f"reads `{ANALYTIC_END_OF_FORWARD}` or `{ANALYTIC_OPTIMIZER_STEP}` accordingly.\n",
        md_table(pd.DataFrame(rows)),
    ]
    return "\n".join(text)


def section_c(df: pd.DataFrame, records: list[dict]) -> str:
    out = [
        "### (c) bf16 mixed precision",
        "`torch.autocast(dtype=torch.bfloat16)` around the forward and loss, fp32 parameters and AdamW.\n",
    ]
    if not df.empty and (df.status == "unsupported").all():
        return "\n".join(out + [f"_Unsupported on this device: {df.reason.iloc[0]}._"]) + "\n"
    if df.empty or "bf16" not in set(df.precision):
        return "\n".join(out + ["_No bf16 measurements on this device._"]) + "\n"
    out.append(md_table(peak_table(df, "bf16")))
    rows, sentences = [], []
    for mode in ("inference", "training"):
        for ctx in sorted(df.context_length.unique()):
            a, b = _lookup(df, ctx, "fp32", mode), _lookup(df, ctx, "bf16", mode)
            if a is None or b is None or a.status != "ok" or b.status != "ok":
                continue
            rows.append(
                {
                    "mode": mode,
                    "context": int(ctx),
                    "fp32": a.peak_allocated_mib,
                    "bf16": b.peak_allocated_mib,
                    "change": b.peak_allocated_mib / a.peak_allocated_mib - 1,
                    "act_fp32": a.analytic_activations_mib,
                    "act_bf16": b.analytic_activations_mib,
                    "copies": b.analytic_weight_copies_mib,
                    # fp32 state that bf16 does not touch: parameters (and, training, gradients and AdamW's moments)
                    "fixed": sum(
                        v
                        for v in (b.analytic_parameters_mib, b.analytic_gradients_mib, b.analytic_optimizer_state_mib)
                        if v is not None and not pd.isna(v)
                    ),
                }
            )
    if rows:
        out.append("Peak change from fp32 to bf16 (same step, same context):\n")
        out.append(
            md_table(
                pd.DataFrame(
                    [
                        {
                            "mode": r["mode"],
                            "context": r["context"],
                            "fp32 (GiB)": _gib(r["fp32"]),
                            "bf16 (GiB)": _gib(r["bf16"]),
                            "change": pct(r["change"]),
                            "activations fp32 → bf16 (GiB, analytic)": f"{_gib(r['act_fp32'])} → {_gib(r['act_bf16'])}",
                            "bf16 weight copies (GiB, analytic)": _gib(r["copies"]),
                        }
                        for r in rows
                    ]
                )
            )
        )
        for mode in ("inference", "training"):
            sub = [r for r in rows if r["mode"] == mode]
            if not sub:
                continue
            lo, hi = min(r["change"] for r in sub), max(r["change"] for r in sub)
            sentences.append(
                f"{mode.capitalize()}: bf16 changes the peak by {100 * lo:+.1f}% to {100 * hi:+.1f}% "
                "across context lengths."
            )
            share = min(r["fixed"] / r["bf16"] for r in sub)
            state = "parameters" if mode == "inference" else "parameters, gradients and AdamW state"
            sentences.append(
                f"The fp32 {state} (analytic) are at least {pct(share, 0)} of the bf16 peak "
                + (
                    f"and dominate it (≥ {pct(DOMINANT_SHARE, 0)}, `DOMINANT_SHARE`)."
                    if share >= DOMINANT_SHARE
                    else f"and do not dominate it (under {pct(DOMINANT_SHARE, 0)}, `DOMINANT_SHARE`)."
                )
            )
            if mode == "inference":
                sentences.append(
                    "They stay resident; autocast caches no "
                    "bf16 weight copy (`x @ self.weight.T` casts a view, and autocast caches only casts "
                    "of leaf tensors), so only one copy is alive at a time "
                    f"({_gib(sub[0]['copies'])} GiB at most, analytic) and the activations it halves are "
                    "a small share of the peak."
                )
            elif lo > 0:
                sentences.append(
                    "It does not save memory: the fp32 parameters stay resident and autograd saves a "
                    f"bf16 copy of every matmul weight ({_gib(sub[0]['copies'])} GiB) for the backward, "
                    "more than the activation bytes bf16 saves."
                )
            elif hi < 0:
                sentences.append(
                    "The saving comes from the activations (half the bytes per element on the matmul "
                    "side); parameters, gradients and AdamW state stay fp32 and keep their bytes."
                )
        out.append(" ".join(sentences))
    oom_changes = []
    for ctx in sorted(df.context_length.unique()):
        a, b = _lookup(df, ctx, "fp32", "training"), _lookup(df, ctx, "bf16", "training")
        if a is not None and b is not None and a.status != b.status:
            oom_changes.append(f"context {ctx}: fp32 {a.status}, bf16 {b.status}")
    if oom_changes:
        out.append("\nFit changes with precision: " + "; ".join(oom_changes) + ".")
    return "\n".join(out) + "\n"


# -- (d) the residual stream ---------------------------------------------------------------------


def section_d(records: list[dict], reference_model: str, batch: int, reference_ctx: int, contexts: list[int]) -> str:
    config = config_from_name(reference_model)
    nbytes = residual_stream_bytes(config, batch, reference_ctx)
    out = [
        "### (d) One fp32 residual-stream activation",
        f"The residual stream is a tensor of shape (batch, context, d_model). We read the reference "
        f"hyper-parameters as the {reference_model} model (d_model = {config.d_model}) with the common setup's "
        f"batch of {batch} at context {reference_ctx}"
        + (", the longest context this problem profiles" if all(c <= reference_ctx for c in contexts) else "")
        + "; one fp32 activation then takes",
        "",
        f"    {batch} · {reference_ctx} · {config.d_model} · 4 bytes = {nbytes:,} bytes; "
        f"{nbytes:,} / 1024² = **{nbytes / MIB:g} MiB**",
        "",
    ]
    per_ctx = ", ".join(f"{c}: {residual_stream_bytes(config, batch, c) / MIB:g} MiB" for c in contexts)
    if per_ctx:
        out.append(f"At the other profiled lengths (same batch): {per_ctx}.")
    found = []
    for r in sorted(records, key=lambda r: (r["cell"]["context_length"], r["cell"]["precision"], r["cell"]["mode"])):
        c, m = r["cell"], r["metrics"]
        match = (m.get("size_matches") or {}).get("residual_stream")
        if c["model"] != reference_model or match is None:
            continue
        site = match["sites"][0]["frames"] if match["sites"] else "—"
        found.append(
            {
                "context": c["context_length"],
                "precision": c["precision"],
                "mode": c["mode"],
                "size (bytes)": f"{match['size_bytes']:,}",
                "allocations of exactly that size": match["count"],
                "by phase": ", ".join(f"{k} {v}" for k, v in sorted(match["by_phase"].items())) or "—",
                "most common site": site,
            }
        )
    if found:
        table = pd.DataFrame(found)
        hit = table[table["allocations of exactly that size"] > 0]
        out.append(
            "\nAllocations of exactly B·T·d_model·4 bytes in each recorded step (the residual-stream tensors "
            "the trace saw; sites are the innermost frames outside torch):\n"
        )
        out.append(md_table(table))
        ref = table[(table.context == reference_ctx)]
        if not ref.empty:
            n = int(ref["allocations of exactly that size"].max())
            out.append(
                f"At context {reference_ctx} the snapshot "
                + (
                    f"holds {n} allocations of exactly {nbytes:,} bytes (most common site: "
                    f"`{ref.iloc[ref['allocations of exactly that size'].argmax()]['most common site']}`), confirming "
                    "the derivation."
                    if n
                    else "holds no allocation of exactly that size."
                )
            )
        elif hit.empty:
            out.append("No recorded step holds an allocation of exactly that size.")
    else:
        out.append("\n_No memory snapshot of this model on this device to match the size against._")
    return "\n".join(out) + "\n"


# -- (e) the largest allocations -----------------------------------------------------------------


def _representative(records: list[dict], mode: str) -> dict | None:
    """The cell (fp32 preferred, longest context) of a mode whose record lists top allocations."""
    cands = [r for r in records if r["cell"]["mode"] == mode and r["metrics"].get("top_allocations")]
    if not cands:
        return None
    return max(
        cands, key=lambda r: (r["cell"]["precision"] == "fp32", r["status"] == "ok", r["cell"]["context_length"])
    )


def section_e(records: list[dict]) -> str:
    out = [
        "### (e) The largest allocations at the peak",
        "Live allocations at the peak event, largest first: size, what they are (storages of parameters, "
        "gradients and AdamW state are recognised by address), the phase that allocated them, and the innermost "
        "stack frames outside torch (with Python stacks; allocations made inside the autograd engine's thread "
        "during backward have no Python frames).\n",
    ]
    any_ = False
    for mode in ("training", "inference"):
        r = _representative(records, mode)
        if r is None:
            continue
        any_ = True
        c, m = r["cell"], r["metrics"]
        rows = [
            {
                "size (MiB)": a["size_mib"],
                "what": (f"{a['category']}: {a['name']}" if a.get("category") else "—"),
                "allocated in": a["allocated_in"],
                "frames": " ← ".join(f"`{f}`" for f in a["frames"]) or "(none)",
            }
            for a in m["top_allocations"]
        ]
        out.append(
            f"**{mode.capitalize()}, {c['model']}, context {c['context_length']}, {c['precision']}** "
            f"(peak {_gib(m.get('replay_peak_active_mib'))} GiB in {m.get('peak_phase')}, "
            f"{m.get('live_allocations_at_peak')} live allocations):\n"
        )
        out.append(md_table(pd.DataFrame(rows)))
        tops = m["top_allocations"]
        sizes = sorted({round(a["size_mib"], 2) for a in tops}, reverse=True)
        cats = {}
        for a in tops:
            cats[a.get("category") or "other"] = cats.get(a.get("category") or "other", 0) + 1
        lines = {f for a in tops for f in a["frames"][:1]}
        out.append(
            (f"The {len(tops)} largest are" if len(tops) > 1 else "The largest is a")
            + f" {', '.join(f'{s:g}' for s in sizes)} MiB tensor{'s' if len(tops) > 1 else ''}: "
            + ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(cats.items(), key=lambda kv: -kv[1]))
            + (f"; innermost model lines: {', '.join(f'`{x}`' for x in sorted(lines))}." if lines else ".")
        )
        out.append("")
    if not any_:
        out.append("_No recorded snapshots on this device._")
    return blocks("\n".join(out))


# -- figures -------------------------------------------------------------------------------------

PHASE_COLOURS = {
    "forward": "tab:blue",
    "backward": "tab:orange",
    "optimizer_step": "tab:green",
    "zero_grad": "tab:purple",
}


def timeline_figure(record: dict, path: Path) -> None:
    c, m = record["cell"], record["metrics"]
    t = m.get("timeline") or {}
    title = f"{c['model']} ctx {c['context_length']} {c['precision']} {c['mode']}"
    if not t.get("event"):
        empty_figure(path, f"{title}\n{record['status']}: {record.get('reason') or 'no timeline'}")
        return
    fig, axes = figure(figsize=(8, 3.4))
    ax = axes[0][0]
    marks = list(m.get("phase_marks") or [])
    if marks and marks[-1]["phase"] != "end":  # a step cut short (out of memory): shade to the last event
        marks.append({"phase": "end", "event": t["event"][-1]})
    for k, (mk, nxt) in enumerate(zip(marks, marks[1:])):
        ax.axvspan(mk["event"], nxt["event"], color=PHASE_COLOURS.get(mk["phase"], "grey"), alpha=0.12, lw=0)
        # staggered so that the labels of short phases do not overlap
        ax.text(
            (mk["event"] + nxt["event"]) / 2,
            1.0 + 0.07 * (k % 2),
            mk["phase"].replace("_", " "),
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ax.plot(t["event"], [v * GIB_PER_MIB for v in t["active_mib"]], lw=1, color="black", label="active")
    ax.plot(t["event"], [v * GIB_PER_MIB for v in t["reserved_mib"]], lw=0.8, ls="--", color="grey", label="reserved")
    if m.get("peak_event") is not None:
        ax.plot(
            [m["peak_event"]],
            [m["replay_peak_active_mib"] * GIB_PER_MIB],
            "o",
            color="red",
            ms=4,
            label=f"peak {m['replay_peak_active_mib'] * GIB_PER_MIB:.2f} GiB",
        )
    for o in m.get("oom_events") or []:
        ax.axvline(o["event"], color="red", lw=1, ls=":", label="out of memory")
    ax.set_xlabel("allocator event")
    ax.set_ylabel("GiB")
    ax.set_title(title, fontsize=9, pad=22)
    ax.legend(fontsize=7, loc="lower right")
    save(fig, path)


def peaks_figure(df: pd.DataFrame, path: Path) -> None:
    ok = df[df.peak_allocated_mib.notna()] if not df.empty else df
    if ok.empty:
        empty_figure(path, "no measured peaks on this device")
        return
    modes = [m for m in ("inference", "training") if m in set(df["mode"])]
    fig, axes = figure(1, len(modes))
    ctxs = sorted(df.context_length.unique())
    for ax, mode in zip(axes[0], modes):
        for k, prec in enumerate(("fp32", "bf16")):
            xs = [i + (k - 0.5) * 0.38 for i in range(len(ctxs))]
            vals = []
            for ctx in ctxs:
                row = _lookup(df, ctx, prec, mode)
                vals.append(row.peak_allocated_mib * GIB_PER_MIB if row is not None and row.status == "ok" else 0)
            ax.bar(xs, vals, width=0.38, label=prec)
            for x, ctx in zip(xs, ctxs):
                row = _lookup(df, ctx, prec, mode)
                if row is not None and row.status != "ok":
                    ax.text(x, 0, row.status.upper(), rotation=90, ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(ctxs)), [str(c) for c in ctxs])
        ax.set_xlabel("context length")
        ax.set_title("forward only" if mode == "inference" else "full training step", fontsize=9)
    axes[0][0].set_ylabel("peak allocated (GiB)")
    axes[0][0].legend(fontsize=8)
    save(fig, path)


def main(argv=None) -> int:
    p = report_parser(__doc__.splitlines()[0])
    p.add_argument("--csv", required=True)
    p.add_argument("--top-csv", required=True)
    p.add_argument("--reference-model", default="2.7B")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--reference-context-length", type=int, default=512)
    args = p.parse_args(argv)
    records = load(args.records)
    df = frame(records)
    write_csv(df, args.csv)
    write_csv(top_frame(records), args.top_csv)
    figures = Path(args.figures_dir)
    for r in records:
        timeline_figure(r, figures / timeline_name(r["cell"]))
    peaks_figure(df, figures / "memory_peaks.png")
    contexts = sorted(
        {r["cell"]["context_length"] for r in records if r["cell"]["model"] == args.reference_model}
        - {args.reference_context_length}
    )
    fig = figures_link(args.device)
    source = source_line(records, args.device, "memory")
    measured = any(r["status"] != "unsupported" for r in records)
    text = blocks(
        section_a(records, args.device),
        section_b(df, records),
        section_c(df, records),
        f"![peaks, fp32 against bf16]({fig}/memory_peaks.png)" if measured else "",
        section_d(records, args.reference_model, args.batch_size, args.reference_context_length, contexts),
        section_e(records),
        source,
    )
    write_text(Path(args.sections_dir) / "memory_profiling.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
