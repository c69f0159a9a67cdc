"""Report of the flash cells: flash_forward, flash_backward, flash_benchmarking and leaderboard.

Writes three CSVs (correctness entries, benchmark cells, leaderboard rows), two figures (speed-up
over plain attention and forward+backward time against sequence length, one panel per precision
and head dimension) and four fragments for report/answers.md. Every number comes from the
records; the one figure cited from outside (the course's best verified leaderboard entry) is
labelled as the course's.

    python -m lmperf.kinds.flash.report --device cpu --tables-dir results/cpu/tables \
        --sections-dir results/cpu/sections --figures-dir results/cpu/figures \
        --records results/cpu/flash/*.json
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import pandas as pd
from matplotlib.ticker import FuncFormatter, NullFormatter

from lmperf.core.peaks import PEAKS
from lmperf.kinds.flash.products import PRODUCT_SENTENCES, PRODUCT_WORDS, SDPA_FP32_WHY, record_products, sdpa_products
from lmperf.report.common import (
    device_line,
    empty_figure,
    figure,
    fmt,
    lengths_text,
    load,
    md_table,
    save,
    write_text,
)

KIND = "flash"
TENSORS = ("O", "L", "dQ", "dK", "dV")
FORWARD_TENSORS = ("O", "L")
BACKWARD_TENSORS = ("dQ", "dK", "dV")
PASSES = ("forward", "backward", "forward_backward")
PRECISION_ORDER = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3}
# fp32 and tf32 share float32 inputs; the label says which products the matmuls ran
PRECISION_LABELS = {"fp32": "fp32 (IEEE float32 products)", "tf32": "tf32 (float32 inputs, TF32 tensor-core products)"}
# The course's published best verified leaderboard entry: cited, never measured here.
COURSE_BEST_LEADERBOARD_MS = 5.364
COURSE_BEST_LEADERBOARD_DEVICE = "H100"
MAX_LISTED = 8


# --- frames ---------------------------------------------------------------------------------------


def split(records: list[dict]) -> dict[str, list[dict]]:
    out = {"correctness": [], "benchmark": [], "leaderboard": []}
    for r in records:
        out.setdefault(r["cell"].get("test", "other"), []).append(r)
    return out


def correctness_frame(records: list[dict]) -> pd.DataFrame:
    """One row per correctness entry (every implementation's record)."""
    rows = []
    for r in records:
        m = r["metrics"]
        for e in m.get("entries_detail", []):
            row = {
                "implementation": r["cell"]["implementation"],
                "kernel_mode": m.get("kernel_mode"),
                "device": r["provenance"]["device_slug"],
            }
            row.update(
                {
                    k: e.get(k)
                    for k in (
                        "precision",
                        "head_dim",
                        "causal",
                        "batch",
                        "n_queries",
                        "n_keys",
                        "seed",
                        "status",
                        "tolerance_o_l",
                        "tolerance_grad",
                        "saved_tensor_count",
                        "saved_l_shaped_count",
                        "saved_l_dtype",
                        "saved_contract_ok",
                        "output_dtype_ok",
                        "message",
                        "entry_wall_s",
                    )
                }
            )
            row.update({f"{t}_rel_error": e.get(f"{t}_rel_error") for t in TENSORS})
            row["failed_checks"] = "; ".join(e.get("failed_checks") or [])
            rows.append(row)
    columns = [
        "implementation",
        "kernel_mode",
        "device",
        "precision",
        "head_dim",
        "causal",
        "batch",
        "n_queries",
        "n_keys",
        "seed",
        "status",
        *(f"{t}_rel_error" for t in TENSORS),
        "tolerance_o_l",
        "tolerance_grad",
        "saved_tensor_count",
        "saved_l_shaped_count",
        "saved_l_dtype",
        "saved_contract_ok",
        "output_dtype_ok",
        "failed_checks",
        "message",
        "entry_wall_s",
    ]
    return pd.DataFrame(rows, columns=columns)


BENCH_SCALARS = (
    "ran",
    "sdpa_backend",
    "timing_status",
    *(f"{p}_ms_median" for p in PASSES),
    *(f"{p}_tflops" for p in PASSES),
    *(f"speedup_vs_plain_{p}" for p in PASSES),
    "peak_allocated_mib",
    "error",
    "cell_wall_s",
)


def bench_frame(records: list[dict]) -> pd.DataFrame:
    rows = []
    for r in records:
        c, m = r["cell"], r["metrics"]
        row = {
            k: c.get(k) for k in ("implementation", "precision", "head_dim", "sequence_length", "batch_size", "causal")
        }
        row.update(status=r["status"], reason=r.get("reason"))
        row.update({k: m.get(k) for k in BENCH_SCALARS})
        configs = m.get("autotuned_configs")
        row["autotuned_configs"] = (
            " ".join(
                f"{k}:{v['BLOCK_M']}x{v['BLOCK_N']}/w{v.get('num_warps')}/s{v.get('num_stages')}"
                for k, v in configs.items()
                if v
            )
            if configs
            else None
        )
        rows.append(row)
    df = pd.DataFrame(
        rows,
        columns=[
            "implementation",
            "precision",
            "head_dim",
            "sequence_length",
            "batch_size",
            "causal",
            "status",
            "reason",
            *BENCH_SCALARS,
            "autotuned_configs",
        ],
    )
    if df.empty:
        return df
    df["_p"] = df.precision.map(PRECISION_ORDER)
    return (
        df.sort_values(["_p", "head_dim", "sequence_length", "implementation"])
        .drop(columns="_p")
        .reset_index(drop=True)
    )


def leaderboard_frame(records: list[dict]) -> pd.DataFrame:
    """Protocol rows (torch.compile, leaderboard shape) and the eager side-by-side rows."""
    rows = []
    for r in records:
        m = r["metrics"]
        shape = m.get("leaderboard_shape") or {}
        for impl, result in (m.get("protocol") or {}).items():
            rows.append(
                {
                    "table": "protocol",
                    "implementation": impl,
                    "batch_size": shape.get("batch"),
                    "sequence_length": shape.get("seq"),
                    "head_dim": shape.get("head_dim"),
                    "precision": shape.get("dtype"),
                    "status": result.get("status"),
                    "forward_backward_ms_median": result.get("forward_backward_ms_median"),
                    "forward_backward_ms_mean": result.get("forward_backward_ms_mean"),
                    "error": result.get("error"),
                }
            )
        for row in m.get("side_by_side") or []:
            rows.append({"table": "eager", **{k: v for k, v in row.items() if k != "autotuned_configs"}})
    return pd.DataFrame(rows)


# --- helpers ----------------------------------------------------------------------------------------


def _label(value) -> str:
    return ", ".join(map(str, value))


def _sci(x) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1e}"


def _shapes(df: pd.DataFrame) -> str:
    shapes = sorted({(int(b), int(q), int(k)) for b, q, k in zip(df.batch, df.n_queries, df.n_keys)})
    return ", ".join(f"({b}, {q}, {k})" for b, q, k in shapes)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def source_line(records: list[dict], device: str) -> str:
    return f"\n_Source: {_count(len(records), 'record')} in `results/{device}/{KIND}/`, {device_line(records)}._\n"


def _not_run(records: list[dict], what: str, device: str) -> str | None:
    """A sentence when none of the records holds a measurement (e.g. every one unsupported on a CPU)."""
    if not records:
        return f"_No {what} records on `{device}`._\n"
    if all(r["status"] != "ok" for r in records):
        reasons = sorted({r.get("reason") or r["status"] for r in records})
        statuses = ", ".join(sorted({r["status"] for r in records}))
        subject = f"the {what} record is" if len(records) == 1 else f"all {len(records)} {what} records are"
        return f"Not measured on `{device}`: {subject} `{statuses}` ({'; '.join(reasons)}).\n"
    return None


# --- flash_forward / flash_backward --------------------------------------------------------------


def error_table(df: pd.DataFrame, tensors) -> pd.DataFrame:
    """Largest relative error of each tensor per implementation and precision, with the tolerance."""
    rows = []
    for (impl, precision), g in df.groupby(["implementation", "precision"], sort=False):
        tol_col = "tolerance_o_l" if tensors == FORWARD_TENSORS else "tolerance_grad"
        row = {"implementation": impl, "precision": precision}
        for t in tensors:
            row[f"max {t} error"] = _sci(g[f"{t}_rel_error"].max())
        row["tolerance"] = _sci(g[tol_col].max())
        row["within tolerance"] = f"{int((g.status == 'ok').sum())} of {len(g)}"
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["_p"] = out.precision.map(PRECISION_ORDER)
    return out.sort_values(["implementation", "_p"]).drop(columns="_p")


def _failures(df: pd.DataFrame) -> str:
    bad = df[df.status != "ok"]
    if bad.empty:
        return ""
    items = [
        f"{r.implementation} {r.precision} d={r.head_dim} causal={r.causal} ({r.batch}, {r.n_queries}, "
        f"{r.n_keys}): {r.status}" + (f" — {r.failed_checks or r.message}" if (r.failed_checks or r.message) else "")
        for r in bad.itertuples()
    ]
    more = f"; and {len(items) - MAX_LISTED} more (see the CSV)" if len(items) > MAX_LISTED else ""
    return (
        f"**{len(bad)} of {len(df)} entries are not within tolerance or did not run:** "
        + "; ".join(items[:MAX_LISTED])
        + more
        + "."
    )


TILE_KERNELS = (("fwd", "forward"), ("dkdv", "dK/dV pass"), ("dq", "dQ pass"))


def _tile(choice) -> str | None:
    """'128×64' from one kernel's tile choice (``{"config": {...}}`` or the config itself)."""
    if not isinstance(choice, dict):
        return None
    cfg = choice.get("config", choice)
    if "BLOCK_M" not in cfg or "BLOCK_N" not in cfg:
        return None
    return f"{cfg['BLOCK_M']}×{cfg['BLOCK_N']}"


def _dims_text(dims: list[int], tested: list[int]) -> str:
    """'d ≤ 64', 'd ≥ 80', 'd = 80, 128' or 'every d', against the head dims tested."""
    dims = sorted(dims)
    if dims == tested:
        return "every d"
    if len(dims) > 1 and dims == [d for d in tested if d <= dims[-1]]:
        return f"d ≤ {dims[-1]}"
    if len(dims) > 1 and dims == [d for d in tested if d >= dims[0]]:
        return f"d ≥ {dims[0]}"
    return f"d = {_label(dims)}"


def _tiles_text(record: dict) -> str:
    """Every tile set (forward / dK/dV / dQ) the record's entries ran, with how many entries ran each
    and where; from the entries' own tiles, else the record's list of tiles (which entries ran which
    then unknown)."""
    m = record["metrics"]
    entries = [e for e in m.get("entries_detail") or [] if isinstance(e.get("tiles"), dict)]
    names = " / ".join(name for _, name in TILE_KERNELS)
    if entries:
        groups: dict[tuple, list[dict]] = {}
        for e in entries:
            key = tuple(_tile(e["tiles"].get(k)) or "?" for k, _ in TILE_KERNELS)
            groups.setdefault(key, []).append(e)
        tested = {p: sorted({e["head_dim"] for e in entries if e["precision"] == p}) for p in PRECISION_ORDER}
        parts = []
        for key, es in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            where: dict[str, list[str]] = {}
            for p in sorted({e["precision"] for e in es}, key=lambda p: PRECISION_ORDER.get(p, 9)):
                dims = sorted({e["head_dim"] for e in es if e["precision"] == p})
                where.setdefault(_dims_text(dims, tested.get(p, dims)), []).append(p)
            at = "; ".join(f"{', '.join(ps)} {dims}" for dims, ps in where.items())
            parts.append(f"{' / '.join(key)} in {len(es)} {'entry' if len(es) == 1 else 'entries'} ({at})")
        unknown = len(m.get("entries_detail") or []) - len(entries)
        tail = f"; {unknown} entries name no tiles" if unknown else ""
        return f"; tiles (BLOCK_M×BLOCK_N, {names}): " + ", ".join(parts) + tail
    tiles = m.get("triton_tiles")
    if not tiles:
        return ""
    listed = []
    for k, name in TILE_KERNELS:
        choices = tiles.get(k)
        choices = choices if isinstance(choices, list) else [choices]
        shown = list(dict.fromkeys(t for t in map(_tile, choices) if t))
        if shown:
            listed.append(f"{name} {', '.join(shown)}")
    if not listed:
        return ""
    several = any(isinstance(tiles.get(k), list) and len(tiles[k]) > 1 for k, _ in TILE_KERNELS)
    return "; tiles (BLOCK_M×BLOCK_N) " + ("used across the entries: " if several else "") + ", ".join(listed)


def _what_was_tested(records: list[dict], df: pd.DataFrame) -> str:
    lines = []
    for r in records:
        m = r["metrics"]
        g = df[df.implementation == r["cell"]["implementation"]]
        if r["status"] != "ok" or g.empty:
            lines.append(f"- `{r['cell']['implementation']}`: {r['status']} ({r.get('reason')}).")
            continue
        tile_text = _tiles_text(r)
        lines.append(
            f"- `{m.get('function')}` ({m.get('kernel_mode')}{tile_text}): {len(g)} entries — precisions "
            f"{_label(sorted(g.precision.unique(), key=PRECISION_ORDER.get))} × head dims "
            f"{_label(sorted(g.head_dim.unique()))} × causal {_label(sorted(g.causal.unique()))} × shapes "
            f"(batch, n_queries, n_keys) {_shapes(g)}; fresh N(0, 1) inputs, base seed {m.get('seed')} "
            "(one seed per entry, in the CSV)." + _course_entries_text(r)
        )
    return "\n".join(lines)


def _course_entries_text(record: dict) -> str:
    """' N of them are the course's …' where the record ran the course's entries first, else ''."""
    m = record["metrics"]
    if m.get("course_part_process_age_s") is None or m.get("course_entries") is None:
        return ""
    s = record["provenance"].get("settings", {})
    return (
        f" {m['course_entries']} of them are the course's (precisions {_label(s.get('course_precisions') or [])} × "
        f"head dims {_label(s.get('course_head_dims') or [])}), checked first; the others are this project's "
        "additions, whose time the header counts apart."
    )


def _saved_sentence(df: pd.DataFrame) -> str:
    checked = df[df.saved_contract_ok.notna()]
    if checked.empty:
        return ""
    ok = checked[checked.saved_contract_ok.astype(bool)]
    counts = sorted({int(c) for c in checked.saved_tensor_count.dropna()})
    per_impl = ", ".join(
        f"`{impl}` {int(g.saved_contract_ok.astype(bool).sum())} of {len(g)}"
        for impl, g in checked.groupby("implementation")
    )
    verdict = (
        "every entry keeps the contract"
        if len(ok) == len(checked)
        else f"**{len(checked) - len(ok)} entries break it**"
    )
    return (
        f"Saved for backward: exactly one saved tensor has L's shape (batch, n_queries), and it is float32, in "
        f"{per_impl} entries ({verdict}); the forward saves {_label(counts)} tensors in all "
        "(L, Q, K, V, O)."
    )


def _largest_sentence(df: pd.DataFrame, tensors) -> str:
    parts = []
    for (impl, precision), g in df.groupby(["implementation", "precision"], sort=False):
        errors = {t: g[f"{t}_rel_error"].max() for t in tensors}
        errors = {t: e for t, e in errors.items() if e is not None and not pd.isna(e)}
        if not errors:
            continue
        worst = max(errors, key=errors.get)
        tol = g["tolerance_o_l" if tensors == FORWARD_TENSORS else "tolerance_grad"].max()
        parts.append((impl, precision, worst, errors[worst], tol))
    if not parts:
        return ""
    text = []
    for impl in dict.fromkeys(p[0] for p in parts):
        items = [
            f"{precision} {_sci(err)} ({worst}; "
            + (f"{100 * err / tol:.2g}% of" if err < tol else f"{err / tol:.3g}× over")
            + f" the tolerance {_sci(tol)})"
            for i, precision, worst, err, tol in sorted(parts, key=lambda p: PRECISION_ORDER.get(p[1], 9))
            if i == impl
        ]
        text.append(f"`{impl}`: " + ", ".join(items))
    return "Largest relative error per precision — " + "; ".join(text) + "."


def section_correctness(problem: str, records: list[dict], df: pd.DataFrame, device: str) -> str:
    forward = problem == "flash_forward"
    tensors = FORWARD_TENSORS if forward else BACKWARD_TENSORS
    out = []
    if forward:
        out.append(
            "(a) `lmperf.kernels.flash.FlashAttention2PyTorch`: the tiled forward in PyTorch (query and key tiles of 32 rows, "
            "running max, running sum and unnormalised output in float32), saving L = logsumexp with Q, K, V, O. "
            "(b) `lmperf.kernels.flash.triton_forward.flash_fwd_kernel`: launch grid (query tiles, batch), one loop over key "
            "tiles with the online-softmax state in float32, P cast to V's dtype before the second matmul, O cast "
            "back to the input dtype. (c) `is_causal` is a `tl.constexpr`: key tiles above the diagonal are "
            "skipped, tiles below it run unmasked, only diagonal (and ragged) tiles are masked; query i sees key j "
            "iff i ≥ j (top-left aligned).\n"
        )
    else:
        out.append(
            "The backward recomputes P = exp(QKᵀ/√d − L) from the saved log-sum-exp instead of storing it: "
            "D = rowsum(O ∘ dO), dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − D), dQ = dS K/√d, dK = dSᵀ Q/√d. "
            "`FlashAttention2PyTorch` runs these tile by tile in PyTorch; `FlashAttention2Triton` runs them in two "
            "Triton passes without atomics (one program per key tile accumulates dK and dV over query tiles; one per "
            "query tile accumulates dQ over key tiles), after a small kernel computing D.\n"
        )
    if not records:
        return "\n".join(out + [f"_No correctness records on `{device}`._\n"])
    out.append("### What was tested\n")
    out.append(_what_was_tested(records, df))
    out.append(
        "\nEach entry runs forward and backward through the `autograd.Function` (dO random) and compares "
        + ("O and L" if forward else "dQ, dK and dV")
        + " with float64 attention computed from the same rounded inputs "
        "(`lmperf.kernels.flash.reference.reference_with_grads`): relative Frobenius error ‖x − ref‖_F / ‖ref‖_F.\n"
    )
    if df.empty:
        return "\n".join(out) + "\n"
    out.append("### Largest error against float64\n")
    out.append(md_table(error_table(df, tensors)))
    sentences = [_largest_sentence(df, tensors)]
    ran = df[df.status.isin(["ok", "fail"])]
    if (df.status == "ok").all():
        sentences.append(
            f"All {len(df)} entries of {len(records)} implementation(s) are within tolerance "
            f"({'O, L' if forward else 'dQ, dK, dV'} and every other check)."
        )
    else:
        sentences.append(_failures(df))
    if forward:
        sentences.append(_saved_sentence(ran))
    out.append(" ".join(s for s in sentences if s) + "\n")
    return "\n".join(out)


# --- flash_benchmarking ----------------------------------------------------------------------------


def _impl_label(df: pd.DataFrame, impl: str) -> str:
    backends = df[(df.implementation == impl) & df.sdpa_backend.notna()].sdpa_backend.unique()
    return f"{impl} ({', '.join(backends)})" if len(backends) else impl


def _cell_times(row) -> str:
    if row is None:
        return "—"
    if row.status == "oom":
        done = [fmt(getattr(row, f"{p}_ms_median"), 3) for p in PASSES if not pd.isna(getattr(row, f"{p}_ms_median"))]
        return "OOM" + (f" (fwd {done[0]})" if done else "")
    if row.status != "ok":
        return "n/a"
    return " / ".join(fmt(getattr(row, f"{p}_ms_median"), 3) for p in PASSES)


def bench_table(df: pd.DataFrame, precision: str) -> pd.DataFrame:
    sub = df[df.precision == precision]
    impls = _ordered(sub.implementation)
    rows = []
    for (d, n), g in sub.groupby(["head_dim", "sequence_length"]):
        by = {r.implementation: r for r in g.itertuples()}
        row = {"d": d, "N": n}
        for impl in impls:
            row[f"{_impl_label(sub, impl)} fwd / bwd / fwd+bwd (ms)"] = _cell_times(by.get(impl))
        flash = by.get("flash_triton")
        if flash is not None:
            row["flash_triton speed-up vs plain (fwd+bwd)"] = flash.speedup_vs_plain_forward_backward
            others = [i for i in impls if i not in ("plain", "flash_triton")]
            for other in others:
                o = by.get(other)
                ok = o is not None and o.status == "ok" and flash.status == "ok"
                row[f"flash_triton / {other} time (fwd+bwd)"] = (
                    flash.forward_backward_ms_median / o.forward_backward_ms_median if ok else None
                )
        rows.append(row)
    return pd.DataFrame(rows)


def _ordered(names) -> list[str]:
    """Implementations in report order: the baseline, ours, then the rest as found."""
    names = list(dict.fromkeys(names))
    return [n for n in ("plain", "flash_triton") if n in names] + [
        n for n in names if n not in ("plain", "flash_triton")
    ]


def _oom_boundary(sub: pd.DataFrame, impl: str) -> dict:
    """Per head dim, the smallest length at which `impl` ran out of memory."""
    g = sub[(sub.implementation == impl) & (sub.status == "oom")]
    return {int(d): int(x.sequence_length.min()) for d, x in g.groupby("head_dim")}


def planned_cells(records: list[dict]) -> set[tuple[str, str, int, int]]:
    """(precision, implementation, head dim, N) of every cell the benchmark records' settings asked for."""
    cells = set()
    for r in records:
        s = r["provenance"].get("settings") or {}
        precision = s.get("precision") or r["cell"].get("precision")
        for impl in s.get("implementations") or [r["cell"].get("implementation")]:
            for d in s.get("head_dims") or []:
                for n in s.get("sequence_lengths") or []:
                    cells.add((precision, impl, int(d), int(n)))
    return cells


def missing_cells(df: pd.DataFrame, precision: str, planned=None) -> dict[str, dict[int, list[int]]]:
    """Per implementation and head dim, the lengths with no record at this precision (not measured):
    the planned cells (the records' settings) and every (d, N) any implementation has, less those
    with a record."""
    sub = df[df.precision == precision]
    impls = set(sub.implementation)
    want = {(i, int(d), int(n)) for i in impls for d, n in zip(sub.head_dim, sub.sequence_length)}
    want |= {(i, d, n) for p, i, d, n in planned or () if p == precision}
    have = {(i, int(d), int(n)) for i, d, n in zip(sub.implementation, sub.head_dim, sub.sequence_length)}
    out: dict[str, dict[int, list[int]]] = {}
    for i, d, n in sorted(want - have):
        out.setdefault(i, {}).setdefault(d, []).append(n)
    return out


def bench_sentences(df: pd.DataFrame, precision: str, planned=None) -> str:
    """The sentences under one precision's table. Out of memory means a record with status oom; a
    cell with no record is 'not measured', never out of memory."""
    sub = df[df.precision == precision]
    missing = missing_cells(df, precision, planned)
    flash = sub[(sub.implementation == "flash_triton") & (sub.status == "ok")]
    out = []
    speed = flash.dropna(subset=["speedup_vs_plain_forward_backward"])
    if not speed.empty:
        best = speed.loc[speed.speedup_vs_plain_forward_backward.idxmax()]
        worst = speed.loc[speed.speedup_vs_plain_forward_backward.idxmin()]
        s = speed.speedup_vs_plain_forward_backward
        out.append(
            f"Forward+backward, flash_triton against plain: {fmt(s.min())}× to {fmt(s.max())}× plain's speed "
            f"(median {fmt(s.median())}×) over the {len(s)} shapes where both ran; largest at d = "
            f"{best.head_dim}, N = {best.sequence_length}, smallest at d = {worst.head_dim}, "
            f"N = {worst.sequence_length}; faster in {int((s > 1).sum())} of them."
        )
        fwd = speed.speedup_vs_plain_forward.dropna()
        if not fwd.empty:
            out.append(f"Forward alone: {fmt(fwd.min())}× to {fmt(fwd.max())}× (median {fmt(fwd.median())}×).")
    plain_oom = _oom_boundary(sub, "plain")
    if plain_oom:
        flash_max = flash.groupby("head_dim").sequence_length.max().to_dict()
        parts = []
        for d, n in sorted(plain_oom.items()):
            part = f"N = {n} for d = {d}"
            if d in flash_max:
                gap = [m for m in missing.get("flash_triton", {}).get(d, []) if m > flash_max[d]]
                part += f" (flash_triton ran up to N = {flash_max[d]}" + (
                    f"; it has no record at {lengths_text(gap)}: not measured)" if gap else ")"
                )
            parts.append(part)
        out.append("Plain attention first runs out of memory (status oom) at " + "; ".join(parts) + ".")
    flash_oom = _oom_boundary(sub, "flash_triton")
    if flash_oom:
        out.append(
            "flash_triton runs out of memory at "
            + "; ".join(f"d = {d}, N ≥ {n}" for d, n in sorted(flash_oom.items()))
            + "."
        )
    for other in [i for i in _ordered(sub.implementation) if i not in ("plain", "flash_triton")]:
        o = sub[(sub.implementation == other) & (sub.status == "ok")]
        both = flash.merge(o, on=["head_dim", "sequence_length"], suffixes=("", "_o"))
        if both.empty:
            continue
        ratio = both.forward_backward_ms_median / both.forward_backward_ms_median_o
        fratio = both.forward_ms_median / both.forward_ms_median_o
        out.append(
            f"Against {_impl_label(sub, other)}: flash_triton's forward+backward time is {fmt(ratio.min())}× to "
            f"{fmt(ratio.max())}× its time (median {fmt(ratio.median())}×; forward alone median "
            f"{fmt(fratio.median())}×); ours is faster (ratio below 1) in {int((ratio < 1).sum())} of "
            f"{len(ratio)} shapes."
        )
    if missing:
        out.append(
            "No record yet (not measured, so not out of memory): "
            + "; ".join(
                f"{impl} at d = {d}, {lengths_text(ns)}"
                for impl in _ordered(missing)
                for d, ns in missing[impl].items()
            )
            + "."
        )
    unsupported = sub[sub.status == "unsupported"]
    if not unsupported.empty:
        items = sorted({f"{r.implementation} ({r.reason})" for r in unsupported.itertuples()})[:MAX_LISTED]
        out.append(f"Did not run ({_count(len(unsupported), 'cell')}): " + "; ".join(items) + ".")
    tf = flash.dropna(subset=["forward_tflops"])
    if not tf.empty:
        best = tf.loc[tf.forward_tflops.idxmax()]
        out.append(
            f"Highest flash_triton forward throughput: {fmt(best.forward_tflops, 1)} TFLOP/s "
            f"(d = {best.head_dim}, N = {best.sequence_length}); forward+backward "
            f"{fmt(tf.forward_backward_tflops.max(), 1)} TFLOP/s at best."
        )
    return " ".join(out)


def _bench_records(records: list[dict], precision: str) -> list[dict]:
    return [
        r
        for r in records
        if r["cell"].get("test", "benchmark") == "benchmark" and r["cell"].get("precision") == precision
    ]


def _plain_products(records: list[dict], precision: str) -> str:
    """'IEEE fp32' or 'TF32' for plain's cuBLAS matmuls of one float32-input precision, from
    ``matmul_allow_tf32`` in the provenance of its records."""
    plain = [r for r in _bench_records(records, precision) if r["cell"].get("implementation") == "plain"]
    return "TF32" if any(r["provenance"].get("matmul_allow_tf32") for r in plain) else "IEEE fp32"


def _sdpa_sentence(records: list[dict], precision: str) -> str:
    """What sdpa's rows of a float32-input precision multiplied in, where its backend and the device
    decide it (lmperf.kinds.flash.products.sdpa_products); '' otherwise."""
    if precision not in ("fp32", "tf32"):
        return ""
    products = sdpa_products(_bench_records(records, precision), "sdpa")
    if not products:
        return ""
    return f" sdpa ran {PRODUCT_WORDS.get(products, products)}: {SDPA_FP32_WHY}, so its rows are " + (
        "not TF32 arithmetic: they ran the same products as in the fp32 table."
        if precision == "tf32"
        else "fp32-accurate, not IEEE float32 arithmetic."
    )


def _triton_products(records: list[dict], precision: str) -> list[str]:
    """What flash_triton's fp32 benchmark records multiplied in (sorted labels of
    lmperf.kinds.flash.products.PRODUCT_LABELS: the record's ``dot_precision`` where it has one, else
    what the code that wrote it did); [] for other precisions."""
    if precision != "fp32":
        return []
    found = {
        p[0]
        for p in map(
            record_products,
            (
                r
                for r in records
                if r["cell"].get("test", "benchmark") == "benchmark"
                and r["cell"].get("implementation") == "flash_triton"
                and r["cell"].get("precision") == "fp32"
            ),
        )
        if p
    }
    return sorted(found)


# Where a tile choice came from (``lmperf.kernels.flash.tuning``), in the report's words.
TILE_SOURCE_WORDS = {
    "heuristic": "the heuristic's (no tuning inside the timed grid)",
    "committed": "remembered for this device (`src/lmperf/kernels/flash/tuned/`)",
    "user_cache": "from the user's tuning cache",
    "memory": "tuned earlier in the same process",
    "tuned": "tuned in the run",
    "interpreter": "the Triton interpreter's",
}


def tile_sources_text(sources: dict[str, int]) -> str:
    """``6 tuned in the run, 2 …``: counts of tile choices by where they came from, most first."""
    return ", ".join(f"{n} {TILE_SOURCE_WORDS.get(k, k)}" for k, n in sorted(sources.items(), key=lambda kv: -kv[1]))


def leaderboard_tiles_sentence(metrics: dict) -> str:
    """How our kernels' tiles were chosen for the leaderboard (its first runs' sources), and the tuning time
    kept out of the timings."""
    first = metrics.get("first_runs") or {}
    sources = {k: v for k, v in (first.get("tile_sources") or {}).items() if v and k != "candidates_failed"}
    if not sources:
        return ""
    tuned = first.get("tuning_s") or 0.0
    return f" Our kernels' tiles for this shape: {tile_sources_text(sources)}" + (
        f"; tuning took {tuned:.1f} s before timing, not part of the times (SDPA's backends pick their own kernels)."
        if tuned
        else "."
    )


def _tile_sources(records: list[dict]) -> str:
    """How flash_triton's tiles were chosen, from the records (``metrics.tiles``: one choice per kernel)."""
    sources: dict[str, int] = {}
    for r in records:
        tiles = r.get("metrics", {}).get("tiles")
        if r["cell"].get("implementation") != "flash_triton" or not isinstance(tiles, dict):
            continue
        for choice in tiles.values():
            if isinstance(choice, dict) and choice.get("source"):
                sources[choice["source"]] = sources.get(choice["source"], 0) + 1
    if not sources:
        return ""
    return f" (tiles per kernel and shape: {tile_sources_text(sources)})"


# Where the benchmark records were timed (the records' settings.timing names it; older ones do not).
TIMING_FUNCTION = "lmperf.kinds.flash.harness.time_attention"


def _timing_function(settings: dict) -> str:
    """The timing function a benchmark record names in ``settings.timing``, else TIMING_FUNCTION."""
    match = re.match(r"\s*`?(lmperf(?:\.\w+)+)", str(settings.get("timing") or ""))
    return match.group(1) if match else TIMING_FUNCTION


def section_benchmarking(records: list[dict], df: pd.DataFrame, device: str, fig: str) -> str:
    out = []
    not_run = _not_run(records, "benchmark", device)
    if not_run:
        return not_run
    s = next(r["provenance"]["settings"] for r in records if r["status"] == "ok")
    out.append(
        f"`{_timing_function(s)}`: medians of `triton.testing.do_bench` (warm-up {s['warmup_ms']:g} ms, "
        f"rep {s['rep_ms']:g} ms) of the forward, the backward (on one retained graph, input gradients reset "
        f"outside the timed region) and forward+backward; Q, K, V of shape ({s['batch_size']}, N, d), "
        f"{'causal' if s['causal'] else 'not causal'}, made before timing. `plain` is the course's unfused attention "
        "(the baseline; speed-up = plain's time / the implementation's), `flash_triton` our kernels"
        + _tile_sources(records)
        + "; `sdpa` is `F.scaled_dot_product_attention` pinned to the backend named (the flash backend takes only "
        "fp16/bf16). Cells: forward / backward / forward+backward milliseconds; OOM = out of memory (a record "
        "with status oom), n/a = the implementation refused the shape, — = no record (not measured). TFLOP/s "
        "count 4·B·N²·d/2 for a causal forward, 2.5× for backward (`lmperf.core.flops`).\n"
    )
    for precision in sorted(df.precision.unique(), key=PRECISION_ORDER.get):
        products = _triton_products(records, precision)
        if "TF32" in products:  # records of the old kernels, whose fp32 ran TF32 products
            out.append(f"### {precision} (fp32 inputs, TF32 products in flash_triton)\n")
            out.append(
                "flash_triton's `tl.dot` multiplies fp32 inputs in TF32 on tensor cores, so its rows "
                "(and its TFLOP/s, to be read against the TF32 peak, not fp32's) are not fp32 arithmetic; "
                "plain's matmuls ran in fp32.\n"
            )
        elif products and products != ["IEEE"]:
            words = " or ".join(PRODUCT_WORDS.get(p, p) for p in products)
            sdpa = sdpa_products(_bench_records(records, precision), "sdpa")
            also = f"; sdpa: {PRODUCT_WORDS.get(sdpa, sdpa)}" if sdpa else ""
            out.append(f"### {precision} (fp32 inputs; flash_triton: {words}{also})\n")
            what = "; ".join(PRODUCT_SENTENCES.get(p, p) for p in products)
            plain = _plain_products(records, precision)
            out.append(
                f"flash_triton's `tl.dot` multiplies fp32 inputs with {what}; plain's matmuls ran in {plain} "
                "(`matmul_allow_tf32` in its records' provenance)." + _sdpa_sentence(records, precision) + "\n"
            )
        else:
            sdpa = sdpa_products(_bench_records(records, precision), "sdpa") if precision in ("fp32", "tf32") else None
            label = PRECISION_LABELS.get(precision, precision)
            out.append(f"### {label[:-1] + f'; sdpa: {PRODUCT_WORDS.get(sdpa, sdpa)})' if sdpa else label}\n")
            if sdpa:
                out.append(_sdpa_sentence(records, precision).strip() + "\n")
        out.append(md_table(bench_table(df, precision)))
        out.append(bench_sentences(df, precision, planned_cells(records)) + "\n")
    out.append(f"![speed-up over plain]({fig}/flash_speedup.png) ![forward+backward time]({fig}/flash_time.png)\n")
    return "\n".join(out)


# --- leaderboard ------------------------------------------------------------------------------------


def section_leaderboard(records: list[dict], device: str) -> str:
    not_run = _not_run(records, "leaderboard", device)
    course = (
        f"The course's published best verified entry is {COURSE_BEST_LEADERBOARD_MS} ms on an "
        f"{COURSE_BEST_LEADERBOARD_DEVICE} (the course's figure, cited, not measured here)."
    )
    if not_run:
        return not_run + "\n" + course + "\n"
    r = records[0]
    m, s = r["metrics"], r["provenance"]["settings"]
    shape = m["leaderboard_shape"]
    protocol = m.get("protocol") or {}
    out = [
        "Protocol: `f = torch.compile(attention)`" if s.get("compile") else "Protocol: eager (no torch.compile)",
        f"; `do_bench(lambda: f(q, k, v, True).sum().backward(), warmup={s['warmup_ms']:g}, "
        f"rep={s['rep_ms']:g})`, median; Q, K, V of shape ({shape['batch']}, {shape['seq']}, "
        f"{shape['head_dim']}) ({shape['batch']} heads folded into the batch), {shape['dtype']}, causal; every "
        f"implementation in the same process, one after the other, on {r['provenance']['device_name']}.\n",
    ]
    out[0] = out[0] + out.pop(1)
    rows = []
    for impl, res in protocol.items():
        rows.append(
            {
                "implementation": impl,
                "status": res.get("status"),
                "fwd+bwd median (ms)": res.get("forward_backward_ms_median"),
                "fwd+bwd mean (ms)": res.get("forward_backward_ms_mean"),
            }
        )
    out.append(md_table(pd.DataFrame(rows)))
    ours = protocol.get("flash_triton", {}).get("forward_backward_ms_median")
    line = []
    if ours is not None:
        line.append(f"**Ours (flash_triton): {fmt(ours, 3)} ms**")
        for other, name in (("sdpa_flash", "SDPA flash"), ("sdpa_cudnn", "SDPA cuDNN")):
            theirs = protocol.get(other, {}).get("forward_backward_ms_median")
            ratio = m.get(f"ratio_flash_triton_over_{other}")
            if theirs is not None and ratio is not None:
                line.append(
                    f"{name} {fmt(theirs, 3)} ms (ours/{name.split()[-1]} = {fmt(ratio, 3)}: ours is "
                    f"{'faster' if ratio < 1 else 'slower'})"
                )
            else:
                res = protocol.get(other, {})
                if res:
                    line.append(f"{name}: {res.get('status')} ({res.get('error')})")
        line_text = "; ".join(line) + f", on {r['provenance']['device_name']} (`{device}`)."
        line_text += leaderboard_tiles_sentence(m)
    else:
        res = protocol.get("flash_triton", {})
        line_text = f"Ours did not finish: {res.get('status')} ({res.get('error')})."
    out.append(line_text)
    if ours is not None:
        same = device == COURSE_BEST_LEADERBOARD_DEVICE.lower()
        course += f" Ours is {fmt(ours / COURSE_BEST_LEADERBOARD_MS, 3)}× that time" + (
            "." if same else f", measured on a different device (`{device}`), so the comparison is indicative only."
        )
    out.append(course + "\n")

    side = [row for row in m.get("side_by_side") or []]
    if side:
        peak = PEAKS.get(device, {}).get("bf16")
        note = m.get("forward_batch_note")
        out.append(
            f"### Side by side, eager: causal, N = {side[0]['sequence_length']}, batch {side[0]['batch_size']}"
            + (f" ({note})" if note else "")
            + f", {side[0]['precision']}\n"
        )
        table = pd.DataFrame(
            [
                {
                    "implementation": x["implementation"],
                    "d": x["head_dim"],
                    "status": x["status"],
                    "fwd (ms)": x.get("forward_ms_median"),
                    "fwd TFLOP/s": x.get("forward_tflops"),
                    "bwd (ms)": x.get("backward_ms_median"),
                    "fwd+bwd (ms)": x.get("forward_backward_ms_median"),
                    "fwd+bwd TFLOP/s": x.get("forward_backward_tflops"),
                    **(
                        {"fwd % of bf16 peak": (100 * x["forward_tflops"] / peak) if x.get("forward_tflops") else None}
                        if peak
                        else {}
                    ),
                }
                for x in side
            ]
        )
        out.append(md_table(table))
        sentences = []
        for d in sorted({x["head_dim"] for x in side}):
            at_d = {x["implementation"]: x for x in side if x["head_dim"] == d}
            ours_fwd = (at_d.get("flash_triton") or {}).get("forward_tflops")
            if ours_fwd is None:
                continue
            others = ", ".join(
                f"{impl} {fmt(x.get('forward_tflops'), 1)}"
                for impl, x in at_d.items()
                if impl != "flash_triton" and x.get("forward_tflops") is not None
            )
            sentences.append(
                f"d = {d}: our forward alone reaches {fmt(ours_fwd, 1)} TFLOP/s"
                + (
                    f" ({fmt(100 * ours_fwd / peak, 1)}% of the device's dense bf16 peak, {fmt(peak, 1)} TFLOP/s)"
                    if peak
                    else ""
                )
                + (f" against {others} TFLOP/s" if others else "")
                + "."
            )
        out.append(" ".join(sentences) + "\n")
    return "\n".join(out)


# --- figures ----------------------------------------------------------------------------------------

STYLE = {"plain": "C0", "flash_triton": "C3"}
PLAIN_NUMBERS = FuncFormatter(lambda y, _: f"{y:g}")


def _panel_title(sub: pd.DataFrame, precision: str, d: int) -> str:
    backends = sub[sub.sdpa_backend.notna()].sdpa_backend.unique()
    return f"{'tf32 (TF32 products)' if precision == 'tf32' else precision}, d = {d}" + (
        f" (sdpa: {', '.join(backends)})" if len(backends) else ""
    )


def _color(impl: str, i: int) -> str:
    return STYLE.get(impl, f"C{1 + i % 3}" if i % 3 != 2 else "C4")


def figures(df: pd.DataFrame, figures_dir: Path) -> None:
    figures_dir = Path(figures_dir)
    speed_path, time_path = figures_dir / "flash_speedup.png", figures_dir / "flash_time.png"
    ok = df[df.status == "ok"] if not df.empty else df
    if ok.empty:
        for path in (speed_path, time_path):
            empty_figure(path, "no benchmark timings on this device\n(they need CUDA)")
        return
    precisions = sorted(df.precision.unique(), key=PRECISION_ORDER.get)
    head_dims = sorted(df.head_dim.unique())
    impls = list(dict.fromkeys(df.implementation))

    fig, axes = figure(len(precisions), len(head_dims), sharex=True)
    for i, precision in enumerate(precisions):
        for j, d in enumerate(head_dims):
            ax = axes[i][j]
            sub = df[(df.precision == precision) & (df.head_dim == d)]
            oom = sub[(sub.implementation == "plain") & (sub.status == "oom")].sequence_length
            if not oom.empty:
                ax.axvspan(
                    oom.min() / 1.3,
                    sub.sequence_length.max() * 1.3,
                    color="0.9",
                    label="plain OOM" if (i, j) == (0, 0) else None,
                )
            for k, impl in enumerate(impls):
                if impl == "plain":
                    continue
                g = sub[sub.implementation == impl].dropna(subset=["speedup_vs_plain_forward_backward"])
                if g.empty:
                    continue
                ax.plot(
                    g.sequence_length,
                    g.speedup_vs_plain_forward_backward,
                    "o-",
                    ms=3,
                    color=_color(impl, k),
                    label=f"{impl} fwd+bwd" if (i, j) == (0, 0) else None,
                )
                ax.plot(
                    g.sequence_length,
                    g.speedup_vs_plain_forward,
                    "--",
                    color=_color(impl, k),
                    alpha=0.7,
                    label=f"{impl} fwd" if (i, j) == (0, 0) else None,
                )
            ax.axhline(1, color="0.5", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(PLAIN_NUMBERS)
            low, high = ax.get_ylim()
            # label the minor ticks only when the axis spans less than a decade or so
            ax.yaxis.set_minor_formatter(PLAIN_NUMBERS if high / low < 20 else NullFormatter())
            ax.set_title(_panel_title(sub, precision, d), fontsize=7)
            if j == 0:
                ax.set_ylabel("speed-up over plain (×)")
            if i == len(precisions) - 1:
                ax.set_xlabel("sequence length N")
    axes[0][0].legend(fontsize=5)
    save(fig, speed_path)

    fig, axes = figure(len(precisions), len(head_dims), sharex=True)
    for i, precision in enumerate(precisions):
        for j, d in enumerate(head_dims):
            ax = axes[i][j]
            sub = df[(df.precision == precision) & (df.head_dim == d)]
            top = sub.forward_backward_ms_median.max()
            for k, impl in enumerate(impls):
                g = sub[sub.implementation == impl]
                good = g.dropna(subset=["forward_backward_ms_median"])
                good = good[good.status == "ok"]
                ax.plot(
                    good.sequence_length,
                    good.forward_backward_ms_median,
                    "o-",
                    ms=3,
                    color=_color(impl, k),
                    label=impl if (i, j) == (0, 0) else None,
                )
                bad = g[g.status == "oom"]
                if not bad.empty and top and not pd.isna(top):
                    ax.plot(
                        bad.sequence_length,
                        [top * 2] * len(bad),
                        "x",
                        color=_color(impl, k),
                        label=f"{impl} OOM" if (i, j) == (0, 0) else None,
                    )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(_panel_title(sub, precision, d), fontsize=7)
            if j == 0:
                ax.set_ylabel("forward+backward (ms)")
            if i == len(precisions) - 1:
                ax.set_xlabel("sequence length N")
    axes[0][0].legend(fontsize=5)
    save(fig, time_path)


# --- main -------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", nargs="*", default=[])
    p.add_argument("--device", required=True)
    p.add_argument("--tables-dir", required=True)
    p.add_argument("--sections-dir", required=True)
    p.add_argument("--figures-dir", required=True)
    args = p.parse_args(argv)
    records = load(args.records)
    parts = split(records)
    tables = Path(args.tables_dir)
    tables.mkdir(parents=True, exist_ok=True)
    correctness = correctness_frame(parts["correctness"])
    bench = bench_frame(parts["benchmark"])
    correctness.to_csv(tables / "flash_correctness.csv", index=False)
    bench.to_csv(tables / "flash_benchmarking.csv", index=False)
    leaderboard_frame(parts["leaderboard"]).to_csv(tables / "flash_leaderboard.csv", index=False)

    sections = Path(args.sections_dir)
    fig = f"../results/{args.device}/figures"  # relative to report/, where the sections land
    for problem in ("flash_forward", "flash_backward"):
        text = section_correctness(problem, parts["correctness"], correctness, args.device)
        write_text(sections / f"{problem}.md", text + source_line(parts["correctness"], args.device))
    write_text(
        sections / "flash_benchmarking.md",
        section_benchmarking(parts["benchmark"], bench, args.device, fig)
        + source_line(parts["benchmark"], args.device),
    )
    write_text(
        sections / "leaderboard.md",
        section_leaderboard(parts["leaderboard"], args.device) + source_line(parts["leaderboard"], args.device),
    )
    figures(bench, Path(args.figures_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
