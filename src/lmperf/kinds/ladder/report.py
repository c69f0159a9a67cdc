"""Report of the speed ladder: a waterfall per size, a table across sizes, sentences from the numbers.

Reads the ladder's records (``results/<device>/ladder/*.json``, one per rung) and the measured
GEMM ceiling (``results/<device>/gemm_peak/square_gemm.json``); writes ``tables/ladder.csv`` (every
rung), the fragment ``sections/speed_ladder.md`` and ``figures/ladder_<model>_ctx<N>.png``.
No torch: everything is computed from the records.

    python -m lmperf.kinds.ladder.report --device h100 --csv … --sections-dir … --figures-dir … \
        --jobs 2.7B:1024 … --records results/h100/ladder/*.json results/h100/gemm_peak/*.json
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from lmperf.core.peaks import PEAKS
from lmperf.kinds.nsys.report import compact_kernel_name, kernel_legend
from lmperf.report.common import (
    device_line,
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
    write_csv,
    write_text,
)
from lmperf.report.devices import SAME  # speed-ups within it of 1 read as about as fast

RUNG_ORDER = [
    "baseline",
    "tf32",
    "bf16",
    "fused_adamw",
    "sdpa_flash",
    "sdpa_cudnn",
    "flash",
    "compile",
    "max_batch",
    "grad_accum",
]
# the goal: this size at this length at this fraction of the datasheet's bf16 dense peak
GOAL = {"model": "2.7B", "context_length": 1024, "mfu": 0.55, "devices": ("h100", "h200")}
# bytes a fused fp32 AdamW step moves per parameter: reads param, grad, exp_avg, exp_avg_sq, writes 3
ADAMW_BYTES_PER_PARAM = 28
# The profile replays the best rung; when the step time the profile cell read from the ladder
# differs from the ladder record's now by more than this fraction, the two come from different runs.
PROFILE_RUN_TOLERANCE = 0.005


def _num(m: dict, key: str):
    v = m.get(key)
    return float(v) if isinstance(v, (int, float)) and v is not None else math.nan


def rung_table(records: list[dict]) -> pd.DataFrame:
    rows = []
    for r in records:
        if r["kind"] != "ladder":
            continue
        m, c = r["metrics"], r["cell"]
        config = m.get("config") or {}
        rows.append(
            {
                "model": c["model"],
                "context_length": c["context_length"],
                "rung": c["rung"],
                "rung_index": m.get("rung_index", RUNG_ORDER.index(c["rung"]) if c["rung"] in RUNG_ORDER else 99),
                "status": r["status"],
                "reason": r["reason"],
                "parent": m.get("parent"),
                "change": m.get("change"),
                "precision": config.get("precision"),
                "tf32": config.get("tf32"),
                "attention": config.get("attention"),
                "fused_adamw": config.get("fused_adamw"),
                "compile": config.get("compile"),
                "batch_size": config.get("batch_size"),
                "accumulation_steps": config.get("accumulation_steps"),
                # the rung's step time by the statistic its record names (older records: the mean)
                "step_ms": _num(m, f"step_ms_{m.get('step_statistic', 'mean')}"),
                "step_statistic": m.get("step_statistic", "mean"),
                "step_ms_median": _num(m, "step_ms_median"),
                "step_n": m.get("step_n"),
                "tokens_per_s": _num(m, "tokens_per_s"),
                "peak_allocated_gib": _num(m, "peak_allocated_mib") / 1024,
                "compile_s": _num(m, "compile_s"),
                "achieved_tflops": _num(m, "achieved_tflops"),
                "ceiling_precision": m.get("ceiling_precision"),
                "mfu_datasheet": _num(m, "mfu_datasheet"),
                "mfu_measured": _num(m, "mfu_measured"),
                "mfu_datasheet_bf16": _num(m, "mfu_datasheet_bf16"),
                "mfu_measured_bf16": _num(m, "mfu_measured_bf16"),
                "mfu_datasheet_bf16_causal_half": _num(m, "mfu_datasheet_bf16_causal_half"),
                "parameter_count": m.get("parameter_count"),
                "step_flops": _num(m, "step_flops"),
                "ceiling_measured_bf16": _num(m, "ceiling_measured_bf16"),
                "ceiling_datasheet_bf16": _num(m, "ceiling_datasheet_bf16"),
                "hbm_gbps": _num(m, "datasheet_hbm_gbps"),
                "rung_wall_s": _num(m, "rung_wall_s"),
                "device": r["provenance"]["device_slug"],
            }
        )
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    order = {m: i for i, m in enumerate(model_order())}
    df["_m"] = df["model"].map(order)
    return df.sort_values(["context_length", "_m", "rung_index"]).drop(columns="_m").reset_index(drop=True)


def analyse(job: pd.DataFrame) -> dict:
    """What the sentences say about one (model, context) ladder: best rung, gains, speed-up."""
    ok = job[job["status"] == "ok"]
    by_rung = {row.rung: row for row in job.itertuples()}
    out = {
        "model": job["model"].iloc[0],
        "context_length": int(job["context_length"].iloc[0]),
        "rungs": len(job),
        "ok": len(ok),
        "oom": sorted(job.loc[job["status"] == "oom", "rung"]),
        "unsupported": sorted(job.loc[job["status"] == "unsupported", "rung"]),
        "wall_s": float(job["rung_wall_s"].sum()),
    }
    if ok.empty:
        return out
    best = ok.loc[ok["tokens_per_s"].idxmax()]
    first = ok.sort_values("rung_index").iloc[0]
    out.update(
        best=best.to_dict(),
        first_ok=first.to_dict(),
        baseline_ok="baseline" in by_rung and by_rung["baseline"].status == "ok",
    )
    out["speedup"] = best["tokens_per_s"] / first["tokens_per_s"]
    gains = []
    for row in ok.itertuples():
        parent = by_rung.get(row.parent)
        if parent is not None and parent.status == "ok" and parent.tokens_per_s > 0:
            gains.append((row.tokens_per_s / parent.tokens_per_s, row.rung, row.parent))
    if gains:
        factor, rung, parent = max(gains)
        out["largest_gain"] = {"factor": factor, "rung": rung, "parent": parent}
    return out


def job_sentences(a: dict) -> list[str]:
    name = f"**{a['model']}** at context {a['context_length']}"
    if "best" not in a:
        return [
            (
                f"{name}: no rung ran ({', '.join(a['oom'])} out of memory; "
                f"{', '.join(a['unsupported']) or 'none'} unsupported)."
            )
        ]
    best, first = a["best"], a["first_ok"]
    s = []
    if a["baseline_ok"]:
        s.append(
            f"{name}: the best rung, `{best['rung']}`, runs {a['speedup']:.1f}× the baseline's tokens/s "
            f"({fmt(first['step_ms'])} → {fmt(best['step_ms'])} ms/step at batch {int(first['batch_size'])} → "
            f"{int(best['batch_size'])}"
            + (f" × {int(best['accumulation_steps'])} micro-batches" if best["accumulation_steps"] > 1 else "")
            + ")."
        )
    else:
        s.append(
            f"{name}: the course's baseline does not fit (out of memory); the first rung that runs is "
            f"`{first['rung']}`, and the best, `{best['rung']}`, runs {a['speedup']:.1f}× its tokens/s."
        )
    g = a.get("largest_gain")
    if g:
        s.append(f"The largest single gain is `{g['rung']}` over `{g['parent']}`: {g['factor']:.2f}×.")
    mfu = best["mfu_datasheet_bf16"]
    if not math.isnan(mfu):
        s.append(
            f"Best MFU: {pct(mfu)} of the datasheet bf16 dense peak, {pct(best['mfu_measured_bf16'])} of the "
            f"measured bf16 GEMM ceiling ({fmt(best['achieved_tflops'])} TFLOP/s achieved)."
        )
    elif not math.isnan(best["mfu_measured_bf16"]):
        s.append(
            f"Best MFU: {pct(best['mfu_measured_bf16'])} of the measured bf16 GEMM ceiling (no datasheet peak "
            "for this device)."
        )
    return s


def flop_amount(flops: float) -> str:
    """'174.4 TFLOP', or in GFLOP where that would read 0.0 TFLOP."""
    return f"{flops / 1e12:.1f} TFLOP" if flops >= 1e11 else f"{flops / 1e9:.2f} GFLOP"


def limits_sentences(a: dict, device: str, profile: dict | None = None) -> list[str]:
    """What bounds the best rung, from the numbers: the matmul floor, the optimizer's memory floor."""
    if "best" not in a:
        return []
    best = a["best"]
    s = []
    ceiling = best["ceiling_measured_bf16"]
    if not math.isnan(ceiling) and not math.isnan(best["step_flops"]):
        matmul_ms = best["step_flops"] / (ceiling * 1e12) * 1e3
        rest = best["step_ms"] - matmul_ms
        s.append(
            f"At the measured GEMM ceiling ({fmt(ceiling)} TFLOP/s) the step's {flop_amount(best['step_flops'])} "
            f"of matmuls would take {fmt(matmul_ms)} ms; the best step takes {fmt(best['step_ms'])} ms, so "
            f"{fmt(rest)} ms ({pct(rest / best['step_ms'])}) goes to matmuls below the ceiling rate and to "
            "everything that is not a matmul."
        )
    hbm = best.get("hbm_gbps")
    if hbm and not math.isnan(hbm) and best.get("parameter_count"):
        opt_ms = best["parameter_count"] * ADAMW_BYTES_PER_PARAM / (hbm * 1e9) * 1e3
        s.append(
            f"The fp32 AdamW update alone moves {ADAMW_BYTES_PER_PARAM} bytes per parameter: at least "
            f"{fmt(opt_ms)} ms per optimizer step at the datasheet's {hbm:,.0f} GB/s (an arithmetic lower bound, "
            f"not measured), {pct(opt_ms / best['step_ms'])} of the best step; more tokens per optimizer step "
            "(max_batch, grad_accum) spread it thinner."
        )
    if profile and profile.get("status") == "ok":
        s.append(profile_sentence(profile["metrics"]))
        other_run = profile_run_sentence(profile, best)
        if other_run:
            s.append(other_run)
        split = profile_split(profile["metrics"], best)
        if split:
            s.append(split)
    elif profile:
        reason = str(profile["reason"]).rstrip()
        s.append(f"The best rung was not profiled: {reason}" + ("" if reason.endswith(".") else "."))
    else:
        s.append("The best rung was not profiled with Nsight Systems here, so the split by kernel is not measured.")
    return s


# How many of the profile's top kernels the sentence names (short names; the legend under it in full).
PROFILE_TOP = 5


def profile_legend(profile: dict | None) -> str:
    """The full names of the profile sentence's shortened kernel names ('' where none is shortened)."""
    if not profile or profile.get("status") != "ok":
        return ""
    return kernel_legend([k["name"] for k in profile["metrics"].get("top_kernels", [])[:PROFILE_TOP]])


def profile_sentence(profile: dict) -> str:
    """From a ladder_profile record's metrics: busy share, idle gaps, kernel classes, top kernels."""
    kernels = ", ".join(
        f"`{compact_kernel_name(k['name'])}` {pct(k['share'])}" for k in profile.get("top_kernels", [])[:PROFILE_TOP]
    )
    classes = ", ".join(f"{c} {pct(v)}" for c, v in list(profile.get("class_share", {}).items())[:4])
    steps = profile.get("profiled_steps")
    return (
        f"An Nsight Systems profile of `{profile['rung']}` ({steps} steps, {fmt(profile['window_ms'])} ms): the GPU "
        f"runs kernels {pct(profile['busy_fraction'])} of the time and idles {fmt(profile['idle_ms'])} ms, "
        f"{fmt(profile['idle_in_gaps_over_threshold_ms'])} ms of it in {profile['gaps_over_threshold']} gaps of "
        f"≥ {profile['gap_threshold_us']:.0f} µs between kernels. Kernel time by class: {classes}; "
        f"top kernels: {kernels}."
    )


def step_words(df: pd.DataFrame) -> str:
    """What a rung's ms/step is in these rows: the median or mean of its measured steps, as each
    record says (``lmperf.kinds.ladder.cell.STEP_STATISTIC``; records before it say nothing: the mean)."""
    stats = sorted(set(df["step_statistic"].dropna())) if "step_statistic" in df else []
    if len(stats) == 1:
        return f"{stats[0]} ms/step"
    return "ms/step (" + " or ".join(stats or ["mean"]) + " of the measured steps, as each record says)"


def profile_run_sentence(profile: dict, best: dict) -> str | None:
    """Where the profile was taken in another run of the ladder than the records' (another rung, or
    the rung's step time then and now differ by over PROFILE_RUN_TOLERANCE), say so."""
    m = profile["metrics"]
    then, now = m.get("step_ms_ladder"), best["step_ms"]
    commit = (profile.get("provenance", {}).get("git_commit") or "unknown")[:7]
    if m.get("rung") != best["rung"]:
        return (
            f"That profile (commit `{commit}`) is of `{m.get('rung')}`, not of today's best rung "
            f"`{best['rung']}`: it comes from another run of the ladder."
        )
    if then and now and abs(then - now) / now > PROFILE_RUN_TOLERANCE:
        return (
            f"That profile comes from another run of the ladder (commit `{commit}`): the rung then stepped in "
            f"{fmt(then)} ms, the ladder record now says {fmt(now)} ms (over {pct(PROFILE_RUN_TOLERANCE)} apart)."
        )
    return None


def profile_split(profile: dict, best: dict, goal: float = GOAL["mfu"]) -> str | None:
    """Per step, from the profile: matmul time and rate, the rest by class, and what the goal needs."""
    steps = profile.get("profiled_steps") or 0
    if profile.get("rung") != best["rung"] or not steps or "matmul" not in profile.get("class_ms", {}):
        return None
    per_step = {c: v / steps for c, v in profile["class_ms"].items()}
    matmul_ms = per_step.pop("matmul")
    rest_ms = sum(per_step.values())
    idle_ms = profile["idle_ms"] / steps
    rate = best["step_flops"] / (matmul_ms / 1e3) / 1e12
    sheet, measured = best["ceiling_datasheet_bf16"], best["ceiling_measured_bf16"]
    parts = ", ".join(f"{c} {fmt(v)}" for c, v in sorted(per_step.items(), key=lambda x: -x[1])[:3])
    text = (
        f"Per profiled step, matmul kernels take {fmt(matmul_ms)} ms at {fmt(rate)} TFLOP/s"
        + (f" ({pct(rate / measured)} of the measured GEMM ceiling" if not math.isnan(measured) else " (")
        + (
            f", which is {pct(measured / sheet)} of the datasheet)"
            if not math.isnan(measured) and not math.isnan(sheet)
            else ")"
        )
        + f"; other kernels take {fmt(rest_ms)} ms ({parts}) and the GPU idles {fmt(idle_ms)} ms."
    )
    if math.isnan(sheet):
        return text
    matmul_only = rate / sheet
    if matmul_only < goal:
        return text + (
            f" Even with nothing but these matmuls, MFU would be {pct(matmul_only)}: below "
            f"{pct(goal, 0)}, so the goal needs faster matmuls, not only less other work."
        )
    target_ms = best["step_flops"] / (goal * sheet * 1e12) * 1e3
    cut = (matmul_ms + rest_ms + idle_ms) - target_ms
    if cut <= 0:
        return text + (
            f" The matmuls alone would reach {pct(matmul_only)}; the profiled step, "
            f"{fmt(matmul_ms + rest_ms + idle_ms)} ms of kernels and idle time, is already within the "
            f"{fmt(target_ms)} ms that {pct(goal, 0)} allows."
        )
    return text + (
        f" The matmuls alone would reach {pct(matmul_only)}; reaching {pct(goal, 0)} means cutting "
        f"{fmt(cut)} ms of the {fmt(rest_ms + idle_ms)} ms of non-matmul kernels and idle "
        "time per step."
    )


def goal_sentence(a: dict, device: str) -> str | None:
    if device not in GOAL["devices"] or a["model"] != GOAL["model"] or a["context_length"] != GOAL["context_length"]:
        return None
    target = GOAL["mfu"]
    if "best" not in a or math.isnan(a["best"]["mfu_datasheet_bf16"]):
        return f"Goal ({GOAL['model']} at ≥ {pct(target, 0)} MFU of the bf16 datasheet peak): not measured."
    mfu = a["best"]["mfu_datasheet_bf16"]
    if mfu >= target:
        return (
            f"Goal met: {GOAL['model']} reaches {pct(mfu)} of the bf16 datasheet peak "
            f"(goal ≥ {pct(target, 0)}) with `{a['best']['rung']}`."
        )
    needed_ms = a["best"]["step_flops"] / (target * a["best"]["ceiling_datasheet_bf16"] * 1e12) * 1e3
    return (
        f"Goal missed: {GOAL['model']} reaches {pct(mfu)} of the bf16 datasheet peak, "
        f"{100 * (target - mfu):.1f} points short of {pct(target, 0)}; the best step would need "
        f"{fmt(needed_ms)} ms instead of {fmt(a['best']['step_ms'])} ms. Why, from the numbers, below."
    )


def sizes_table(analyses: list[dict]) -> pd.DataFrame:
    rows = []
    for a in analyses:
        best, first = a.get("best"), a.get("first_ok")
        g = a.get("largest_gain")
        rows.append(
            {
                "model": a["model"],
                "context": a["context_length"],
                "first rung that runs": f"`{first['rung']}` {fmt(first['step_ms'])} ms" if first else "—",
                "best rung": f"`{best['rung']}`" if best else "—",
                "batch": (
                    f"{int(best['batch_size'])}"
                    + (f"×{int(best['accumulation_steps'])}" if best["accumulation_steps"] > 1 else "")
                )
                if best
                else "—",
                "ms/step": best["step_ms"] if best else math.nan,
                "tokens/s": f"{best['tokens_per_s']:,.0f}" if best else "—",
                "speed-up": f"{a['speedup']:.1f}×" if best else "—",
                "MFU bf16 datasheet": pct(best["mfu_datasheet_bf16"]) if best else "—",
                "MFU bf16 measured": pct(best["mfu_measured_bf16"]) if best else "—",
                "peak GiB": best["peak_allocated_gib"] if best else math.nan,
                "largest gain": f"`{g['rung']}` {g['factor']:.2f}×" if g else "—",
                "device s": a["wall_s"],
            }
        )
    return pd.DataFrame(rows)


def rung_cell(row) -> str:
    if row.status == "ok":
        mfu = row.mfu_datasheet_bf16 if not math.isnan(row.mfu_datasheet_bf16) else row.mfu_measured_bf16
        return f"{fmt(row.step_ms)} ms ({pct(mfu)})"
    return "OOM" if row.status == "oom" else "n/a"


def pivot_yardstick(df: pd.DataFrame) -> str:
    """What the MFU in rung_cell is measured against, for the rungs of one table."""
    ok = df[df["status"] == "ok"]
    sheet = ok["mfu_datasheet_bf16"].notna().sum()
    if sheet == len(ok):
        return "MFU of the bf16 datasheet peak"
    if sheet == 0:
        return "MFU of the measured bf16 GEMM ceiling: no datasheet peak for this device"
    return "MFU of the bf16 datasheet peak, or of the measured bf16 GEMM ceiling where no datasheet peak is known"


def pivot_table(df: pd.DataFrame, context_length: int) -> pd.DataFrame:
    sub = df[df["context_length"] == context_length]
    models = [m for m in model_order() if m in set(sub["model"])]
    rows = []
    for rung in sorted(set(sub["rung"]), key=lambda r: RUNG_ORDER.index(r) if r in RUNG_ORDER else 99):
        row = {"rung": f"`{rung}`"}
        for m in models:
            hit = sub[(sub["model"] == m) & (sub["rung"] == rung)]
            row[m] = rung_cell(next(hit.itertuples())) if not hit.empty else "—"
        rows.append(row)
    return pd.DataFrame(rows)


def waterfall(job: pd.DataFrame, path) -> None:
    """Bars float from the parent rung's tokens/s to the rung's own: up green, down red."""
    fig, axes = figure(figsize=(8, 3.8))
    ax = axes[0][0]
    tps = dict(zip(job["rung"], job["tokens_per_s"]))
    for i, row in enumerate(job.itertuples()):
        if row.status != "ok":
            ax.text(i, 0, "OOM" if row.status == "oom" else "n/a", ha="center", va="bottom", fontsize=8, rotation=90)
            continue
        base = tps.get(row.parent, math.nan) if row.parent else math.nan
        base = 0.0 if math.isnan(base) else base
        color = "#2a9d8f" if row.tokens_per_s >= base else "#e76f51"
        if base == 0.0:
            color = "#457b9d"
        ax.bar(i, row.tokens_per_s - base, bottom=base, color=color)
        mfu = row.mfu_datasheet_bf16 if not math.isnan(row.mfu_datasheet_bf16) else row.mfu_measured_bf16
        ax.text(i, row.tokens_per_s, pct(mfu, 0), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(job)))
    ax.set_xticklabels(job["rung"], rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("tokens/s")
    ax.set_title(
        f"{job['model'].iloc[0]}, context {job['context_length'].iloc[0]}: each rung from its parent "
        "(label: MFU of bf16 peak)",
        fontsize=9,
    )
    save(fig, path)


def ceilings_table(records: list[dict]) -> pd.DataFrame:
    rows = []
    for r in records:
        if r["kind"] != "gemm_peak" or r["status"] != "ok":
            continue
        m = r["metrics"]
        for p in m["precisions"]:
            rows.append(
                {
                    "precision": p,
                    "best square GEMM TFLOP/s": m[f"{p}_tflops"],
                    "at N": m[f"{p}_best_n"],
                    "datasheet dense TFLOP/s": m.get(f"{p}_datasheet_tflops") or "—",
                    "fraction of datasheet": pct(m.get(f"{p}_fraction_of_datasheet")),
                }
            )
    return pd.DataFrame(rows)


def mfu_yardsticks(df: pd.DataFrame, ceilings: pd.DataFrame, device: str) -> str:
    """The sentence naming what MFU is given against: the datasheet's dense bf16 peak where the records
    carry one (without records: where lmperf.core.peaks lists the device), the measured square-GEMM bf16
    ceiling only where the ceilings table below shows it; and what is missing."""
    datasheet = (
        bool(df["ceiling_datasheet_bf16"].notna().any())
        if not df.empty
        else PEAKS.get(device, {}).get("bf16") is not None
    )
    measured = not ceilings.empty and "bf16" in set(ceilings["precision"])
    against = [
        *(["the datasheet's dense bf16 peak"] if datasheet else []),
        *(["the best rate a square bf16 GEMM reaches on this device (below)"] if measured else []),
    ]
    no_ceiling = "no square bf16 GEMM ceiling has been measured on this device " + (
        "(no `gemm_peak` record)" if ceilings.empty else "(its `gemm_peak` record has no bf16)"
    )
    missing = [
        *([] if datasheet else ["no datasheet peak is known for this device (`lmperf.core.peaks`)"]),
        *([] if measured else [no_ceiling]),
    ]
    if not against:
        return "MFU needs a peak to compare with: " + "; ".join(missing) + "."
    return (
        "MFU is given against " + " and against ".join(against) + ("; " + "; ".join(missing) if missing else "") + "."
    )


def cpu_bf16_sentence(job: pd.DataFrame, ceilings: pd.DataFrame) -> str | None:
    """On a CPU, the bf16 rung against its parent, said with why: a CPU's bf16 is no GPU fast path, and
    its measured square-GEMM rates in bf16 and fp32 where the ceilings table has both."""
    by_rung = {row.rung: row for row in job.itertuples()}
    bf16 = by_rung.get("bf16")
    parent = by_rung.get(bf16.parent) if bf16 is not None else None
    if bf16 is None or parent is None or bf16.status != "ok" or parent.status != "ok" or not parent.tokens_per_s:
        return None
    ratio = bf16.tokens_per_s / parent.tokens_per_s
    verdict = "slower" if ratio < 1 - SAME else "faster" if ratio > 1 + SAME else "about as fast"
    text = f"On this CPU `bf16` runs at {fmt(ratio)}× the tokens/s of its parent `{parent.rung}` ({verdict}; `SAME` = {pct(SAME, 0)})"
    rates = dict(zip(ceilings["precision"], ceilings["best square GEMM TFLOP/s"])) if not ceilings.empty else {}
    if rates.get("bf16") and rates.get("fp32"):
        text += (
            f", where a square bf16 GEMM reaches {fmt(rates['bf16'] / rates['fp32'])}× fp32's rate (the ceilings above)"
        )
    text += (
        ". bf16 on a CPU is not the GPU's fast path: bf16 matmuls are fast only where the CPU has native "
        "instructions (AMX, AVX-512 BF16) and at sizes that use them, and take a slow fallback path without; "
        "autocast also adds a cast of every matmul's inputs and weights, and the elementwise operators gain "
        "little from bf16 (benchmarking_mixed_precision (c) measures bf16 on the end-to-end cells)."
    )
    if verdict == "slower":
        text += " Each later rung builds on the fastest rung measured before it, so the slower `bf16` is not carried forward."
    return text


def section(df: pd.DataFrame, records: list[dict], device: str, jobs: list[tuple[str, int]]) -> str:
    ceilings = ceilings_table(records)
    out = [
        (
            "Each ladder starts from the course's training step (fp32, the course's unfused attention, eager, "
            "AdamW; batch 4) and changes one thing per rung; a rung builds on the fastest rung measured before it "
            "(the record names its parent). Time per step is the course's method: `timeit` "
            + (
                "around the whole step (forward, loss, backward, optimizer; on the CPU there is no device to "
                "synchronize with)"
                if device == "cpu"
                else "with a synchronize around the whole step (forward, loss, backward, optimizer)"
            )
            + ", warm-up steps first; the first warm-up "
            "step, which compiles on compiled rungs, is recorded apart. FLOPs are `lmperf.core.flops`' matmul counts "
            "with **causal attention counted in full** (as the unfused attention computes every score; the records "
            "also carry the half count). " + mfu_yardsticks(df, ceilings, device) + "\n"
        )
    ]
    if not ceilings.empty:
        out += ["Measured GEMM ceilings (square N×N matmuls, best of sizes and repeats):\n", md_table(ceilings)]
    if df.empty:
        return "\n".join(out + ["_No ladder records on this device._"]) + "\n"
    analyses = [analyse(g) for _, g in df.groupby(["context_length", "model"], sort=False)]
    profiles = {(r["cell"]["model"], r["cell"]["context_length"]): r for r in records if r["kind"] == "ladder_profile"}
    out += [
        (
            "Across sizes (best rung of each ladder; speed-up over the first rung that runs, the baseline where "
            "it fits; device s: wall time of the ladder's rungs, compiles and failed rungs included):\n"
        ),
        md_table(sizes_table(analyses)),
    ]
    total = sum(a["wall_s"] for a in analyses)
    out.append(
        (f"The {len(analyses)} ladders took" if len(analyses) != 1 else "The ladder took")
        + f" {total:.0f} s of device time in all.\n"
    )
    for ctx in sorted(set(df["context_length"])):
        out += [
            (
                f"Every rung at context {ctx}: {step_words(df[df['context_length'] == ctx])} "
                f"({pivot_yardstick(df[df['context_length'] == ctx])}; "
                "fp32 rungs too, so the rungs compare on one yardstick); OOM: out of memory, n/a: cannot run here "
                "(reasons in `tables/ladder.csv`):\n"
            ),
            md_table(pivot_table(df, ctx)),
        ]
    for a in analyses:
        out.append(" ".join(job_sentences(a)))
        if device == "cpu":
            job = df[(df["model"] == a["model"]) & (df["context_length"] == a["context_length"])]
            bf16 = cpu_bf16_sentence(job, ceilings)
            if bf16:
                out += ["", bf16]
        goal = goal_sentence(a, device)
        profile = profiles.get((a["model"], a["context_length"]))
        # what bounds the best rung, for every ladder (the nsys part where its best rung was profiled)
        limits = limits_sentences(a, device, profile)
        if goal or limits:
            out.append("")
            out.append(" ".join(filter(None, [goal, *limits])))
            legend = profile_legend(profile)
            if legend:
                out.append(legend.rstrip("\n"))
        out.append("")
    figs = " · ".join(f"[{m} ctx {c}]({figures_link(device)}/ladder_{m}_ctx{c}.png)" for m, c in jobs)
    out.append(f"Waterfalls: {figs}.")
    n = sum(1 for r in records if r["kind"] == "ladder")
    out.append(
        f"\n_Source: {n} records in `results/{device}/ladder/`"
        + (f" and the GEMM ceiling in `results/{device}/gemm_peak/`" if not ceilings.empty else "")
        + f", {device_line(records) if records else 'no records'}._\n"
    )
    return "\n".join(out)


def main(argv=None) -> int:
    p = report_parser(__doc__.splitlines()[0])
    p.add_argument("--csv", required=True)
    p.add_argument("--jobs", nargs="*", default=[], help="model:context pairs whose waterfall to draw")
    for action in p._actions:  # report-only mode on a device without ladder records: an empty section
        if action.dest == "records":
            action.nargs, action.required = "*", False
    args = p.parse_args(argv)
    records = load(args.records or [])
    df = rung_table(records)
    jobs = [(j.rsplit(":", 1)[0], int(j.rsplit(":", 1)[1])) for j in args.jobs if j]
    write_csv(df, args.csv)
    for model, ctx in jobs:
        path = Path(args.figures_dir) / f"ladder_{model}_ctx{ctx}.png"
        job = df[(df["model"] == model) & (df["context_length"] == ctx)] if not df.empty else df
        if job.empty:
            empty_figure(path, f"{model} ctx {ctx}: no ladder records")
        else:
            waterfall(job.reset_index(drop=True), path)
    write_text(Path(args.sections_dir) / "speed_ladder.md", section(df, records, args.device, jobs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
