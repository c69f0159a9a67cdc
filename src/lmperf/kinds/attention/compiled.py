"""torch_compile (a): compiled attention against plain, cell by cell, with verdicts from the noise.

A cell's verdict (compiled ``faster``, ``slower`` or ``within noise``) comes from
``lmperf.core.stats.compare`` on the two cells' estimates; speed-up = plain time / compiled time.
(The comparison of one device against another is ``across_devices``.)
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from lmperf.core import stats
from lmperf.kinds.attention.facts import PHASES, Boundary, boundaries, planned_cells


def compile_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (head dim, N) that both plain and compiled have a record of: times, speed-ups
    with their intervals, verdicts, N×N matrices kept and statuses."""
    keys = ["head_dim", "sequence_length"]
    both = df[df.implementation == "plain"].merge(
        df[df.implementation == "compiled"], on=keys, suffixes=("_plain", "_compiled")
    )
    rows = []
    for r in both.to_dict("records"):
        row = {"head_dim": int(r["head_dim"]), "sequence_length": int(r["sequence_length"])}
        for phase in PHASES:
            plain, comp = r[f"{phase}_est_plain"], r[f"{phase}_est_compiled"]
            speed = stats.ratio(plain, comp) if plain and comp else None
            row[f"{phase}_plain_ms"] = plain.median if plain else None
            row[f"{phase}_compiled_ms"] = comp.median if comp else None
            row[f"{phase}_speedup"] = speed.median if speed else None
            row[f"{phase}_speedup_low"] = speed.low if speed else None
            row[f"{phase}_speedup_high"] = speed.high if speed else None
            row[f"{phase}_verdict"] = stats.compare(comp, plain) if plain and comp else None
        row.update(
            n2_kept_plain=r["n2_matrices_kept_plain"],
            n2_kept_compiled=r["n2_matrices_kept_compiled"],
            status_plain=r["status_plain"],
            status_compiled=r["status_compiled"],
        )
        rows.append(row)
    columns = ["head_dim", "sequence_length"]
    for phase in PHASES:
        columns += [f"{phase}_{x}" for x in ("plain_ms", "compiled_ms", "speedup", "speedup_low", "speedup_high")]
        columns.append(f"{phase}_verdict")
    columns += ["n2_kept_plain", "n2_kept_compiled", "status_plain", "status_compiled"]
    return pd.DataFrame(rows, columns=columns)


@dataclasses.dataclass(frozen=True)
class PhaseComparison:
    """Compiled against plain in one phase, over the cells where both ran it."""

    phase: str
    cells: tuple[tuple[int, int], ...]  # (d, N) compared
    faster: tuple[tuple[int, int], ...]
    slower: tuple[tuple[int, int], ...]
    same: tuple[tuple[int, int], ...]  # within the noise
    speedup_median: float
    speedup_min: float
    speedup_max: float


def phase_comparison(table: pd.DataFrame, phase: str) -> PhaseComparison | None:
    sub = table.dropna(subset=[f"{phase}_speedup"])
    if sub.empty:
        return None

    def where(verdict: str) -> tuple:
        hit = sub[sub[f"{phase}_verdict"] == verdict]
        return tuple(zip(hit.head_dim.astype(int), hit.sequence_length.astype(int)))

    speed = sub[f"{phase}_speedup"].astype(float)
    return PhaseComparison(
        phase,
        tuple(zip(sub.head_dim.astype(int), sub.sequence_length.astype(int))),
        where("faster"),
        where("slower"),
        where("within noise"),
        float(speed.median()),
        float(speed.min()),
        float(speed.max()),
    )


@dataclasses.dataclass(frozen=True)
class CompileFacts:
    pairs: int  # (d, N) cells with both a plain and a compiled record
    forward: PhaseComparison | None
    backward: PhaseComparison | None
    first_compile_s: float | None  # the longest first compiled call (tracing and compiling)
    n2_kept_plain: float | None
    n2_kept_compiled: float | None
    oom_differs: tuple[tuple[Boundary, Boundary], ...]  # (plain, compiled) where the boundary differs

    @property
    def same_oom_length(self) -> bool:
        """Whether every differing boundary is only a different phase at the same length."""
        return all(p.smallest_oom == c.smallest_oom for p, c in self.oom_differs)


def compile_facts(df: pd.DataFrame, records: list[dict], grid: dict) -> CompileFacts:
    table = compile_frame(df)
    compiled = df[df.implementation == "compiled"]
    first = compiled.first_forward_ms.dropna()
    planned = planned_cells(records, grid)
    plain = {b.head_dim: b for b in boundaries(df, "plain", planned)}
    comp = {b.head_dim: b for b in boundaries(df, "compiled", planned)}
    differs = tuple(
        (plain[d], comp[d])
        for d in sorted(set(plain) & set(comp))
        if (plain[d].smallest_oom, plain[d].oom_phase) != (comp[d].smallest_oom, comp[d].oom_phase)
    )
    kept = table.dropna(subset=["n2_kept_plain", "n2_kept_compiled"])
    return CompileFacts(
        len(table),
        phase_comparison(table, "forward"),
        phase_comparison(table, "backward"),
        float(first.max()) / 1e3 if not first.empty else None,
        float(kept.n2_kept_plain.median()) if not kept.empty else None,
        float(kept.n2_kept_compiled.median()) if not kept.empty else None,
        differs if not compiled.empty else (),
    )
