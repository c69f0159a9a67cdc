"""Words and number formats of the nsys report: what the profiled units are called on this device.

Under Nsight Systems on a GPU the units are CUDA kernels, launched inside NVTX ranges; under the
torch.profiler fallback on a CPU they are ATen operators (their self time), called inside profiler
ranges (``record_function``). Every sentence takes its nouns from ``Words`` so a CPU report never
speaks of kernels, NVTX or Nsight Systems. No torch here.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import pandas as pd

PROFILER_NAMES = {"nsys": "Nsight Systems", "torch.profiler": "torch.profiler"}


@dataclasses.dataclass(frozen=True)
class Words:
    """The nouns of one device's report."""

    profiler: str  # "Nsight Systems" | "torch.profiler"
    unit: str  # "GPU" | "CPU": whose time the kernel times are
    kernel: str  # "kernel" | "operator"
    launches: str  # "launches" | "calls"
    range: str  # "NVTX range" | "profiler range"

    @property
    def on_cpu(self) -> bool:
        return self.unit == "CPU"


def words_for(records: list[dict]) -> Words:
    """The words true of ``records``: CPU operators where every record ran on the CPU, else GPU kernels;
    the profiler the records name (Nsight Systems unless every record says torch.profiler)."""
    on_cpu = bool(records) and all(r["provenance"].get("device_slug") == "cpu" for r in records)
    profilers = {(r.get("metrics") or {}).get("profiler") for r in records} - {None}
    profiler = "torch.profiler" if profilers == {"torch.profiler"} else "Nsight Systems"
    if on_cpu:
        return Words(profiler, "CPU", "operator", "calls", "profiler range")
    range_word = "profiler range" if profiler == "torch.profiler" else "NVTX range"
    return Words(profiler, "GPU", "kernel", "launches", range_word)


def missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt(x, digits: int = 2) -> str:
    """A number for prose and tables: '—' for missing, whole numbers as they are, no decimals from 100 up."""
    if missing(x):
        return "—"
    if isinstance(x, str):
        return x
    if isinstance(x, int):
        return str(x)
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def pct(x, digits: int = 1) -> str:
    """A share as a percentage ('—' for missing)."""
    return "—" if missing(x) else f"{100 * x:.{digits}f}%"


def plural(count: int, noun: str, suffix: str = "s") -> str:
    """'1 cell', '3 cells'."""
    return f"{count} {noun}" + ("" if count == 1 else suffix)


@dataclasses.dataclass(frozen=True)
class Spread:
    """The median of some cells' values and their range (n = 0: no values)."""

    median: float | None
    low: float | None
    high: float | None
    n: int

    def text(self, scale: float = 1.0, unit: str = "", digits: int = 2) -> str:
        """'1.27× (1.10–1.77×)', or the value alone for one cell or equal ends."""
        if not self.n:
            return "—"
        mid, lo, hi = (fmt(v * scale, digits) for v in (self.median, self.low, self.high))
        if self.n == 1 or lo == hi:
            return f"{mid}{unit}"
        return f"{mid}{unit} ({lo}–{hi}{unit})"

    def pct(self) -> str:
        """The spread of shares as percentages: '79.9% (63.2–92.0%)'."""
        return self.text(scale=100, unit="%", digits=1)


def spread(values) -> Spread:
    """The median and range of the non-missing ``values``."""
    vals = [float(v) for v in values if not missing(v)]
    if not vals:
        return Spread(None, None, None, 0)
    return Spread(statistics.median(vals), min(vals), max(vals), len(vals))


def _cell(v) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return "—" if v is None else str(v)
    return str(v) if isinstance(v, int) else fmt(v)


def _numeric(values) -> bool:
    present = [v for v in values if not missing(v)]
    return bool(present) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present)


def md_table(df: pd.DataFrame) -> str:
    """A markdown table without padding: numbers through fmt() and right-aligned, '—' for missing."""
    if df.empty:
        return "_(no rows)_\n"
    columns = [df[c].tolist() for c in df.columns]
    align = ["---:" if _numeric(values) else ":---" for values in columns]
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "|".join(align) + "|"]
    for row in zip(*columns):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def blocks(*parts: str) -> str:
    """Markdown blocks separated by one blank line, ending in one newline; empty parts dropped."""
    return "\n\n".join(p.strip("\n") for p in parts if p and p.strip("\n")) + "\n"
