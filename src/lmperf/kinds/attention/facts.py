"""Facts of the attention report from records (no torch): one row per cell with derived memory, where each
implementation runs out of memory, plain attention's accounting, how what the forward keeps grows with
N, and compiled against plain (``stats.compare``; speed-up = plain / compiled).
"""

from __future__ import annotations

import dataclasses
import re
import statistics

import pandas as pd

from lmperf.core import stats
from lmperf.core.units import BYTES_PER_ELEMENT, MIB
from lmperf.kinds.attention import memory_model as memory

PHASES, SIDES = ("forward", "backward"), ("plain", "compiled")
FIT_POINTS = 3  # exponents are fitted over each head dim's largest lengths that ran in full: N² dominates there
ESTIMATE = (("", "median"), ("_low", "low"), ("_high", "high"))
NUMERIC = (
    *(f"{p}_ms{x}" for p in PHASES for x, _ in ESTIMATE),
    *("first_forward_ms", "retained_by_forward_mib", "retained_tensors_mib", "predicted_retained_mib"),
    *("predicted_before_backward_mib", "plain_predicted_retained_mib", "n2_matrix_mib", "device_total_memory_mib"),
    *("oom_requested_mib", "oom_allocated_by_pytorch_mib", "oom_free_mib"),
)
COLUMNS = ("implementation", "head_dim", "sequence_length", "batch_size", "precision", "status", "reason")
COLUMNS += ("oom_phase", "oom_message", *(f"{p}_est" for p in PHASES), *NUMERIC)


def _row(r: dict) -> dict:
    row = dict.fromkeys(COLUMNS) | {k: v for k, v in r["metrics"].items() if not isinstance(v, (list, dict))}
    row.update(r["cell"], status=r["status"], reason=r.get("reason"))  # the CSV keeps every scalar metric
    for phase in PHASES:
        est = row[f"{phase}_est"] = stats.metric(r, f"{phase}_ms_mean")  # the median over trials, if several
        row.update({f"{phase}_ms{x}": getattr(est, a) if est else None for x, a in ESTIMATE})
    return row


def frame(records: list[dict]) -> pd.DataFrame:
    """One row per record: its cell, status, time estimates, every scalar metric and derived memory."""
    df = pd.DataFrame([_row(r) for r in records]) if records else pd.DataFrame(columns=COLUMNS)
    df[list(NUMERIC)] = df[list(NUMERIC)].apply(pd.to_numeric, errors="coerce")
    vector_mib = df.batch_size * df.sequence_length * df.head_dim * df.precision.map(BYTES_PER_ELEMENT) / MIB
    df["kept_mib"] = df.retained_by_forward_mib.fillna(df.retained_tensors_mib)
    df["before_backward_mib"] = 4 * vector_mib + df.kept_mib
    df["n2_matrices_kept"] = (df.kept_mib - vector_mib) / df.n2_matrix_mib  # beyond the output O
    return df.sort_values(["implementation", "head_dim", "sequence_length"]).reset_index(drop=True)


def _value(x) -> float | None:
    return None if pd.isna(x) else float(x)


@dataclasses.dataclass(frozen=True)
class Boundary:
    """How far one implementation got at one head dimension (a missing record is the report header's
    to name: it is never counted as out of memory)."""

    head_dim: int
    largest_ok: int | None  # the largest length that ran in full
    smallest_oom: int | None  # the smallest length that ran out of memory
    oom_phase: str | None


def boundaries(df: pd.DataFrame, implementation: str) -> list[Boundary]:
    out = []
    for d, group in df[(df.implementation == implementation) & df.status.isin(["ok", "oom"])].groupby("head_dim"):
        ok, oom = group[group.status == "ok"].sequence_length, group[group.status == "oom"]
        first = (int(oom.sequence_length.iloc[0]), oom.oom_phase.iloc[0]) if len(oom) else (None, None)
        out.append(Boundary(int(d), int(ok.max()) if len(ok) else None, *first))
    return out


class OomAccounting:
    """Plain attention's smallest cell that ran out of memory (``ran_out``), else its largest cell (the
    frame's row ``c``): the prediction and, where it ran out, the allocator's numbers from the record (MiB)."""

    def __init__(self, c: pd.Series, ran_out: bool):
        self.precision, self.ran_out, self.oom_phase = c.precision, ran_out, c.oom_phase
        shape = memory.Shape(int(c.batch_size), int(c.sequence_length), int(c.head_dim), BYTES_PER_ELEMENT[c.precision])
        self.shape, self.predicted = shape, memory.plain_accounting(shape)
        self.capacity_mib = capacity = _value(c.device_total_memory_mib)
        steps, base = memory.plain_forward_steps(shape), self.predicted.inputs_bytes
        # the first allocation that cannot fit the card
        self.first_failure = memory.first_failure(steps, base, capacity * MIB) if capacity else None
        m = re.search(r"([\d.]+) (GiB|MiB|KiB|bytes) is reserved by PyTorch but unallocated", str(c.oom_message))
        reserved = m and float(m.group(1)) * {"GiB": 1024, "MiB": 1, "KiB": 1 / 1024, "bytes": 0}[m.group(2)]
        said = map(_value, (c.oom_requested_mib, c.oom_allocated_by_pytorch_mib, reserved, c.oom_free_mib))
        self.requested_mib, self.allocated_mib, self.reserved_unallocated_mib, self.free_mib = said


def oom_accounting(df: pd.DataFrame) -> OomAccounting | None:
    plain = df[(df.implementation == "plain") & df.status.isin(["ok", "oom"])]
    if plain.empty:
        return None
    ran_out = bool((plain.status == "oom").any())
    c = (plain[plain.status == "oom"] if ran_out else plain).sort_values(["sequence_length", "head_dim"])
    return OomAccounting(c.iloc[0 if ran_out else -1], ran_out)


class Growth:
    """How what one implementation's forward keeps grows with N: kept ∝ N^k, fitted per head dim over ``fits``
    (each head dim's largest lengths that ran in full)."""

    def __init__(self, implementation: str, fits: list[pd.DataFrame]):
        self.implementation = implementation
        self.exponents = tuple(memory.fit_exponent(g.sequence_length, g.kept_mib) for g in fits)  # one per head dim
        self.exponent = statistics.median(self.exponents)
        # median over head dims, at each fit's largest length
        self.n2_matrices_kept = statistics.median(float(g.n2_matrices_kept.iloc[-1]) for g in fits)
        last = max((g.iloc[-1] for g in fits), key=lambda r: r.sequence_length)
        self.largest_n, self.largest_n_head_dim = int(last.sequence_length), int(last.head_dim)
        self.kept_mib_at_largest = float(last.kept_mib)
        self.plain_predicted_mib_at_largest = _value(last.plain_predicted_retained_mib)


def growth(df: pd.DataFrame, implementation: str) -> Growth | None:
    ok = df[(df.implementation == implementation) & (df.status == "ok")].dropna(subset=["kept_mib"])
    fits = [g.sort_values("sequence_length").tail(FIT_POINTS) for _, g in ok.groupby("head_dim")]
    fits = [g for g in fits if g.sequence_length.nunique() >= 2]
    return Growth(implementation, fits) if fits else None


class AttentionFacts:
    """What the pytorch_attention answer says, all from the records."""

    def __init__(self, df: pd.DataFrame):
        impls = sorted(set(df.implementation), key=lambda i: (SIDES.index(i) if i in SIDES else len(SIDES), i))
        self.implementations = tuple(impls)  # plain, compiled, then the rest by name
        # implementation -> the reason's first line, where no record of it could run here
        reasons = {i: g.reason for i, g in df.groupby("implementation") if set(g.status) == {"unsupported"}}
        self.unsupported = {i: str(reasons[i].iloc[0]).splitlines()[0] for i in impls if i in reasons}
        self.boundaries = {i: boundaries(df, i) for i in impls if i not in self.unsupported}
        self.ran_out = any(b.smallest_oom for bs in self.boundaries.values() for b in bs)  # any cell of any of them
        ok = df[(df.implementation == "plain") & (df.status == "ok")].dropna(subset=["forward_ms", "backward_ms"])
        common = [n for n, g in ok.groupby("sequence_length") if set(g.head_dim) == set(ok.head_dim)]
        self.plain_times_at = max(common, default=None)  # the largest N every head dim of plain ran in full
        at = ok[ok.sequence_length == self.plain_times_at].sort_values("head_dim")
        # (d, forward Estimate, backward Estimate) at plain_times_at
        self.plain_times = tuple((int(r.head_dim), r.forward_est, r.backward_est) for r in at.itertuples())
        self.accounting = oom_accounting(df)
        self.growth = {i: g for i in impls if (g := growth(df, i)) is not None}
        both = df[df.predicted_retained_mib > 0].dropna(subset=["kept_mib"])
        # the largest relative error of the predicted kept memory (not compiled's)
        error = ((both.kept_mib - both.predicted_retained_mib).abs() / both.predicted_retained_mib).max()
        self.prediction_error = _value(error)

    @property
    def fused_growth(self) -> Growth | None:
        """The fused implementation that ran the longest length (ties: the first by name)."""
        fused = [g for name, g in self.growth.items() if name.split("_")[-1] in memory.FUSED_IMPLEMENTATIONS]
        return max(fused, key=lambda g: g.largest_n, default=None)


def compile_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (head dim, N) with both a plain and a compiled record: N×N matrices kept and statuses,
    then per phase times, the speed-up with its interval and the verdict."""
    keys = ["head_dim", "sequence_length"]
    plain, compiled = (df[df.implementation == i] for i in SIDES)
    both = plain.merge(compiled, on=keys, suffixes=("_plain", "_compiled"))
    out = both[keys].astype(int)
    for x, column in (("n2_kept", "n2_matrices_kept"), ("status", "status")):
        out[[f"{x}_{w}" for w in SIDES]] = both[[f"{column}_{w}" for w in SIDES]]
    for phase in PHASES:
        p, c = (list(both[f"{phase}_est_{w}"]) for w in SIDES)
        speeds = [stats.ratio(a, b) if a and b else stats.Estimate(None) for a, b in zip(p, c)]
        out[f"{phase}_plain_ms"], out[f"{phase}_compiled_ms"] = ([e and e.median for e in es] for es in (p, c))
        for x, a in ESTIMATE:
            out[f"{phase}_speedup{x}"] = [getattr(e, a) for e in speeds]
        out[f"{phase}_verdict"] = [stats.compare(b, a) if a and b else None for a, b in zip(p, c)]
    return out


class CompileFacts:
    """Compiled against plain (speed-up = plain / compiled) over the (d, N) cells with both records."""

    def __init__(self, df: pd.DataFrame):
        table = compile_frame(df)
        self.pairs = len(table)
        self.verdicts: dict = {}  # phase -> {"faster" | "slower" | "within noise": ((d, N), …)}, where it has speed-ups
        self.speedups: dict = {}  # phase -> (median, min, max) speed-up over its cells
        for phase in PHASES:
            sub = table.dropna(subset=[f"{phase}_speedup"])
            if not sub.empty:
                by = sub.groupby(f"{phase}_verdict")
                self.verdicts[phase] = {v: tuple(zip(g.head_dim, g.sequence_length)) for v, g in by}
                speed = sub[f"{phase}_speedup"].astype(float)
                self.speedups[phase] = (float(speed.median()), float(speed.min()), float(speed.max()))
        # the longest first compiled call (tracing and compiling)
        self.first_compile_s = _value(df[df.implementation == "compiled"].first_forward_ms.max() / 1e3)
        # N×N matrices kept as the growth table has them (at the largest N that ran in full); None where not fitted
        self.n2_kept_plain, self.n2_kept_compiled = (g and g.n2_matrices_kept for g in (growth(df, w) for w in SIDES))
