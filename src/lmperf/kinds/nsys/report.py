"""Report of the Nsight Systems cells: tables, figures and the nsys_profile answer (a)–(e).

Every sentence is generated from the records: the profiler's forward time against the step
timer and the end-to-end records (a), the top forward kernel and its launches (b), the
non-matmul kernels above a share threshold (c), matmul shares in inference against a training
step (d), and softmax against the attention matmuls, time and FLOPs (e).

    python -m lmperf.kinds.nsys.report --device cpu --csv … --kernels-csv … --sections-dir …
        --figures-dir … --records results/cpu/nsys/*.json --e2e-records results/cpu/e2e/…
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from pathlib import Path

import pandas as pd

from lmperf.profiling.kernels import CLASSES
from lmperf.report.common import (
    blocks,
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

# (c): a non-matmul kernel is "non-trivial" above this share of forward GPU time.
NON_TRIVIAL_SHARE = 0.02
# (a): the profiler's forward time "agrees" with the timer's within this relative difference.
AGREE = 0.05
ATTENTION = ("computing attention scores", "computing softmax", "final matmul")
CLASS_COLORS = {
    "matmul": "tab:blue",
    "softmax": "tab:orange",
    "reduction": "tab:green",
    "elementwise": "tab:red",
    "memory": "tab:purple",
    "optimizer": "tab:brown",
    "other": "tab:gray",
}


def _cell_key(r: dict) -> tuple:
    c = r["cell"]
    return c["model"], c["context_length"], c["precision"]


def _order(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        return df
    order = {name: i for i, name in enumerate(model_order())}
    return (
        df.assign(_o=df["model"].map(order))
        .sort_values(["_o", "context_length", "precision"])
        .drop(columns="_o")
        .reset_index(drop=True)
    )


def e2e_forward(e2e_records: list[dict]) -> dict:
    """(model, ctx, precision) -> {'inference_forward': ms, 'forward': ms} from e2e records (eager)."""
    out = {}
    for r in e2e_records:
        c = r["cell"]
        if r["kind"] != "e2e" or c.get("compile", "eager") != "eager":
            continue
        m = r["metrics"]
        out[(c["model"], c["context_length"], c["precision"])] = {
            "inference_forward": m.get("inference_forward_ms_mean"),
            "forward": m.get("forward_ms_mean"),
        }
    return out


def frame(records: list[dict], e2e_records: list[dict]) -> pd.DataFrame:
    """One row per (model, ctx, precision): both modes side by side."""
    e2e = e2e_forward(e2e_records)
    rows: dict[tuple, dict] = {}
    for r in records:
        key = _cell_key(r)
        row = rows.setdefault(key, {"model": key[0], "context_length": key[1], "precision": key[2]})
        mode, m = r["cell"]["mode"], r["metrics"]
        row[f"{mode}_status"] = r["status"]
        row[f"{mode}_reason"] = r.get("reason")
        row.setdefault("profiler", m.get("profiler"))
        row.setdefault("device", r["provenance"]["device_slug"])
        if r["status"] != "ok":
            continue
        phases = m["phases"]
        fwd = "inference_forward" if mode == "inference" else "forward"
        cc = m["forward_cross_check"]
        row[f"{mode}_fwd_timer_ms"] = cc["timer_ms_mean"]
        row[f"{mode}_fwd_nvtx_ms"] = cc["nvtx_range_ms_mean"]
        row[f"{mode}_fwd_kernel_ms"] = cc["kernel_ms_per_step"]
        row[f"{mode}_fwd_e2e_ms"] = (e2e.get(key) or {}).get(fwd)
        top = phases[fwd]["top_kernels"][0] if phases[fwd]["top_kernels"] else {}
        row[f"{mode}_fwd_top_kernel"] = top.get("label")
        row[f"{mode}_fwd_top_kernel_name"] = top.get("name")
        row[f"{mode}_fwd_top_launches"] = top.get("launches_per_step")
        row[f"{mode}_fwd_top_share"] = top.get("share")
        row[f"{mode}_fwd_launches"] = phases[fwd]["launches_per_step"]
        row[f"{mode}_fwd_top_matmul"] = next(
            (k["label"] for k in phases[fwd]["top_kernels"] if k["class"] == "matmul"), None
        )
        row[f"{mode}_fwd_matmul_share"] = phases[fwd]["matmul_share"]
        overhead = m.get("nvtx_overhead") or {}
        if overhead.get("status") == "ok":
            row["nvtx_on_over_off"] = overhead["enabled_over_disabled"]
            row["nvtx_overhead_ctx"] = overhead["context_length"]
            off = overhead["nvtx_disabled_forward_ms_samples"]
            row["nvtx_noise"] = statistics.stdev(off) / statistics.mean(off) if len(off) > 1 else None
        if mode == "inference":
            row["inference_class_share"] = phases[fwd]["class_share"]
            att = m["attention"]["ranges"]
            for name, short in zip(ATTENTION, ("scores", "softmax", "final")):
                row[f"att_{short}_ms"] = att[name]["kernel_ms_per_step"]
                row[f"att_{short}_matmul_ms"] = att[name]["matmul_ms_per_step"]
                row[f"att_{short}_flops"] = att[name]["flops_per_step"]
        else:
            step, fb = phases["training_step"], phases["forward_backward"]
            row["train_matmul_share"] = step["matmul_share"]
            row["train_class_share"] = step["class_share"]
            optimizer = phases.get("optimizer_step") or {}
            row["train_optimizer_phase_share"] = (
                optimizer.get("kernel_ms_per_step", 0.0) / step["kernel_ms_per_step"]
                if step.get("kernel_ms_per_step")
                else None
            )
            row["train_launches"] = step["launches_per_step"]
            row["fb_top_kernel"] = fb["top_kernels"][0]["label"] if fb["top_kernels"] else None
            row["fb_top_kernel_name"] = fb["top_kernels"][0]["name"] if fb["top_kernels"] else None
            row["fb_top_share"] = fb["top_kernels"][0]["share"] if fb["top_kernels"] else None
            row["bwd_over_fwd_kernel_ms"] = (
                phases["backward"]["kernel_ms_per_step"] / phases["forward"]["kernel_ms_per_step"]
            )
    df = pd.DataFrame(list(rows.values()))
    if df.empty:
        return df
    for mode in ("inference", "training"):
        if f"{mode}_fwd_nvtx_ms" in df:
            df[f"{mode}_nvtx_over_timer"] = df[f"{mode}_fwd_nvtx_ms"] / df[f"{mode}_fwd_timer_ms"]
            df[f"{mode}_nvtx_over_e2e"] = df[f"{mode}_fwd_nvtx_ms"] / df[f"{mode}_fwd_e2e_ms"].astype(float)
    if "att_softmax_ms" in df:
        matmul_ms = df["att_scores_matmul_ms"] + df["att_final_matmul_ms"]
        df["softmax_over_matmul_time"] = df["att_softmax_ms"] / matmul_ms
        df["softmax_over_matmul_flops"] = df["att_softmax_flops"] / (df["att_scores_flops"] + df["att_final_flops"])
    return _order(df)


def kernels_frame(records: list[dict]) -> pd.DataFrame:
    rows = []
    for r in records:
        if r["status"] != "ok":
            continue
        for phase, s in r["metrics"]["phases"].items():
            for rank, k in enumerate(s["top_kernels"], 1):
                rows.append({**r["cell"], "phase": phase, "rank": rank, **k})
    return pd.DataFrame(rows)


def _ok(df: pd.DataFrame, mode: str, precision: str | None = "fp32") -> pd.DataFrame:
    col = f"{mode}_status"
    if df.empty or col not in df:
        return df.iloc[0:0]
    sub = df[df[col] == "ok"]
    return sub[sub.precision == precision] if precision else sub


def _with_columns(df: pd.DataFrame, columns) -> pd.DataFrame:
    """``df`` with every named column present (None where no record filled it)."""
    return df.assign(**{c: None for c in columns if c not in df})


def _unit(df: pd.DataFrame) -> str:
    """What the kernel times measure: GPU kernels, or CPU operators under the CPU fallback."""
    return "CPU" if "device" in df and (df["device"] == "cpu").all() else "GPU"


def _range_word(df: pd.DataFrame) -> str:
    """What the cells' annotation ranges are: NVTX ranges, or profiler ranges under the CPU fallback
    (``lmperf.nvtx`` ranges become ``torch.profiler.record_function`` there)."""
    return "profiler range" if _unit(df) == "CPU" else "NVTX range"


def _kernel_word(df: pd.DataFrame) -> str:
    """GPU kernels, or CPU operators under the CPU fallback."""
    return "operator" if _unit(df) == "CPU" else "kernel"


def _launch_word(df: pd.DataFrame) -> str:
    """GPU kernels are launched; CPU operators are called."""
    return "calls" if _unit(df) == "CPU" else "launches"


def _n(count: int, noun: str, plural: str = "s") -> str:
    return f"{count} {noun}" + ("" if count == 1 else plural)


def _spread(values) -> str:
    values = [v for v in values if v is not None and not pd.isna(v)]
    if not values:
        return "—"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} (range {fmt(min(values))}–{fmt(max(values))})"


def _profiler_line(records: list[dict]) -> str:
    used = defaultdict(set)
    for r in records:
        m = r["metrics"]
        if m.get("profiler"):
            used[m["profiler"]].add((m.get("profiler_version") or "?", m.get("profiler_note") or ""))
    parts = []
    for name, infos in sorted(used.items()):
        versions = ", ".join(sorted({v for v, _ in infos}))
        notes = "; ".join(sorted({n for _, n in infos if n}))
        parts.append(f"`{name}` ({versions})" + (f" — {notes}" if notes else ""))
    return "Profiler: " + ("; ".join(parts) or "none") + "."


def section_a(df: pd.DataFrame) -> str:
    out = [
        "### (a) Forward time: the profiler against the Python timer",
        (
            "Each forward runs inside an NVTX range that closes after `torch.cuda.synchronize()`"
            if _unit(df) == "GPU"
            else "Each forward runs inside a profiler range (`torch.profiler.record_function`, which the "
            "`lmperf.nvtx` ranges become without CUDA)"
        )
        + ", and the same steps are timed with `timeit.default_timer` in the profiled process; the end-to-end "
        "records (separate, unprofiled processes) give a third time for the same cell.\n",
    ]
    ok = _ok(df, "inference")
    if ok.empty:
        return "\n".join(out + ["_No fp32 inference records on this device._"]) + "\n"
    table = pd.DataFrame(
        {
            "model": ok.model,
            "context": ok.context_length,
            "profiler fwd (ms)": ok.inference_fwd_nvtx_ms,
            "timer fwd (ms)": ok.inference_fwd_timer_ms,
            f"{_kernel_word(ok)} sum (ms)": ok.inference_fwd_kernel_ms,
            "e2e fwd (ms)": ok.inference_fwd_e2e_ms,
            "profiler / timer": ok.inference_nvtx_over_timer,
            "profiler / e2e": ok.inference_nvtx_over_e2e,
        }
    )
    out.append("Inference forward (`torch.no_grad`), mean per forward:\n")
    out.append(md_table(table))
    worst = (ok.inference_nvtx_over_timer - 1).abs().max()
    verdict = (
        f"they agree within {pct(AGREE, 0)} (`AGREE`) in every cell"
        if worst <= AGREE
        else f"they differ by up to {pct(worst)}"
    )
    busy = ok.inference_fwd_kernel_ms / ok.inference_fwd_nvtx_ms
    sentences = [
        f"The profiler's forward time is {_spread(ok.inference_nvtx_over_timer)}× the timer's in the same process "
        f"over {_n(len(ok), 'cell')}: {verdict}. The {_unit(ok)} is busy (sum of {_kernel_word(ok)} times) for "
        f"{_spread(busy)}× of that time; "
        + (
            "the rest are gaps between kernels, where the GPU waits for the CPU to launch the next one."
            if _unit(ok) == "GPU"
            else "the rest is time between operators (Python, dispatch and allocation on the same CPU)."
        )
    ]
    with_e2e = ok.dropna(subset=["inference_nvtx_over_e2e"])
    if with_e2e.empty:
        sentences.append("No end-to-end record of these cells was available for comparison.")
    else:
        ratio = with_e2e.inference_nvtx_over_e2e.astype(float)
        sentences.append(
            f"Against the end-to-end records' inference forward ({_n(len(with_e2e), 'cell')}) the "
            f"profiled forward is {_spread(ratio)}×."
        )
        slow = with_e2e[ratio > 1 + AGREE]
        if not slow.empty:
            kernel_vs_e2e = slow.inference_fwd_kernel_ms / slow.inference_fwd_e2e_ms.astype(float)
            by_model = slow.assign(r=ratio[ratio > 1 + AGREE]).groupby("model", sort=False)["r"].median()
            why = (
                "so the extra time is on the CPU: nsys traces every CUDA API call, which lengthens each launch, "
                "and a forward made of many short kernels waits on its launches"
                if _unit(ok) == "GPU"
                else "so the extra time is the profiler's own: torch.profiler records every operator, which "
                "lengthens each one's dispatch, and a forward made of many short operators pays it on each"
            )
            sentences.append(
                f"Where it is slower ({_n(len(slow), 'cell')}), the {_kernel_word(ok)}s alone take "
                f"{_spread(kernel_vs_e2e)}× the unprofiled forward, {why} "
                "(median ratio by size: " + ", ".join(f"{m} {fmt(v)}×" for m, v in by_model.items()) + ")."
            )
        else:
            sentences.append(f"They agree within {pct(AGREE, 0)} (`AGREE`): profiling did not slow the forward down.")
    train = _ok(df, "training")
    if not train.empty:
        sentences.append(
            f"The training step's forward (with loss) gives {_spread(train.training_nvtx_over_timer)}× "
            "against its timer"
            + (
                f" and {_spread(train.training_nvtx_over_e2e.dropna())}× against e2e"
                if train.training_nvtx_over_e2e.notna().any()
                else ""
            )
            + "."
        )
    if "nvtx_on_over_off" in df and df.nvtx_on_over_off.notna().any():
        # one measurement per (model, precision), repeated in each of its cells' records
        on = df.dropna(subset=["nvtx_on_over_off"]).drop_duplicates(["model", "precision"])
        effect = (on.nvtx_on_over_off - 1).abs()
        within = (effect <= on.nvtx_noise).sum()
        sentences.append(
            f"Cost of the annotations when not profiling: with the NVTX ranges switched on (no profiler attached) "
            f"the forward takes {_spread(on.nvtx_on_over_off)}× its time with them off (shortest context length, "
            f"{_n(len(on), '(model, precision) pair', 's')}); the forwards with them off vary by "
            f"{_spread(100 * on.nvtx_noise)}% between repeats (CV), and the on/off difference is within that noise "
            f"in {within} of {len(on)}."
        )
    else:
        sentences.append("(No NVTX on/off timing on this device: NVTX ranges need CUDA.)")
    out.append(" ".join(sentences))
    return "\n".join(out) + "\n"


# Kernel names longer than this are shortened in tables; the legend under the table gives them in full.
SHORT_NAME_CHARS = 48


# cuBLAS's Hopper GEMMs: nvjet_sm90_tst_<tile MxN>_<K>x<stages>_<cluster>_<h|v>_bz[_coopA|_coopB]_<layouts>
_NVJET = re.compile(r"nvjet_sm\d+_\w+?_(\d+x\d+)_(\d+)x\d+_(\d+x\d+)_[hv]_\w+?_([NT]{3})\b")


def compact_kernel_name(label: str) -> str:
    """A short name for the long ones: 'xmma gemm f32f32 tn 128x128x8' (and '… split-k') for cuBLAS's
    Ampere-style templates, 'nvjet 256x128x64 1x2 NTT' (tile M×N×K, cluster, layouts) for its Hopper
    nvjet kernels, 'cutlass simt_sgemm 128x128 nt'; other names longer than SHORT_NAME_CHARS are cut.
    kernel_legend gives every shortened name in full."""
    if not isinstance(label, str):
        return label
    m = re.search(r"xmma_gemm_(\w+?)_(tn|nt|nn|tt)_n_tilesize(\d+x\d+x\d+)", label)
    if m:
        split_k = " split-k" if "split_k" in label else ""
        return f"xmma gemm {m.group(1).split('_')[0]} {m.group(2)} {m.group(3)}{split_k}"
    m = _NVJET.search(label)
    if m:
        return f"nvjet {m.group(1)}x{m.group(2)} {m.group(3)} {m.group(4)}"
    m = re.search(r"cutlass_\d+_(\w+?gemm)_(\d+x\d+)_\w*?_(nn|nt|tn|tt)", label)
    if m:
        return f"cutlass {m.group(1)} {m.group(2)} {m.group(3)}"
    return label if len(label) <= SHORT_NAME_CHARS else label[: SHORT_NAME_CHARS - 1] + "…"


def kernel_legend(labels) -> str:
    """The full name of every kernel a table shows shortened; where two names shorten alike, both are
    listed under it and the legend says the table does not tell them apart (never a silent merge)."""
    full_names: dict[str, set[str]] = defaultdict(set)
    for x in labels:
        if isinstance(x, str) and compact_kernel_name(x) != x:
            full_names[compact_kernel_name(x)].add(x)
    if not full_names:
        return ""
    lines = [
        f"- `{short}`: "
        + " or ".join(f"`{full}`" for full in sorted(fulls))
        + (" (one short name for these; the table does not tell them apart)" if len(fulls) > 1 else "")
        for short, fulls in sorted(full_names.items())
    ]
    return "\nKernel names in full:\n\n" + "\n".join(lines) + "\n"


def section_b(df: pd.DataFrame) -> str:
    kernel = _kernel_word(df)
    out = [f"### (b) The top forward {kernel}, and forward + backward"]
    both = _ok(df, "inference")
    if both.empty:
        return "\n".join(out + ["_No fp32 inference records on this device._"]) + "\n"
    both = _with_columns(both, ["fb_top_kernel", "fb_top_kernel_name", "fb_top_share", "train_launches"])
    launches = _launch_word(both)
    table = pd.DataFrame(
        {
            "model": both.model,
            "context": both.context_length,
            f"top forward {kernel}": [f"`{compact_kernel_name(k)}`" for k in both.inference_fwd_top_kernel],
            f"{launches} / fwd": both.inference_fwd_top_launches,
            "share of fwd": [pct(v) for v in both.inference_fwd_top_share],
            f"{kernel}s / fwd": both.inference_fwd_launches,
            f"top fwd+bwd {kernel}": [
                "OOM" if not isinstance(k, str) else "same" if k == f else f"`{compact_kernel_name(k)}`"
                for k, f in zip(both.fb_top_kernel, both.inference_fwd_top_kernel)
            ],
            "its share of fwd+bwd": [pct(v) for v in both.fb_top_share],
        }
    )
    out.append(md_table(table))
    counts = both.inference_fwd_top_kernel.value_counts()
    top, n_top = counts.index[0], int(counts.iloc[0])
    full_name = both[both.inference_fwd_top_kernel == top].inference_fwd_top_kernel_name.iloc[0]
    sentences = [
        f"The forward {_kernel_word(both)} with the most {_unit(both)} time is `{compact_kernel_name(top)}` in "
        f"{n_top} of "
        f"{_n(len(both), 'cell')}" + (f" (demangled name `{full_name}`)" if full_name != top else "") + "."
    ]
    per_model = []
    for model, g in both[both.inference_fwd_top_kernel == top].groupby("model", sort=False):
        per_model.append(
            f"{model} "
            + ", ".join(f"{int(round(r.inference_fwd_top_launches))} (ctx {r.context_length})" for r in g.itertuples())
        )
    sentences.append(f"{launches.capitalize()} of it per forward: " + "; ".join(per_model) + ".")
    others = both[both.inference_fwd_top_kernel != top]
    if not others.empty:
        counts_else = others.inference_fwd_top_kernel.value_counts()
        sentences.append(
            f"In the other {_n(len(others), 'cell')} (rows of the table) it is "
            + ", ".join(
                f"`{compact_kernel_name(k)}` ({_n(int(counts_else[k]), 'cell')})"
                for k in sorted(counts_else.index, key=lambda k: (-int(counts_else[k]), k))
            )
            + "."
        )
    fb = both.dropna(subset=["fb_top_kernel"])
    if not fb.empty:
        same = int((fb.fb_top_kernel == fb.inference_fwd_top_kernel).sum())
        fb_counts = fb.fb_top_kernel.value_counts()
        sentences.append(
            f"Profiling forward and backward together, the top {kernel} is still the forward's in {same} of "
            f"{_n(len(fb), 'cell')}"
            + (
                f"; the most frequent top {kernel} of forward + backward is "
                f"`{compact_kernel_name(fb_counts.index[0])}` "
                f"({_n(int(fb_counts.iloc[0]), 'cell')})"
                if same < len(fb)
                else ""
            )
            + "."
        )
    out.append(" ".join(sentences))
    bf16 = _ok(df, "inference", precision="bf16")
    if not bf16.empty:
        fp32 = both.set_index(["model", "context_length"])
        rows = []
        for r in bf16.itertuples():
            ref = fp32.loc[(r.model, r.context_length)] if (r.model, r.context_length) in fp32.index else None
            rows.append(
                {
                    "model": r.model,
                    "context": r.context_length,
                    f"top {kernel}, bf16": f"`{compact_kernel_name(r.inference_fwd_top_kernel)}`",
                    "top matmul, bf16": f"`{compact_kernel_name(r.inference_fwd_top_matmul)}`",
                    "matmul share, bf16": pct(r.inference_fwd_matmul_share),
                    "matmul share, fp32": pct(ref.inference_fwd_matmul_share) if ref is not None else "—",
                    f"forward {kernel}s, bf16 (ms)": r.inference_fwd_kernel_ms,
                    f"forward {kernel}s, fp32 (ms)": ref.inference_fwd_kernel_ms if ref is not None else None,
                }
            )
        fp32_mm, fp32_text = top_matmuls(both, kernel=kernel)
        changes = any(m not in set(fp32_mm) for m in bf16.inference_fwd_top_matmul if isinstance(m, str))
        out.append(
            (
                f"\nbf16 autocast changes which matmul {kernel}s run ("
                if changes
                else f"\nbf16 autocast keeps fp32's top matmul {kernel} ("
            )
            + fp32_text
            + "); the bf16 cells, beside fp32's:\n"
        )
        out.append(md_table(pd.DataFrame(rows)).rstrip("\n"))
    shown = (
        [*both.inference_fwd_top_kernel, *both.fb_top_kernel, *fp32_mm]
        if not bf16.empty
        else [*both.inference_fwd_top_kernel, *both.fb_top_kernel]
    )
    if not bf16.empty:
        shown += [*bf16.inference_fwd_top_kernel, *bf16.inference_fwd_top_matmul]
    out.append(kernel_legend(shown))
    return blocks("\n".join(out))


# How many fp32 top matmul kernels the bf16 sentence names before 'and N more'.
MAX_TOP_MATMULS = 4


def top_matmuls(cells: pd.DataFrame, limit: int = MAX_TOP_MATMULS, kernel: str = "kernel") -> tuple[list[str], str]:
    """The kernels that are the forward's top matmul in some fp32 cell, ranked by in how many cells
    they are (ties by name), and a phrase naming them with their cell counts; past ``limit`` it says
    how many more there are (never a silent cut)."""
    named = cells[cells.inference_fwd_top_matmul.map(lambda m: isinstance(m, str))]
    counts = named.inference_fwd_top_matmul.value_counts()
    ranked = sorted(counts.index, key=lambda m: (-int(counts[m]), m))
    shown = ranked[:limit]
    items = [f"`{compact_kernel_name(m)}` in {_n(int(counts[m]), 'cell')}" for m in shown]
    more = f", and {len(ranked) - len(shown)} more" if len(ranked) > len(shown) else ""
    text = (
        f"the fp32 forward's top matmul {kernel}, by how many of the {_n(len(named), 'fp32 cell')} have it as "
        "their top matmul: " + ", ".join(items) + more
    )
    return shown, text


def non_trivial_kernels(records: list[dict], threshold: float = NON_TRIVIAL_SHARE) -> pd.DataFrame:
    """Non-matmul kernels whose share of the inference forward's GPU time exceeds the threshold."""
    rows = []
    for r in records:
        if r["status"] != "ok" or r["cell"]["mode"] != "inference" or r["cell"]["precision"] != "fp32":
            continue
        for k in r["metrics"]["phases"]["inference_forward"]["top_kernels"]:
            if k["class"] != "matmul" and k["share"] is not None and k["share"] > threshold:
                rows.append(
                    {
                        "model": r["cell"]["model"],
                        "context_length": r["cell"]["context_length"],
                        "label": k["label"],
                        "class": k["class"],
                        "share": k["share"],
                    }
                )
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    return (
        df.groupby(["label", "class"])
        .agg(cells=("share", "size"), median_share=("share", "median"), max_share=("share", "max"))
        .reset_index()
        .sort_values(["cells", "max_share"], ascending=False)
        .reset_index(drop=True)
    )


def section_c(records: list[dict], df: pd.DataFrame) -> str:
    inf = _ok(df, "inference")
    kernel = _kernel_word(df)
    out = [f"### (c) Non-matmul {kernel}s above {pct(NON_TRIVIAL_SHARE, 0)} of forward {_unit(df)} time"]
    nt = non_trivial_kernels(records)
    if inf.empty:
        return "\n".join(out + ["_No fp32 inference records on this device._"]) + "\n"
    if nt.empty:
        return (
            "\n".join(
                out
                + [
                    f"No non-matmul {kernel} reaches {pct(NON_TRIVIAL_SHARE, 0)} of forward time "
                    f"in any of the {len(inf)} cells."
                ]
            )
            + "\n"
        )
    table = nt.assign(median_share=[pct(v) for v in nt.median_share], max_share=[pct(v) for v in nt.max_share])
    table.columns = [kernel, "class", f"cells (of {len(inf)})", "median share", "max share"]
    out.append(md_table(table))
    shares = [s.get("matmul") for s in inf.inference_class_share if isinstance(s, dict)]
    nonmm = [1 - s for s in shares if s is not None]
    listed = ", ".join(
        f"`{r['label']}` ({r['class']}, {_n(int(r['cells']), 'cell')}, up to {pct(r['max_share'])})"
        for r in nt.to_dict("records")
    )
    out.append(
        f"Non-matmul {kernel}s take {_spread([100 * v for v in nonmm])}% of forward {_unit(inf)} time "
        f"(median over cells). Those above {pct(NON_TRIVIAL_SHARE, 0)}: {listed}. Elementwise "
        f"{kernel}s come from RMSNorm, RoPE, SwiGLU's gating, the residual adds and the unfused attention's "
        "scaling, masking and softmax; each reads and writes a whole activation tensor for a few FLOPs per "
        "element, so its time is set by memory traffic."
    )
    return "\n".join(out) + "\n"


def _class_text(shares: list[dict], cls: str) -> str:
    values = [100 * s[cls] for s in shares if isinstance(s, dict) and s.get(cls) is not None]
    return f"{_spread(values)}%"


def section_d(df: pd.DataFrame) -> str:
    out = ["### (d) A full training step against inference"]
    both = _ok(_ok(df, "inference"), "training")
    if both.empty:
        return "\n".join(out + ["_Needs fp32 inference and training records of the same cells._"]) + "\n"
    table = pd.DataFrame(
        {
            "model": both.model,
            "context": both.context_length,
            "matmul share, inference": [pct(v) for v in both.inference_fwd_matmul_share],
            "matmul share, training step": [pct(v) for v in both.train_matmul_share],
        }
    )
    for cls in ("elementwise", "reduction", "optimizer"):
        table[f"{cls}, train"] = [pct(s.get(cls)) for s in both.train_class_share]
    table[f"softmax-named {_kernel_word(both)}s (cross-entropy), train"] = [
        pct(s.get("softmax")) for s in both.train_class_share
    ]
    if "att_softmax_ms" in both:
        table[f"attention softmax (its {_range_word(both)}), inference"] = [
            pct(a / k) if k else "—" for a, k in zip(both.att_softmax_ms, both.inference_fwd_kernel_ms)
        ]
    table[f"{_kernel_word(both)}s / step"] = both.train_launches
    out.append(md_table(table))
    diff = (both.train_matmul_share - both.inference_fwd_matmul_share) * 100
    direction = "lower" if diff.median() < 0 else "higher"
    unit, kernel = _unit(both), _kernel_word(both)
    shares = list(both.train_class_share)
    named = any(isinstance(x, dict) and x.get("optimizer") for x in shares)
    phase = both.train_optimizer_phase_share.dropna() if "train_optimizer_phase_share" in both else pd.Series([])
    optimizer = (
        f"the AdamW {kernel}s take {_class_text(shares, 'optimizer')}"
        if named or phase.empty or not (phase > 0).any()
        else f"no {kernel} is named as AdamW's (it runs as elementwise {kernel}s on each parameter, counted "
        f"as elementwise; its optimizer_step range takes {_spread(100 * phase)}% of the step's {unit} time)"
    )
    out.append(
        f"Matmuls take {_spread(100 * both.inference_fwd_matmul_share)}% of {unit} time in an inference forward and "
        f"{_spread(100 * both.train_matmul_share)}% in a full training step (median over {len(both)} cells; "
        f"{direction} in training by a median of {fmt(abs(diff.median()))} points, cell by cell). In the training "
        f"step {optimizer}, elementwise {kernel}s "
        f"{_class_text(list(both.train_class_share), 'elementwise')} (inference: "
        f"{_class_text(list(both.inference_class_share), 'elementwise')}), reductions "
        f"{_class_text(list(both.train_class_share), 'reduction')}. Backward {kernel}s take "
        f"{_spread(both.bwd_over_fwd_kernel_ms)}× the forward's {unit} time: each matmul has two in backward, "
        f"and every elementwise operation of the forward has its gradient {kernel}(s)."
    )
    if "att_softmax_ms" in both:
        share = [a / k for a, k in zip(both.att_softmax_ms, both.inference_fwd_kernel_ms) if k]
        out.append(
            "\nThe course's softmax is written out (max, subtract, exp, sum, divide), so it runs as elementwise and "
            f"reduction {kernel}s and is counted in those columns; the only {kernel}s named softmax are "
            f"cross-entropy's fused log-softmax. Attributed by its {_range_word(both)} instead (the attention "
            f"column, from (e)), the attention softmax takes {_spread([100 * v for v in share])}% of the inference "
            f"forward's {unit} time."
        )
    return "\n".join(out) + "\n"


def section_e(df: pd.DataFrame) -> str:
    out = [
        "### (e) Inside self-attention: softmax against the matmuls",
        (
            "Kernels launched inside the three NVTX ranges"
            if _unit(df) == "GPU"
            else "Operators run inside the three profiler ranges"
        )
        + " of the course's attention, inference forward, per "
        "forward (all layers). FLOPs: each matmul 2·B·H·T²·d (every score is computed, as in the plain "
        "implementation); softmax 5 per score (max, subtract, exp, sum, divide).\n",
    ]
    ok = _ok(df, "inference", precision=None)
    ok = ok.dropna(subset=["softmax_over_matmul_time"]) if "softmax_over_matmul_time" in ok else ok.iloc[0:0]
    if ok.empty:
        return "\n".join(out + ["_No inference records with attention ranges on this device._"]) + "\n"
    table = pd.DataFrame(
        {
            "model": ok.model,
            "context": ok.context_length,
            "precision": ok.precision,
            "scores range (ms)": ok.att_scores_ms,
            "QKᵀ matmul (ms)": ok.att_scores_matmul_ms,
            "softmax (ms)": ok.att_softmax_ms,
            "final range (ms)": ok.att_final_ms,
            "PV matmul (ms)": ok.att_final_matmul_ms,
            "softmax / matmuls, time": ok.softmax_over_matmul_time,
            "softmax / matmuls, FLOPs": ok.softmax_over_matmul_flops,
        }
    )
    out.append(md_table(table))
    fp32 = ok[ok.precision == "fp32"] if (ok.precision == "fp32").any() else ok
    rate = fp32.softmax_over_matmul_time / fp32.softmax_over_matmul_flops
    matmul_tflops = (
        (fp32.att_scores_flops + fp32.att_final_flops) / (fp32.att_scores_matmul_ms + fp32.att_final_matmul_ms) / 1e9
    )
    softmax_tflops = fp32.att_softmax_flops / fp32.att_softmax_ms / 1e9
    out.append(
        f"Softmax takes {_spread(fp32.softmax_over_matmul_time)}× the time of the two attention matmuls together "
        f"while doing {_spread(fp32.softmax_over_matmul_flops)}× their FLOPs ({_n(len(fp32), 'fp32 cell')}): per FLOP "
        f"it is {_spread(rate)}× slower — the matmuls run at {_spread(matmul_tflops)} TFLOP/s, the softmax at "
        f"{_spread(softmax_tflops)} TFLOP/s. A matmul does 2·d FLOPs per element of the T×T score matrix it "
        f"reads or writes; the softmax does about 5 per element, in several {_kernel_word(ok)}s that each read and "
        "write the whole matrix, so its time follows the bytes it moves, not its FLOPs."
    )
    return "\n".join(out) + "\n"


def section_oom(df: pd.DataFrame) -> str:
    cells = []
    for mode in ("inference", "training"):
        col = f"{mode}_status"
        if col in df:
            for r in df[df[col] == "oom"].itertuples():
                cells.append(f"{r.model}/ctx {r.context_length}/{r.precision} {mode}")
    if not cells:
        return "Every profiled configuration fit in memory.\n"
    return "Out of memory (recorded, not profiled): " + ", ".join(cells) + ".\n"


def figures(df: pd.DataFrame, figures_dir: Path) -> None:
    path = figures_dir / "nsys_class_shares.png"
    if df.empty or not any(c in df for c in ("inference_class_share", "train_class_share")):
        empty_figure(path, "no profiled cells")
    else:
        panels = [("inference_class_share", "inference forward"), ("train_class_share", "training step")]
        fig, axes = figure(1, 2, figsize=(11, 0.32 * len(df) + 1.8), sharey=True)
        labels = [f"{r.model} ctx {r.context_length} {r.precision}" for r in df.itertuples()]
        for ax, (col, title) in zip(axes[0], panels):
            left = [0.0] * len(df)
            for cls in CLASSES:
                values = [
                    (s or {}).get(cls) or 0.0 if isinstance(s, dict) else 0.0 for s in df.get(col, [None] * len(df))
                ]
                ax.barh(range(len(df)), values, left=left, color=CLASS_COLORS[cls], label=cls)
                left = [a + b for a, b in zip(left, values)]
            ax.set_title(title)
            ax.set_xlim(0, 1)
            ax.set_xlabel(f"share of {_kernel_word(df)} time")
        axes[0][0].set_yticks(range(len(df)), labels, fontsize=7)
        axes[0][0].invert_yaxis()
        axes[0][1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        save(fig, path)
    path = figures_dir / "nsys_attention.png"
    ok = df.dropna(subset=["softmax_over_matmul_time"]) if "softmax_over_matmul_time" in df else df.iloc[0:0]
    if ok.empty:
        empty_figure(path, "no attention ranges profiled")
    else:
        fig, axes = figure(2, 1, figsize=(max(8.0, 0.45 * len(ok)), 7.0))
        labels = [f"{r.model}\n{r.context_length}\n{r.precision}" for r in ok.itertuples()]
        xs = range(len(ok))
        parts = [
            ("att_scores_matmul_ms", "QKᵀ matmul"),
            ("att_scores_other_ms", "scale + mask"),
            ("att_softmax_ms", "softmax"),
            ("att_final_matmul_ms", "PV matmul"),
        ]
        ok = ok.assign(att_scores_other_ms=ok.att_scores_ms - ok.att_scores_matmul_ms)
        width = 0.8 / len(parts)
        for i, (col, name) in enumerate(parts):
            axes[0][0].bar([x - 0.4 + (i + 0.5) * width for x in xs], ok[col].clip(lower=1e-6), width=width, label=name)
        axes[0][0].set_yscale("log")
        axes[0][0].set_ylabel(f"{_kernel_word(ok)} ms per forward (all layers)")
        axes[0][0].set_xticks(list(xs), labels, fontsize=6)
        axes[0][0].legend(fontsize=7)
        axes[1][0].bar([x - 0.2 for x in xs], ok.softmax_over_matmul_time, width=0.4, label="time")
        axes[1][0].bar([x + 0.2 for x in xs], ok.softmax_over_matmul_flops, width=0.4, label="FLOPs")
        axes[1][0].set_yscale("log")
        axes[1][0].set_ylabel("softmax / attention matmuls")
        axes[1][0].set_xticks(list(xs), labels, fontsize=6)
        axes[1][0].legend(fontsize=7)
        save(fig, path)


def main(argv=None) -> int:
    p = report_parser(__doc__.splitlines()[0])
    p.add_argument("--e2e-records", nargs="*", default=[])
    p.add_argument("--csv", required=True)
    p.add_argument("--kernels-csv", required=True)
    args = p.parse_args(argv)
    records = load(args.records)
    e2e = load([x for x in args.e2e_records if Path(x).is_file()])
    df = frame(records, e2e)
    write_csv(df.drop(columns=[c for c in df.columns if c.endswith("class_share")]), args.csv)
    write_csv(kernels_frame(records), args.kernels_csv)
    fig = figures_link(args.device)
    text = blocks(
        *[
            _profiler_line(records)
            + (
                " Operators are attributed to a phase by the profiler's ranges around it; matmul = `aten::mm`, "
                "`aten::bmm`, … by name. Batch "
                if args.device == "cpu"
                else " Kernels are attributed to a phase when the CUDA call that launched them "
                "started inside the phase's NVTX range (on any thread: backward kernels come from the autograd thread); "
                "matmul = cuBLAS/CUTLASS kernels by name. Batch "
            )
            + ", ".join(sorted({str((r["provenance"].get("settings") or {}).get("batch_size")) for r in records}))
            + "; "
            + ", ".join(
                sorted(
                    {
                        f"{r['metrics'].get('measured_steps')} measured steps after "
                        f"{r['metrics'].get('warmup_steps')} warm-up"
                        for r in records
                    }
                )
            )
            + ".",
            section_oom(df),
            section_a(df),
            section_b(df),
            section_c(records, df),
            section_d(df),
            section_e(df),
            f"![{_kernel_word(df)} classes]({fig}/nsys_class_shares.png) ![attention]({fig}/nsys_attention.png)",
            f"_Source: {len(records)} records in `results/{args.device}/nsys/` and {len(e2e)} in "
            f"`results/{args.device}/e2e/`, {device_line(records)}._",
        ]
    )
    write_text(Path(args.sections_dir) / "nsys_profile.md", text)
    figures(df, Path(args.figures_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
