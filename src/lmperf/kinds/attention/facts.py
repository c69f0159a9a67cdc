"""Facts of the attention report, computed from records by pure functions (no torch).

``frame`` turns records into one row per cell with the derived memory columns; the dataclasses
below hold what the answers say: where each implementation runs out of memory, the accounting
of plain attention's smallest cell that runs out, how what the forward keeps grows with N.
The torch_compile (a) comparison lives in ``lmperf.kinds.attention.compiled``.

Memory before backward is counted from the cell's own baseline: its inputs Q, K, V and dO plus
what the forward keeps. The records' ``memory_before_backward_mib`` is everything the process
had allocated, including what it held before the cell (``baseline_allocated_mib`` minus the
cell's inputs: library workspaces and buffers of earlier cells, 0-64 MiB on the GPUs measured);
that part is kept apart as ``held_before_cell_mib``.
"""

from __future__ import annotations

import dataclasses
import re

import pandas as pd

from lmperf.core import stats
from lmperf.core.units import BYTES_PER_ELEMENT, MIB
from lmperf.kinds.attention import memory_model as memory

CELL_KEYS = ("implementation", "head_dim", "sequence_length", "batch_size", "precision")
PHASES = ("forward", "backward")
# the per-pass time each record reports for a phase (median over trials where it has trials)
TIME_METRIC = "{phase}_ms_mean"
# Exponent fits use each (implementation, head dim)'s largest lengths that ran in full (status ok),
# where the N² term dominates the O(N) ones.
FIT_POINTS = 3
# The allocator's "kept by forward" and autograd's saved tensors plus the output are two measurements
# of one thing; a cell where they differ by more than this share is named.
KEPT_MISMATCH_SHARE = 0.05
FUSED = memory.FUSED_IMPLEMENTATIONS
# copied from the records as they are (MiB unless named otherwise)
RECORD_COLUMNS = (
    "first_forward_ms",
    "first_backward_ms",
    "baseline_allocated_mib",
    "memory_before_backward_mib",
    "retained_by_forward_mib",
    "retained_tensors_mib",
    "forward_peak_extra_mib",
    "forward_backward_peak_extra_mib",
    "predicted_retained_mib",
    "predicted_before_backward_mib",
    "plain_predicted_retained_mib",
    "plain_predicted_before_backward_mib",
    "n2_matrix_mib",
    "device_total_memory_mib",
    "forward_tflops",
    "backward_tflops",
    "check_output_max_abs_error",
    "check_grad_max_abs_error",
    "oom_phase",
    "oom_message",
    "oom_requested_mib",
    "oom_allocated_by_pytorch_mib",
    "oom_free_mib",
)


def _time_columns(record: dict) -> dict:
    m = record["metrics"]
    row = {}
    for phase in PHASES:
        est = stats.metric(record, TIME_METRIC.format(phase=phase))
        row[f"{phase}_est"] = est
        row[f"{phase}_ms"] = est.median if est else None
        row[f"{phase}_ms_low"] = est.low if est else None
        row[f"{phase}_ms_high"] = est.high if est else None
        row[f"{phase}_unstable"] = bool(est and est.unstable)
        row[f"{phase}_passes"] = m.get(f"{phase}_n")
    return row


def reserved_unallocated_mib(message) -> float | None:
    """'31.97 GiB is reserved by PyTorch but unallocated' from a CUDA out-of-memory message, in MiB."""
    if not isinstance(message, str):
        return None
    match = re.search(r"([\d.]+) (GiB|MiB|KiB|bytes) is reserved by PyTorch but unallocated", message)
    if match is None:
        return None
    return float(match.group(1)) * {"GiB": 1024, "MiB": 1, "KiB": 1 / 1024, "bytes": 1 / MIB}[match.group(2)]


def frame(records: list[dict]) -> pd.DataFrame:
    """One row per record: its cell, status, time estimates and memory, with derived columns."""
    rows = []
    for r in records:
        row = {k: r["cell"][k] for k in CELL_KEYS}
        row.update(status=r["status"], reason=r.get("reason"), **_time_columns(r))
        row.update({k: r["metrics"].get(k) for k in RECORD_COLUMNS})
        rows.append(row)
    columns = [*CELL_KEYS, "status", "reason", *_time_columns({"metrics": {}}), *RECORD_COLUMNS]
    df = pd.DataFrame(rows, columns=columns)
    for col in RECORD_COLUMNS:
        if col not in ("oom_phase", "oom_message"):
            df[col] = pd.to_numeric(df[col], errors="coerce")
    element = df.precision.map(BYTES_PER_ELEMENT)
    vector_mib = df.batch_size * df.sequence_length * df.head_dim * element / MIB
    allocator = df.retained_by_forward_mib.notna()
    # what the forward keeps: the CUDA allocator where there is one, else autograd's saved tensors + O
    df["kept_mib"] = df.retained_by_forward_mib.where(allocator, df.retained_tensors_mib)
    df["kept_source"] = ["allocator" if a else "autograd hooks" for a in allocator]
    df["inputs_mib"] = 4 * vector_mib  # Q, K, V and dO, allocated before the forward
    df["before_backward_mib"] = df.inputs_mib + df.kept_mib
    df["held_before_cell_mib"] = df.baseline_allocated_mib - df.inputs_mib
    df["n2_matrices_kept"] = (df.kept_mib - vector_mib) / df.n2_matrix_mib  # beyond the output O
    df["oom_reserved_unallocated_mib"] = [reserved_unallocated_mib(m) for m in df.oom_message]
    return df.sort_values(["implementation", "head_dim", "sequence_length"]).reset_index(drop=True)


def implementations(df: pd.DataFrame, extra=()) -> list[str]:
    """Implementations in a fixed order: plain, compiled, then the rest alphabetically."""
    names = set(df.implementation) | set(extra)
    first = [n for n in ("plain", "compiled") if n in names]
    return first + sorted(names - set(first))


def unsupported_reason(df: pd.DataFrame, implementation: str) -> str | None:
    """The reason's first line, where every record of an implementation says it cannot run here."""
    sub = df[df.implementation == implementation]
    if sub.empty or not (sub.status == "unsupported").all():
        return None
    return str(sub.reason.iloc[0]).splitlines()[0]


def planned_cells(records: list[dict], grid: dict) -> set[tuple[int, int]]:
    """The (head dim, N) cells asked for: the grid's, else those the records' settings name."""
    if grid.get("head_dims") and grid.get("sequence_lengths"):
        return {(int(d), int(n)) for d in grid["head_dims"] for n in grid["sequence_lengths"]}
    cells = {(int(r["cell"]["head_dim"]), int(r["cell"]["sequence_length"])) for r in records}
    for r in records:
        s = r["provenance"].get("settings") or {}
        if s.get("head_dims") and s.get("sequence_lengths"):
            cells |= {(int(d), int(n)) for d in s["head_dims"] for n in s["sequence_lengths"]}
    return cells


@dataclasses.dataclass(frozen=True)
class Boundary:
    """How far one implementation got at one head dimension."""

    implementation: str
    head_dim: int
    largest_ok: int | None  # the largest length that ran in full
    smallest_oom: int | None  # the smallest length that ran out of memory
    oom_phase: str | None
    missing: tuple[int, ...] = ()  # planned lengths with no record (not measured, never counted as OOM)
    other: tuple[tuple[int, str], ...] = ()  # (length, status) of cells neither ok nor oom


def boundaries(df: pd.DataFrame, implementation: str, planned: set[tuple[int, int]]) -> list[Boundary]:
    sub = df[df.implementation == implementation]
    dims = sorted({d for d, _ in planned} | set(int(d) for d in sub.head_dim))
    out = []
    for d in dims:
        group = sub[sub.head_dim == d]
        ok = group[group.status == "ok"].sequence_length
        oom = group[group.status == "oom"].sort_values("sequence_length")
        have = set(int(n) for n in group.sequence_length)
        odd = group[~group.status.isin(["ok", "oom", "unsupported"])]
        out.append(
            Boundary(
                implementation,
                int(d),
                int(ok.max()) if not ok.empty else None,
                int(oom.sequence_length.iloc[0]) if not oom.empty else None,
                oom.oom_phase.iloc[0] if not oom.empty else None,
                tuple(sorted(n for dd, n in planned if dd == d and n not in have)),
                tuple((int(r.sequence_length), r.status) for r in odd.itertuples()),
            )
        )
    return out


@dataclasses.dataclass(frozen=True)
class OomAccounting:
    """Plain attention's smallest cell that ran out of memory (``ran_out``), else its largest cell:
    the accounting's prediction and, where it ran out, the allocator's numbers from the record."""

    shape: memory.Shape
    precision: str
    ran_out: bool
    capacity_mib: float | None
    predicted: memory.Accounting
    first_failure: memory.TimelinePoint | None
    oom_phase: str | None = None
    requested_mib: float | None = None
    allocated_mib: float | None = None
    reserved_unallocated_mib: float | None = None
    free_mib: float | None = None

    @property
    def base_bytes(self) -> int:
        """Q, K, V and dO: live before the forward starts."""
        return self.predicted.inputs_bytes + self.predicted.grad_output_bytes


def _value(x) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


def oom_accounting(df: pd.DataFrame) -> OomAccounting | None:
    plain = df[(df.implementation == "plain") & df.status.isin(["ok", "oom"])]
    if plain.empty:
        return None
    oom = plain[plain.status == "oom"]
    ran_out = not oom.empty
    cell = (oom if ran_out else plain).sort_values(["sequence_length", "head_dim"]).iloc[0 if ran_out else -1]
    shape = memory.Shape(
        int(cell.batch_size), int(cell.sequence_length), int(cell.head_dim), BYTES_PER_ELEMENT[cell.precision]
    )
    capacity = _value(cell.device_total_memory_mib)
    base = memory.plain_accounting(shape)
    fail = None
    if capacity is not None:
        fail = memory.first_failure(
            memory.plain_forward_steps(shape), base.inputs_bytes + base.grad_output_bytes, int(capacity * MIB)
        )
    return OomAccounting(
        shape,
        cell.precision,
        ran_out,
        capacity,
        base,
        fail,
        cell.oom_phase if ran_out else None,
        _value(cell.oom_requested_mib),
        _value(cell.oom_allocated_by_pytorch_mib),
        _value(cell.oom_reserved_unallocated_mib),
        _value(cell.oom_free_mib),
    )


@dataclasses.dataclass(frozen=True)
class Growth:
    """How what one implementation's forward keeps grows with N: kept ∝ N^k, fitted per head dim."""

    implementation: str
    exponents: tuple[float, ...]  # one per head dim
    n2_matrices_kept: float  # median over head dims, at each fit's largest length
    fit_ranges: tuple[tuple[int, int, tuple[int, ...]], ...]  # (N from, N to, head dims)
    largest_n: int
    largest_n_head_dim: int
    kept_mib_at_largest: float
    plain_predicted_mib_at_largest: float | None

    @property
    def exponent(self) -> float:
        return float(pd.Series(self.exponents).median())


def growth(df: pd.DataFrame, implementation: str) -> Growth | None:
    ok = df[(df.implementation == implementation) & (df.status == "ok")].dropna(subset=["kept_mib"])
    exps, n2, ranges, last = [], [], {}, None
    for d, group in ok.groupby("head_dim"):
        group = group.sort_values("sequence_length").tail(FIT_POINTS)
        if len(group) < 2:
            continue
        exps.append(memory.fit_exponent(group.sequence_length, group.kept_mib))
        n2.append(float(group.n2_matrices_kept.iloc[-1]))
        lo, hi = int(group.sequence_length.min()), int(group.sequence_length.max())
        ranges.setdefault((lo, hi), []).append(int(d))
        if last is None or hi > last.sequence_length:
            last = group.iloc[-1]
    if not exps:
        return None
    return Growth(
        implementation,
        tuple(exps),
        float(pd.Series(n2).median()),
        tuple((lo, hi, tuple(ds)) for (lo, hi), ds in ranges.items()),
        int(last.sequence_length),
        int(last.head_dim),
        float(last.kept_mib),
        _value(last.plain_predicted_retained_mib),
    )


def fit_left_out(df: pd.DataFrame) -> list[tuple[str, int, str, tuple[int, ...]]]:
    """Cells whose forward's kept memory was measured but which did not run in full, so the fits
    leave them out: (implementation, N, why, head dims)."""
    sub = df[(df.status != "ok") & df.kept_mib.notna()]
    groups: dict[tuple[str, int, str], list[int]] = {}
    for r in sub.itertuples():
        why = f"out of memory in the {r.oom_phase}" if r.status == "oom" and r.oom_phase else f"status {r.status}"
        groups.setdefault((r.implementation, int(r.sequence_length), why), []).append(int(r.head_dim))
    order = implementations(sub)
    return [
        (impl, n, why, tuple(sorted(ds)))
        for (impl, n, why), ds in sorted(groups.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1]))
    ]


def head_dim_ratio(df: pd.DataFrame, implementation: str) -> tuple[int, int, int, float] | None:
    """(N, smallest d, largest d, kept at the largest d / kept at the smallest) at the largest length
    every head dim ran in full; None with fewer than two head dims."""
    ok = df[(df.implementation == implementation) & (df.status == "ok")].dropna(subset=["kept_mib"])
    dims = sorted(ok.head_dim.unique())
    common = [n for n, g in ok.groupby("sequence_length") if set(g.head_dim) == set(dims)]
    if len(dims) < 2 or not common:
        return None
    at = ok[ok.sequence_length == max(common)].set_index("head_dim").kept_mib
    return int(max(common)), int(dims[0]), int(dims[-1]), float(at[dims[-1]] / at[dims[0]])


def prediction_error(df: pd.DataFrame) -> float | None:
    """The largest relative difference between measured and predicted kept memory over the cells
    that have both (plain and fused implementations; compiled has no prediction)."""
    both = df.dropna(subset=["kept_mib", "predicted_retained_mib"])
    both = both[both.predicted_retained_mib > 0]
    if both.empty:
        return None
    return float(((both.kept_mib - both.predicted_retained_mib).abs() / both.predicted_retained_mib).max())


def kept_mismatches(df: pd.DataFrame) -> list[tuple[str, int, int, float, float]]:
    """(implementation, d, N, allocator MiB, hooks MiB) where the two measurements of what the forward
    keeps differ by more than KEPT_MISMATCH_SHARE of the hooks' figure."""
    both = df.dropna(subset=["retained_by_forward_mib", "retained_tensors_mib"])
    out = []
    for r in both.itertuples():
        alloc, hooks = r.retained_by_forward_mib, r.retained_tensors_mib
        if hooks > 0 and abs(alloc - hooks) > KEPT_MISMATCH_SHARE * hooks:
            out.append((r.implementation, int(r.head_dim), int(r.sequence_length), float(alloc), float(hooks)))
    return out


def held_before_cell(df: pd.DataFrame) -> tuple[float, float] | None:
    """The least and most memory (MiB) the process held before a cell's inputs were allocated."""
    held = df.held_before_cell_mib.dropna()
    return (float(held.min()), float(held.max())) if not held.empty else None


@dataclasses.dataclass(frozen=True)
class AttentionFacts:
    """What the pytorch_attention answer says, all from the records."""

    device: str
    implementations: tuple[str, ...]
    unsupported: dict  # implementation -> reason
    boundaries: dict  # implementation -> list[Boundary]
    plain_times_at: int | None  # the largest length every head dim of plain ran in full
    plain_times: tuple  # (d, forward Estimate, backward Estimate) at plain_times_at
    accounting: OomAccounting | None
    growth: dict  # implementation -> Growth
    left_out: tuple
    head_dim_ratio: tuple[int, int, int, float] | None
    prediction_error: float | None
    mismatches: tuple
    held_before_cell: tuple[float, float] | None

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def fused_growth(self) -> Growth | None:
        """The fused implementation that ran the longest length (ties: the first by name)."""
        fused = [g for name, g in self.growth.items() if name in FUSED or name.split("_")[-1] in FUSED]
        return max(fused, key=lambda g: g.largest_n, default=None)


def plain_times(df: pd.DataFrame) -> tuple[int | None, tuple]:
    ok = df[(df.implementation == "plain") & (df.status == "ok")].dropna(subset=["forward_ms", "backward_ms"])
    dims = set(ok.head_dim)
    common = [n for n, g in ok.groupby("sequence_length") if set(g.head_dim) == dims]
    if not common:
        return None, ()
    at = ok[ok.sequence_length == max(common)].sort_values("head_dim")
    return int(max(common)), tuple((int(r.head_dim), r.forward_est, r.backward_est) for r in at.itertuples())


def attention_facts(df: pd.DataFrame, records: list[dict], grid: dict, device: str) -> AttentionFacts:
    impls = implementations(df, grid.get("implementations") or ())
    planned = planned_cells(records, grid)
    unsupported = {i: r for i in impls if (r := unsupported_reason(df, i)) is not None}
    at, times = plain_times(df)
    grown = {i: g for i in impls if (g := growth(df, i)) is not None}
    return AttentionFacts(
        device,
        tuple(impls),
        unsupported,
        {i: boundaries(df, i, planned) for i in impls if i not in unsupported},
        at,
        times,
        oom_accounting(df),
        grown,
        tuple(fit_left_out(df)),
        head_dim_ratio(df, "plain"),
        prediction_error(df),
        tuple(kept_mismatches(df)),
        held_before_cell(df),
    )
