"""Report of the attention cells: pytorch_attention and torch_compile (a).

Writes a CSV of every cell, three figures (time and memory against sequence length per head
dimension, compiled over plain) and two fragments for report/answers.md. Every number comes
from the records; predictions come from lmperf.kinds.attention.memory_model.

    python -m lmperf.kinds.attention.report --device cpu --csv results/cpu/tables/attention.csv \
        --sections-dir results/cpu/sections --figures-dir results/cpu/figures \
        --records results/cpu/attention/*.json
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from lmperf.core.units import MIB
from lmperf.kinds.attention import memory_model as memory
from lmperf.kinds.flash.products import (
    PRODUCT_SENTENCES,
    PRODUCT_WORDS,
    SDPA_FP32_WHY,
    _impl_records,
    record_products,
    sdpa_backend,
    sdpa_products,
)
from lmperf.report.common import (
    blocks,
    empty_figure,
    figure,
    figures_link,
    fmt,
    lengths_text,
    load,
    md_table,
    pct,
    report_parser,
    save,
    source_line,
    write_csv,
    write_text,
)
from lmperf.report.devices import SAME  # speed-ups within it of 1 read as about as fast

ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
CELL_KEYS = ("implementation", "head_dim", "sequence_length", "batch_size", "precision")
SCALARS = (
    "forward_ms_mean",
    "forward_ms_std",
    "forward_n",
    "backward_ms_mean",
    "backward_ms_std",
    "backward_n",
    "memory_before_backward_mib",
    "retained_by_forward_mib",
    "retained_tensors_mib",
    "saved_tensors_mib",
    "forward_peak_extra_mib",
    "forward_backward_peak_extra_mib",
    "baseline_allocated_mib",
    "plain_predicted_retained_mib",
    "plain_predicted_before_backward_mib",
    "plain_predicted_forward_peak_extra_mib",
    "predicted_retained_mib",
    "predicted_before_backward_mib",
    "n2_matrix_mib",
    "device_total_memory_mib",
    "first_forward_ms",
    "first_backward_ms",
    "forward_tflops",
    "backward_tflops",
    "output_node",
    "check_output_max_abs_error",
    "check_grad_max_abs_error",
    "oom_phase",
    "oom_message",
    "oom_requested_mib",
    "oom_total_capacity_mib",
    "oom_free_mib",
    "oom_allocated_by_pytorch_mib",
    "oom_allocated_when_caught_mib",
    "cell_wall_s",
    "memory_unsupported_reason",
)
# Exponent fits use each (implementation, head dim)'s largest lengths that ran in full (status ok:
# no phase ran out of memory), where the N² term dominates the O(N) ones.
FIT_POINTS = 3
FUSED = memory.FUSED_IMPLEMENTATIONS


def frame(records: list[dict]) -> pd.DataFrame:
    """One row per record: the cell, its status and the scalar metrics; derived memory columns."""
    rows = []
    for r in records:
        m = r["metrics"]
        row = {k: r["cell"][k] for k in CELL_KEYS}
        row.update(status=r["status"], reason=r.get("reason"))
        row.update({k: m.get(k) for k in SCALARS})
        rows.append(row)
    df = pd.DataFrame(rows, columns=[*CELL_KEYS, "status", "reason", *SCALARS])
    if df.empty:
        return df
    # What the forward keeps for backward, measured: the CUDA allocator where there is one, else
    # the storages autograd saved plus the output (saved_tensors_hooks).
    cuda = df.retained_by_forward_mib.notna()
    df["retained_mib"] = df.retained_by_forward_mib.where(cuda, df.retained_tensors_mib)
    df["retained_source"] = ["torch.cuda.memory_allocated" if c else "saved_tensors_hooks" for c in cuda]
    element = df.precision.map(ELEMENT_BYTES)
    df["output_mib"] = df.batch_size * df.sequence_length * df.head_dim * element / MIB
    # How many (B, N, N) matrices the forward keeps beyond its output.
    df["n2_matrices_kept"] = (df.retained_mib - df.output_mib) / df.n2_matrix_mib
    return df.sort_values(["implementation", "head_dim", "sequence_length"]).reset_index(drop=True)


def implementations(df: pd.DataFrame) -> list[str]:
    """Implementations in a fixed order: plain, compiled, then the rest alphabetically."""
    names = list(dict.fromkeys(df.implementation)) if not df.empty else []
    first = [n for n in ("plain", "compiled") if n in names]
    return first + sorted(n for n in names if n not in first)


def _cell_time(row, phase: str) -> str:
    mean = row[f"{phase}_ms_mean"]
    if mean is None or pd.isna(mean):
        return f"OOM ({row['oom_phase']})" if row["status"] == "oom" else "—"
    return f"{fmt(mean, 3)} ± {fmt(row[f'{phase}_ms_std'], 3)}"


def _passes(row) -> str:
    f, b = row["forward_n"], row["backward_n"]
    return "/".join("—" if v is None or pd.isna(v) else str(int(v)) for v in (f, b))


def _mib(x) -> str:
    """MiB for a table: three significant digits for small values, none lost to rounding."""
    if x is None or pd.isna(x):
        return "—"
    return fmt(float(x), 1) if abs(x) >= 10 else f"{float(x):.3g}"


def human_bytes(nbytes: float) -> str:
    """'32.0 GiB', '2.00 MiB', '8.0 KiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            value = nbytes / scale
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"
    return f"{nbytes:.0f} B"


def implementation_table(df: pd.DataFrame, implementation: str) -> pd.DataFrame:
    sub = df[df.implementation == implementation]
    return pd.DataFrame(
        {
            "d": sub.head_dim,
            "N": sub.sequence_length,
            "forward (ms/pass)": [_cell_time(r, "forward") for r in sub.to_dict("records")],
            "backward (ms/pass)": [_cell_time(r, "backward") for r in sub.to_dict("records")],
            "passes fwd/bwd": [_passes(r) for r in sub.to_dict("records")],
            "memory before backward (MiB)": [_mib(v) for v in sub.memory_before_backward_mib],
            "kept by forward, measured (MiB)": [_mib(v) for v in sub.retained_mib],
            "kept, predicted (MiB)": [_mib(v) for v in sub.predicted_retained_mib],
        }
    )


# The head dimension "barely matters" to what is kept when the largest keeps under this many times
# what the smallest keeps.
HEAD_DIM_MATTERS = 1.5
# The allocator's "kept by forward" and autograd's saved tensors plus the output (hooks) are two
# measurements of one thing; a cell where they differ by more than this share is explained.
KEPT_MISMATCH_SHARE = 0.05


def kept_mismatch_note(df: pd.DataFrame, implementation: str) -> str:
    """Cells whose allocator difference disagrees with the saved tensors the hooks saw, and why."""
    sub = df[
        (df.implementation == implementation) & df.retained_by_forward_mib.notna() & df.retained_tensors_mib.notna()
    ]
    notes = []
    for r in sub.to_dict("records"):
        hooks, alloc = r["retained_tensors_mib"], r["retained_by_forward_mib"]
        if hooks <= 0 or abs(alloc - hooks) <= KEPT_MISMATCH_SHARE * hooks:
            continue
        peak = r.get("forward_peak_extra_mib")
        freed = hooks - alloc
        notes.append(
            f"d = {r['head_dim']}, N = {r['sequence_length']}: the allocator's difference reads {_mib(alloc)} MiB, yet "
            f"autograd's hooks saw {_mib(hooks)} MiB saved (with the output) and the forward's peak rose "
            f"{_mib(peak)} MiB above the baseline of {_mib(r.get('baseline_allocated_mib'))} MiB: a {_mib(freed)} MiB "
            "buffer live at the baseline (left from the passes before) was freed during the memory pass, so the "
            "difference undercounts; the hooks' figure is what the forward keeps"
        )
    if not notes:
        return ""
    return (
        f"Where the two measurements of what the forward keeps differ by more than "
        f"{pct(KEPT_MISMATCH_SHARE, 0)} (`KEPT_MISMATCH_SHARE`): " + "; ".join(notes) + "."
    )


def boundary(df: pd.DataFrame, implementation: str) -> list[dict]:
    """Per head dim: the largest length that ran in full and the smallest that ran out of memory."""
    out = []
    sub = df[df.implementation == implementation]
    for d, group in sub.groupby("head_dim"):
        ok = group[group.status == "ok"].sequence_length
        oom = group[group.status == "oom"]
        first_oom = oom.loc[oom.sequence_length.idxmin()] if not oom.empty else None
        out.append(
            {
                "head_dim": int(d),
                "largest_ok": int(ok.max()) if not ok.empty else None,
                "smallest_oom": int(first_oom.sequence_length) if first_oom is not None else None,
                "oom_phase": first_oom.oom_phase if first_oom is not None else None,
            }
        )
    return out


def _join_lengths(items: list[dict], key: str) -> str:
    groups: dict = {}
    for item in items:
        groups.setdefault(item[key], []).append(item["head_dim"])
    return "; ".join(f"N = {n} for d = {', '.join(map(str, ds))}" for n, ds in groups.items())


def unsupported_reason(df: pd.DataFrame, implementation: str) -> str | None:
    """The reason, where every record of an implementation says it cannot run here; else None."""
    sub = df[df.implementation == implementation]
    if sub.empty or not (sub.status == "unsupported").all():
        return None
    return sub.reason.iloc[0]


def planned_cells(df: pd.DataFrame, implementation: str, records: list[dict] | None = None) -> set[tuple[int, int]]:
    """The (head dim, N) cells an implementation was asked for: its records' settings grid where they
    name one, and every head dim × length that any implementation has a record of."""
    cells = {(int(d), int(n)) for d in df.head_dim.unique() for n in df.sequence_length.unique()}
    for r in _impl_records(records or [], implementation):
        s = r["provenance"].get("settings") or {}
        if s.get("head_dims") and s.get("sequence_lengths"):
            cells |= {(int(d), int(n)) for d in s["head_dims"] for n in s["sequence_lengths"]}
    return cells


def missing_cells(df: pd.DataFrame, implementation: str, records: list[dict] | None = None) -> dict[int, list[int]]:
    """Per head dim, the planned lengths with no record of `implementation` (not measured yet)."""
    sub = df[df.implementation == implementation]
    have = {(int(d), int(n)) for d, n in zip(sub.head_dim, sub.sequence_length)}
    out: dict[int, list[int]] = {}
    for d, n in sorted(planned_cells(df, implementation, records) - have):
        out.setdefault(d, []).append(n)
    return out


def _missing_text(missing: dict[int, list[int]]) -> str:
    return "; ".join(f"d = {d}, {lengths_text(ns)}" for d, ns in missing.items())


def not_measured_sentence(df: pd.DataFrame, implementation: str, records: list[dict] | None = None) -> str:
    missing = missing_cells(df, implementation, records)
    return f"No record yet (not measured): {_missing_text(missing)}." if missing else ""


def boundary_sentences(df: pd.DataFrame, device: str, records: list[dict] | None = None) -> str:
    """Per implementation: where it ran out of memory (records with status oom only), how far each head
    dimension ran in full, and which cells have no record (not measured, never counted as out of memory)."""
    sentences = []
    for impl in implementations(df):
        if unsupported_reason(df, impl) is not None:
            precisions = ", ".join(sorted(df[df.implementation == impl].precision.unique()))
            sentences.append(
                f"`{impl}` did not run in this sweep's {precisions} on this device (unsupported: "
                f"{unsupported_reason(df, impl).splitlines()[0]})."
            )
            continue
        b = boundary(df, impl)
        missing = missing_cells(df, impl, records)
        ooms = [x for x in b if x["smallest_oom"] is not None]
        no_oom = [x for x in b if x["smallest_oom"] is None and x["largest_ok"] is not None]
        every_dim = sorted(int(d) for d in df.head_dim.unique())
        if not ooms:
            reach = {x["largest_ok"] for x in no_oom}
            if not missing and len(reach) == 1 and [x["head_dim"] for x in no_oom] == every_dim:
                sentences.append(
                    f"`{impl}` never ran out of memory, up to N = {reach.pop()} at every head dimension "
                    f"(d = {', '.join(map(str, every_dim))})."
                )
            elif no_oom:
                sentences.append(
                    f"`{impl}` never ran out of memory where it was measured: it ran in full up to "
                    f"{_join_lengths(no_oom, 'largest_ok')}."
                )
        else:
            phases = sorted({x["oom_phase"] for x in ooms})
            fits = [x for x in ooms if x["largest_ok"] is not None]
            sentences.append(
                f"`{impl}` runs out of memory first at {_join_lengths(ooms, 'smallest_oom')} (in the "
                f"{' / '.join(phases)})"
                + (f"; the largest length that runs in full is {_join_lengths(fits, 'largest_ok')}" if fits else "")
                + (f"; it did not run out of memory up to {_join_lengths(no_oom, 'largest_ok')}" if no_oom else "")
                + "."
            )
        sub = df[(df.implementation == impl) & ~df.status.isin(["ok", "oom", "unsupported"])]
        if not sub.empty:
            sentences.append(
                f"`{impl}` also has "
                + "; ".join(f"d = {r.head_dim}, N = {r.sequence_length}: {r.status}" for r in sub.itertuples())
                + " (not out of memory)."
            )
        if missing:
            sentences.append(
                f"`{impl}` has no record yet at {_missing_text(missing)} (not measured, so not counted as out "
                "of memory)."
            )
    if not sentences:
        return "_No attention records on this device._"
    return " ".join(sentences)


def oom_accounting(df: pd.DataFrame) -> str:
    """The accounting that explains plain attention's smallest out-of-memory cell."""
    plain = df[df.implementation == "plain"]
    oom = plain[plain.status == "oom"]
    out = ["### Accounting for the smallest cell that runs out of memory"]
    if oom.empty:
        largest = plain.sort_values(["sequence_length", "head_dim"]).iloc[-1] if not plain.empty else None
        if largest is None:
            return "\n".join(out + ["_No plain-attention records on this device._"]) + "\n"
        shape = memory.Shape(
            int(largest.batch_size),
            int(largest.sequence_length),
            int(largest.head_dim),
            ELEMENT_BYTES[largest.precision],
        )
        acc = memory.plain_accounting(shape)
        out.append(
            f"No plain cell ran out of memory on this device. For scale, the largest cell (d = {shape.head_dim}, "
            f"N = {shape.seq_len}) needs {human_bytes(acc.forward_peak_bytes)} at the forward's peak "
            f"and keeps {human_bytes(acc.before_backward_bytes)} in use before backward, by the accounting "
            "below (Q, K, V and dO included).\n"
        )
        out.append(_steps_table(shape, None))
        return "\n".join(out) + "\n"
    cell = oom.sort_values(["sequence_length", "head_dim"]).iloc[0]
    shape = memory.Shape(
        int(cell.batch_size), int(cell.sequence_length), int(cell.head_dim), ELEMENT_BYTES[cell.precision]
    )
    acc = memory.plain_accounting(shape)
    total = cell.device_total_memory_mib
    capacity = total * MIB if total is not None and not pd.isna(total) else None
    base = acc.inputs_bytes + acc.grad_output_bytes
    out.append(
        f"Plain attention, d = {shape.head_dim}, N = {shape.seq_len}, batch {shape.batch} "
        f"({cell.precision}): Q, K, V and the output gradient dO take {human_bytes(base)}; one N×N "
        f"score matrix (B·N²·{shape.element_bytes} bytes) takes {human_bytes(shape.matrix_bytes)}. "
        + (
            f"The card holds {human_bytes(capacity)} in total (`torch.cuda.get_device_properties`, from the record)."
            if capacity
            else "The record holds no device memory total."
        )
        + "\n"
    )
    out.append(_steps_table(shape, capacity))
    sentences = [
        f"The forward needs {human_bytes(acc.forward_peak_bytes)} at its peak (four N×N "
        f"matrices live at once, step P) and keeps {human_bytes(acc.before_backward_bytes)} in use "
        f"until backward (S, E, P: {acc.n2_matrices_saved} matrices)."
    ]
    if capacity is not None:
        fail = memory.first_failure(memory.plain_forward_steps(shape), base, int(capacity))
        if fail is not None:
            sentences.append(
                f"Predicted: the first allocation that cannot fit is {fail.step.tensor} = {fail.step.what} "
                f"({human_bytes(fail.step.nbytes)} requested with {human_bytes(fail.live_before)} already live: "
                f"{human_bytes(fail.live_peak)} > {human_bytes(capacity)})."
            )
        else:
            sentences.append(
                "Predicted: the whole forward fits on the card; the backward's temporaries "
                "(gradients of the N×N matrices) come on top of the "
                f"{human_bytes(acc.before_backward_bytes)} in use before backward."
            )
    measured = [f"Measured: out of memory in the {cell.oom_phase}"]
    if cell.oom_requested_mib is not None and not pd.isna(cell.oom_requested_mib):
        measured.append(f"the failing allocation asked for {human_bytes(cell.oom_requested_mib * MIB)}")
    if cell.oom_allocated_by_pytorch_mib is not None and not pd.isna(cell.oom_allocated_by_pytorch_mib):
        measured.append(f"with {human_bytes(cell.oom_allocated_by_pytorch_mib * MIB)} allocated by PyTorch")
    reserved = reserved_unallocated_mib(cell.oom_message)
    if reserved is not None:
        measured.append(
            f"{reserved / 1024:.2f} GiB reserved by PyTorch but unallocated (cached blocks freed "
            f"earlier, none large enough for the {cell.oom_requested_mib / 1024:.2f} GiB request)"
        )
    if cell.oom_free_mib is not None and not pd.isna(cell.oom_free_mib):
        measured.append(f"{human_bytes(cell.oom_free_mib * MIB)} free on the device")
    sentences.append(", ".join(measured) + " (from the allocator's error message in the record).")
    if reserved is not None and cell.oom_allocated_by_pytorch_mib is not None and capacity:
        held = cell.oom_allocated_by_pytorch_mib + reserved
        sentences.append(
            f"Allocated plus reserved-but-unallocated is {human_bytes(held * MIB)} of the card's "
            f"{human_bytes(capacity)}: the request fitted neither the cache nor the "
            f"{human_bytes((cell.oom_free_mib or 0) * MIB)} left on the device."
        )
    out.append(" ".join(sentences))
    return "\n".join(out) + "\n"


def products_paragraph(records: list[dict], implementation: str) -> tuple[str, str] | None:
    """(heading suffix, paragraph) saying what our kernels' (or an SDPA backend's) fp32 rows multiplied in,
    from the records; None for implementations whose matmuls follow PyTorch's matmul settings."""
    sdpa = sdpa_products(records, implementation)
    if sdpa:
        backend = sdpa_backend(records, implementation)
        pinned = any(
            (r["provenance"].get("settings") or {}).get("sdpa_backend") for r in _impl_records(records, implementation)
        )
        how = f"`{implementation}` ran on SDPA's {backend} backend" + (
            ""
            if pinned
            else " (the only one of the fused backends allowed, `sdpa_backends` in the records' settings, "
            "that takes fp32 here: the flash backend takes only fp16/bf16, and cuDNN's refused fp32, see "
            "`sdpa_cudnn`)"
        )
        return (
            f"fp32 inputs, {PRODUCT_WORDS.get(sdpa, sdpa + ' products')}",
            f"{how}; {SDPA_FP32_WHY}, so these rows are fp32-accurate, not IEEE float32 arithmetic.\n",
        )
    if not implementation.startswith("flash"):
        return None
    found = [p for p in map(record_products, _impl_records(records, implementation)) if p]
    if not found:
        return None
    plain_tf32 = any(
        r["provenance"].get("matmul_allow_tf32") for r in _impl_records(records, "plain") if r["status"] == "ok"
    )
    plain = (
        "plain attention's matmuls ran with TF32 allowed (`matmul_allow_tf32` in their provenance)"
        if plain_tf32
        else "plain attention's matmuls ran in fp32"
    )
    labels = sorted({label for label, _ in found})
    sources = "; ".join(sorted({src for _, src in found}))
    if len(labels) == 1:
        label = labels[0]
        what = PRODUCT_SENTENCES.get(label, f"{label} products")
        text = f"Our Triton kernels' `tl.dot` multiplied these fp32 inputs with {what} ({sources}); {plain}.\n"
        return f"fp32 inputs, {PRODUCT_WORDS.get(label, label + ' products')}", text
    counts = ", ".join(f"{label} in {sum(1 for x, _ in found if x == label)}" for label in labels)
    text = (
        f"The records differ in what our Triton kernels' `tl.dot` multiplied fp32 inputs in: {counts} "
        f"records ({sources}); {plain}.\n"
    )
    return f"fp32 inputs, {' or '.join(labels)} products by record", text


def reserved_unallocated_mib(message) -> float | None:
    """'31.97 GiB is reserved by PyTorch but unallocated' from a CUDA out-of-memory message, in MiB."""
    if not isinstance(message, str):
        return None
    match = re.search(r"([\d.]+) (GiB|MiB|KiB) is reserved by PyTorch but unallocated", message)
    if match is None:
        return None
    return float(match.group(1)) * {"GiB": 1024, "MiB": 1, "KiB": 1 / 1024}[match.group(2)]


def _steps_table(shape: memory.Shape, capacity: float | None) -> str:
    acc = memory.plain_accounting(shape)
    base = acc.inputs_bytes + acc.grad_output_bytes
    rows = []
    for point in memory.timeline(memory.plain_forward_steps(shape), base):
        row = {
            "step": point.step.tensor,
            "what": point.step.what,
            "allocates": human_bytes(point.step.nbytes),
            "live once allocated": human_bytes(point.live_peak),
            "kept for backward": "yes" if point.step.saved else ("output" if point.step.tensor == "O" else "no"),
            "freed then": ", ".join(point.step.frees) or "",
        }
        if capacity is not None:
            row["fits the card"] = "yes" if point.live_peak <= capacity else "**no**"
        rows.append(row)
    return md_table(pd.DataFrame(rows))


def exponents(df: pd.DataFrame) -> pd.DataFrame:
    """Per (implementation, head dim): the exponent of kept memory against N over the FIT_POINTS largest
    lengths that ran in full (status ok); a cell that ran out of memory is left out even where its
    forward's kept memory was measured before (fit_left_out names those)."""
    rows = []
    for (impl, d), group in (
        df[df.status == "ok"].dropna(subset=["retained_mib"]).groupby(["implementation", "head_dim"])
    ):
        group = group.sort_values("sequence_length").tail(FIT_POINTS)
        if len(group) < 2:
            continue
        rows.append(
            {
                "implementation": impl,
                "head_dim": int(d),
                "exponent": memory.fit_exponent(group.sequence_length, group.retained_mib),
                "n_from": int(group.sequence_length.min()),
                "n_to": int(group.sequence_length.max()),
                "n2_matrices_kept": group.n2_matrices_kept.iloc[-1],
                "kept_mib_at_n_to": group.retained_mib.iloc[-1],
                "plain_predicted_mib_at_n_to": group.plain_predicted_retained_mib.iloc[-1],
            }
        )
    return pd.DataFrame(rows)


def _head_dim_effect(df: pd.DataFrame, implementation: str) -> str:
    """How much the head dimension changes what is kept, at the largest length every head dim ran."""
    ok = df[(df.implementation == implementation) & (df.status == "ok")].dropna(subset=["retained_mib"])
    dims = sorted(ok.head_dim.unique())
    if len(dims) < 2:
        return ""
    common = [n for n, g in ok.groupby("sequence_length") if set(g.head_dim) == set(dims)]
    if not common:
        return ""
    at = ok[ok.sequence_length == max(common)].set_index("head_dim").retained_mib
    return (
        f" The head dimension barely matters (under {fmt(HEAD_DIM_MATTERS)}×, `HEAD_DIM_MATTERS`): at "
        f"N = {max(common)}, d = {dims[-1]} keeps {fmt(at[dims[-1]] / at[dims[0]])}× what d = {dims[0]} keeps "
        "(of what is kept, only the output O scales with d)."
        if at[dims[-1]] / at[dims[0]] < HEAD_DIM_MATTERS
        else f" At N = {max(common)}, d = {dims[-1]} keeps {fmt(at[dims[-1]] / at[dims[0]])}× what d = {dims[0]} keeps."
    )


def fit_range(sub: pd.DataFrame) -> str:
    """The lengths an implementation's fits used: one range where every head dim used the same,
    else one range per group of head dims (never a range that no single fit covered)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for r in sub.itertuples():
        groups.setdefault((int(r.n_from), int(r.n_to)), []).append(int(r.head_dim))
    if len(groups) == 1:
        (lo, hi), _ = groups.popitem()
        return f"{lo}–{hi}"
    return "; ".join(f"{lo}–{hi} (d = {', '.join(map(str, ds))})" for (lo, hi), ds in groups.items())


def fit_left_out(df: pd.DataFrame) -> str:
    """The cells whose forward's kept memory was measured but which did not run in full (out of memory
    later), so the exponent fits leave them out: '`compiled` at N = 32768 for d = 16, 32 (out of memory
    in the backward warm-up)'; '' where there are none."""
    sub = df[(df.status != "ok") & df.retained_mib.notna()] if not df.empty else df
    parts = []
    for impl in implementations(sub):
        groups: dict[tuple[int, str], list[int]] = {}
        for r in sub[sub.implementation == impl].itertuples():
            why = f"out of memory in the {r.oom_phase}" if r.status == "oom" and r.oom_phase else f"status {r.status}"
            groups.setdefault((int(r.sequence_length), why), []).append(int(r.head_dim))
        parts.append(
            f"`{impl}` at "
            + "; ".join(
                f"N = {n} for d = {', '.join(map(str, sorted(ds)))} ({why})" for (n, why), ds in sorted(groups.items())
            )
        )
    return "; ".join(parts)


def growth_section(df: pd.DataFrame) -> str:
    left_out = fit_left_out(df)
    out = [
        "### How the memory kept for backward grows with N",
        f"Exponent k of kept ∝ N^k, a least-squares fit in log-log over each implementation's {FIT_POINTS} "
        "largest lengths that ran in full (status `ok`: every phase ran without running out of memory), per head "
        "dimension"
        + (
            f"; left out although the forward's kept memory was measured before the cell failed: {left_out}"
            if left_out
            else ""
        )
        + "; N×N matrices kept = (kept − output) / (B·N²·bytes).\n",
    ]
    ex = exponents(df)
    if ex.empty:
        return "\n".join(out + ["_Too few lengths ran to fit an exponent._"]) + "\n"
    summary = []
    for impl in implementations(df):
        sub = ex[ex.implementation == impl]
        if sub.empty:
            continue
        summary.append(
            {
                "implementation": impl,
                "exponent (range over d)": f"{fmt(sub.exponent.min())}–{fmt(sub.exponent.max())}",
                "N×N matrices kept": fmt(sub.n2_matrices_kept.median(), 2),
                "fit over N": fit_range(sub),
            }
        )
    out.append(md_table(pd.DataFrame(summary)))
    sentences = []
    plain = ex[ex.implementation == "plain"]
    if not plain.empty:
        k = plain.exponent.median()
        sentences.append(
            f"Plain attention keeps {fmt(plain.n2_matrices_kept.median(), 2)} N×N matrices for backward (S, E and P "
            f"by the accounting: our softmax is written out as max, subtract, exp, sum, divide, and autograd saves "
            f"its input S for the max's backward, exp's output E and the probabilities P for the division's; "
            f"`torch.softmax` is one autograd node that saves only its output P, which is why write-ups that used "
            f"it measure 1 matrix), so what it keeps grows as N^{fmt(k)} (median over head dimensions): doubling "
            f"the sequence length multiplies it by {fmt(2**k)}." + _head_dim_effect(df, "plain")
        )
    comp = ex[ex.implementation == "compiled"]
    if not comp.empty:
        k = comp.exponent.median()
        sentences.append(
            f"`torch.compile` keeps {fmt(comp.n2_matrices_kept.median(), 2)} (the partitioner's choice; "
            f"exponent {fmt(k)})" + (": fewer matrices, the same quadratic growth." if k > 1.5 else ".")
        )
    for impl in [i for i in implementations(df) if i in FUSED or i.split("_")[-1] in FUSED]:
        sub = ex[ex.implementation == impl]
        if sub.empty:
            continue
        last = sub.loc[sub.n_to.idxmax()]
        sentences.append(
            f"`{impl}` keeps {fmt(sub.n2_matrices_kept.median(), 3)} N×N matrices: its exponent is "
            f"{fmt(sub.exponent.median())} (linear); at N = {last.n_to}, d = {last.head_dim} it keeps "
            f"{human_bytes(last.kept_mib_at_n_to * MIB)} where plain attention would keep "
            f"{human_bytes(last.plain_predicted_mib_at_n_to * MIB)}."
        )
    out.append(" ".join(sentences))
    out.append(
        "\n**What removes it.** The N×N matrices exist only because the unfused implementation writes scores and "
        "probabilities to memory and autograd keeps them for backward. A fused kernel (FlashAttention-2; PyTorch's "
        "`scaled_dot_product_attention` with its flash or memory-efficient backend) tiles Q, K and V, keeps a "
        "running max and sum per row on chip (online softmax), writes only O and one log-sum-exp L per row, and in "
        "backward recomputes each tile of P = exp(QKᵀ/√d − L) from Q, K and L instead of reading a stored one. "
        "Memory kept for backward drops from O(N²) to O(N·d), at the price of recomputing QKᵀ in backward. "
        "`torch.compile` alone cannot do this: it fuses the softmax's elementwise steps but still materialises "
        "the scores for the two matmuls."
    )
    return "\n".join(out) + "\n"


def longer(settings: dict) -> str:
    """'at lengths above N ' where the course's lengths run every pass, else ''."""
    up_to = settings.get("full_passes_up_to") or 0
    return (
        f"at lengths above {up_to:,} (beyond the course's grid, where only the memory boundary is sought) "
        if up_to
        else ""
    )


def method_section(records: list[dict], device: str) -> str:
    s = records[0]["provenance"]["settings"]
    cap = s.get("max_phase_seconds")
    capped = cap is not None and cap != float("inf")
    where = (
        "`torch.cuda.memory_allocated()` after a forward whose output is kept is the memory in use before "
        "backward; the memory kept by the forward is that minus what was allocated just before it"
        if device != "cpu"
        else "CUDA memory statistics do not exist here, so the memory kept by the forward is measured as the "
        "storages autograd saves (`saved_tensors_hooks`) plus the output"
    )
    return (
        f"Random Q, K, V of shape ({s['batch_size']}, N, d), {s['precision']}, no head dimension. Per cell, one "
        f"process per implementation: up to {s['warmup_passes']} warm-up passes, then up to {s['measured_passes']} "
        "forward passes timed one by one with `timeit.default_timer` and a synchronize before and after each; "
        f"{where}; then backward passes timed the same way, each re-running its forward outside the timed region "
        "(rather than `retain_graph`: a compiled backward may free or reuse the buffers it saved, so a second "
        "backward of the same graph is not the same computation). "
        + (
            f"To keep the grid within its {'GPU' if device != 'cpu' else 'CPU'} minutes a phase {longer(s)}stops "
            "early, after at least "
            f"{s['min_measured_passes']} passes, before it would exceed {fmt(cap, 1)} s: the passes column says how "
            "many ran. "
            if capped
            else ""
        )
        + (
            "An out-of-memory error inside backward can leave memory allocated that no cleanup frees "
            "(pytorch/pytorch#82218), so after a cell that leaves memory behind the process restarts for the "
            "remaining cells, and each cell starts on an empty card. "
            if device != "cpu"
            else ""
        )
        + "Times are per pass (mean ± standard deviation). Predicted memory: `lmperf.kinds.attention.memory_model`.\n"
    )


def section_pytorch_attention(df: pd.DataFrame, records: list[dict], device: str, fig: str) -> str:
    out = [method_section(records, device)]
    for impl in implementations(df):
        if impl == "compiled":
            continue  # torch_compile (a)
        title = "Plain (the course's) attention" if impl == "plain" else f"`{impl}`"
        reason = unsupported_reason(df, impl)
        if reason is not None:
            out.append(f"### {title}\n\nNot measured: every cell is unsupported here ({reason}).\n")
            continue
        products = products_paragraph(records, impl)
        out.append(f"### {title}" + (f" ({products[0]})" if products else "") + "\n")
        if products:
            out.append(products[1])
        out.append(md_table(implementation_table(df, impl)))
        unmeasured = not_measured_sentence(df, impl, records)
        if unmeasured:
            out.append(unmeasured + "\n")
        note = kept_mismatch_note(df, impl)
        if note:
            out.append(note + "\n")
    out.append("### Where memory runs out\n")
    out.append(boundary_sentences(df, device, records) + "\n")
    out.append(oom_accounting(df))
    out.append(growth_section(df))
    return blocks(
        "\n".join(out), f"![time against N]({fig}/attention_time.png) ![memory against N]({fig}/attention_memory.png)"
    )


def compile_table(df: pd.DataFrame) -> pd.DataFrame:
    keys = ["head_dim", "sequence_length"]
    both = df[df.implementation == "plain"].merge(
        df[df.implementation == "compiled"], on=keys, suffixes=("_plain", "_compiled")
    )
    if both.empty:
        return pd.DataFrame()
    return pd.DataFrame(
        {
            "d": both.head_dim.values,
            "N": both.sequence_length.values,
            "fwd plain (ms)": both.forward_ms_mean_plain.values,
            "fwd compiled (ms)": both.forward_ms_mean_compiled.values,
            "fwd speedup": (both.forward_ms_mean_plain / both.forward_ms_mean_compiled).values,
            "bwd plain (ms)": both.backward_ms_mean_plain.values,
            "bwd compiled (ms)": both.backward_ms_mean_compiled.values,
            "bwd speedup": (both.backward_ms_mean_plain / both.backward_ms_mean_compiled).values,
            "N×N kept plain": both.n2_matrices_kept_plain.values,
            "N×N kept compiled": both.n2_matrices_kept_compiled.values,
            "status plain": both.status_plain.values,
            "status compiled": both.status_compiled.values,
        }
    )


def _fails(b: dict) -> str:
    if b["smallest_oom"] is None:
        reach = f" up to N = {b['largest_ok']}" if b["largest_ok"] is not None else ""
        return f"never runs out of memory{reach}"
    return f"first fails at N = {b['smallest_oom']} ({b['oom_phase']})"


def oom_difference_sentence(plain_b: dict, comp_b: dict, dims: list[int]) -> str:
    """How plain's and compiled's out-of-memory boundaries differ, per group of head dims: the same
    length with a different phase is said to be the same length."""
    groups: dict[tuple, list[int]] = {}
    for d in sorted(dims):
        p, c = plain_b[d], comp_b[d]
        groups.setdefault(
            (p["smallest_oom"], p["oom_phase"], p["largest_ok"], c["smallest_oom"], c["oom_phase"], c["largest_ok"]), []
        ).append(d)
    parts = []
    for ds in groups.values():
        p, c = plain_b[ds[0]], comp_b[ds[0]]
        at = f"d = {', '.join(map(str, ds))}"
        if p["smallest_oom"] is not None and p["smallest_oom"] == c["smallest_oom"]:
            parts.append(
                f"at {at} both first fail at N = {p['smallest_oom']} (the same length), plain in the "
                f"{p['oom_phase']}, compiled in the {c['oom_phase']}"
            )
        else:
            parts.append(f"at {at} plain {_fails(p)}, compiled {_fails(c)}")
    same_n = all(plain_b[d]["smallest_oom"] == comp_b[d]["smallest_oom"] for d in dims)
    lead = (
        "They run out of memory at the same length, only in a different phase"
        if same_n
        else "They run out of memory differently"
    )
    return f"{lead}: " + "; ".join(parts) + "."


def section_torch_compile(df: pd.DataFrame, fig: str) -> str:
    out = [
        "### (a) Attention under `torch.compile`",
        "`compiled` is `torch.compile(plain_attention)` (settings in the records), timed exactly like plain; "
        "speedup = plain time / compiled time; status `oom` cells show what ran before memory ran out.\n",
    ]
    table = compile_table(df)
    if table.empty:
        return "\n".join(out + ["_No plain/compiled pairs on this device._"]) + "\n"
    shown = table.copy()
    for col in ("N×N kept plain", "N×N kept compiled"):
        shown[col] = [fmt(v, 2) if v is not None and not pd.isna(v) else "—" for v in shown[col]]
    out.append(md_table(shown))
    sentences = []
    for phase, col in (("forward", "fwd speedup"), ("backward", "bwd speedup")):
        s = table[col].dropna()
        if s.empty:
            continue
        faster, slower = int((s > 1 + SAME).sum()), table.loc[s[s < 1 - SAME].index]
        where = ", ".join(f"{r.d}/{r.N}" for r in slower.itertuples())
        sentences.append(
            f"Compiled {phase}: {fmt(s.min())}×–{fmt(s.max())}× plain's speed (median {fmt(s.median())}×) over "
            f"{len(s)} cells; faster in {faster}, slower in {len(slower)}"
            + (f" (d/N = {where})" if 0 < len(slower) <= 6 else "")
            + f", within {pct(SAME, 0)} of plain (`SAME`, about as fast) in {len(s) - faster - len(slower)}."
        )
    comp = df[df.implementation == "compiled"]
    first = comp.first_forward_ms.dropna()
    if not first.empty:
        sentences.append(
            f"The first compiled call took {fmt(first.max() / 1e3, 1)} s (tracing and compiling); "
            "it is warm-up, outside every timed pass."
        )
    kept = table[["N×N kept plain", "N×N kept compiled"]].dropna()
    if not kept.empty:
        sentences.append(
            f"Memory: compiled keeps {fmt(kept['N×N kept compiled'].median(), 2)} N×N matrices for "
            f"backward where plain keeps {fmt(kept['N×N kept plain'].median(), 2)}."
        )
    plain_b = {b["head_dim"]: b for b in boundary(df, "plain")}
    comp_b = {b["head_dim"]: b for b in boundary(df, "compiled")}
    differs = [
        d
        for d in plain_b
        if d in comp_b
        and (plain_b[d]["smallest_oom"], plain_b[d]["oom_phase"]) != (comp_b[d]["smallest_oom"], comp_b[d]["oom_phase"])
    ]
    if differs:
        sentences.append(oom_difference_sentence(plain_b, comp_b, differs))
    out.append(" ".join(sentences))
    return blocks("\n".join(out), f"![compiled over plain]({fig}/attention_compile.png)")


STYLE = {"plain": "C0", "compiled": "C1", "sdpa": "C2", "flash": "C3"}


def _color(impl: str, i: int) -> str:
    return STYLE.get(impl, f"C{4 + i % 6}")


def figures(df: pd.DataFrame, figures_dir: Path) -> None:
    impls = implementations(df)
    dims = sorted(df.head_dim.unique()) if not df.empty else []
    # Time against sequence length, one panel per head dimension.
    path = figures_dir / "attention_time.png"
    if df.empty or df.forward_ms_mean.dropna().empty:
        empty_figure(path, "no timed attention cells")
    else:
        fig, axes = figure(1, len(dims), sharey=True)
        for ax, d in zip(axes[0], dims):
            for i, impl in enumerate(impls):
                sub = df[(df.implementation == impl) & (df.head_dim == d)]
                for phase, style in (("forward", "-"), ("backward", "--")):
                    ok = sub.dropna(subset=[f"{phase}_ms_mean"])
                    ax.plot(
                        ok.sequence_length,
                        ok[f"{phase}_ms_mean"],
                        style,
                        marker="o",
                        ms=3,
                        color=_color(impl, i),
                        label=f"{impl} {phase}",
                    )
                oom = sub[sub.status == "oom"]
                if not oom.empty:
                    ax.plot(
                        oom.sequence_length,
                        [df.backward_ms_mean.max()] * len(oom),
                        "x",
                        color=_color(impl, i),
                        ms=8,
                        label=f"{impl} OOM",
                    )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"d = {d}")
            ax.set_xlabel("sequence length N")
        axes[0][0].set_ylabel("ms per pass")
        axes[0][-1].legend(fontsize=6)
        save(fig, path)
    # Memory kept for backward against sequence length, predictions as lines.
    path = figures_dir / "attention_memory.png"
    if df.empty or df.retained_mib.dropna().empty:
        empty_figure(path, "no attention memory measurements")
    else:
        fig, axes = figure(1, len(dims), sharey=True)
        lengths = sorted(df.sequence_length.unique())
        for ax, d in zip(axes[0], dims):
            row = df[df.head_dim == d].iloc[0]
            element = ELEMENT_BYTES[row.precision]
            shapes = [memory.Shape(int(row.batch_size), int(n), int(d), element) for n in lengths]
            ax.plot(
                lengths,
                [memory.plain_accounting(s).retained_bytes / MIB for s in shapes],
                "-",
                color="grey",
                lw=1,
                label="plain, predicted",
            )
            ax.plot(
                lengths,
                [memory.fused_accounting(s).retained_bytes / MIB for s in shapes],
                ":",
                color="grey",
                lw=1,
                label="fused, predicted",
            )
            for i, impl in enumerate(impls):
                sub = df[(df.implementation == impl) & (df.head_dim == d)].dropna(subset=["retained_mib"])
                ax.plot(
                    sub.sequence_length, sub.retained_mib, "o", ms=4, color=_color(impl, i), label=f"{impl}, measured"
                )
                # out of memory before the forward finished: marked on plain's prediction
                oom = df[
                    (df.implementation == impl) & (df.head_dim == d) & (df.status == "oom") & df.retained_mib.isna()
                ]
                if not oom.empty:
                    ax.plot(
                        oom.sequence_length,
                        oom.plain_predicted_retained_mib,
                        "x",
                        ms=8,
                        color=_color(impl, i),
                        label=f"{impl}, out of memory",
                    )
            total = df.device_total_memory_mib.dropna()
            if not total.empty:
                ax.axhline(total.iloc[0], color="red", lw=0.8, label="card total")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"d = {d}")
            ax.set_xlabel("sequence length N")
        axes[0][0].set_ylabel("MiB kept by forward for backward")
        axes[0][-1].legend(fontsize=6)
        save(fig, path)
    # Compiled over plain.
    path = figures_dir / "attention_compile.png"
    table = compile_table(df)
    if table.empty or table[["fwd speedup", "bwd speedup"]].dropna(how="all").empty:
        empty_figure(path, "no plain/compiled pairs")
    else:
        fig, axes = figure()
        ax = axes[0][0]
        for i, d in enumerate(sorted(table.d.unique())):
            sub = table[table.d == d]
            ax.plot(sub.N, sub["fwd speedup"], "-", marker="o", ms=3, color=f"C{i}", label=f"d={d} forward")
            ax.plot(sub.N, sub["bwd speedup"], "--", marker="s", ms=3, color=f"C{i}", label=f"d={d} backward")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("plain time / compiled time")
        ax.legend(fontsize=6)
        save(fig, path)


def main(argv=None) -> int:
    p = report_parser(__doc__.splitlines()[0])
    p.add_argument("--csv", required=True)
    args = p.parse_args(argv)
    records = load(args.records)
    df = frame(records)
    write_csv(df, args.csv)
    sections = Path(args.sections_dir)
    source = source_line(records, args.device, "attention")
    fig = figures_link(args.device)
    write_text(sections / "pytorch_attention.md", section_pytorch_attention(df, records, args.device, fig) + source)
    write_text(sections / "torch_compile_a.md", section_torch_compile(df, fig) + source)
    figures(df, Path(args.figures_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
