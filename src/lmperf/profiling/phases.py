"""Kernels attributed to NVTX phases by time window, and per-phase summaries.

A profile here is a ``Trace``: kernels (GPU execution interval, and the CPU time of the API call
that launched them) and named ranges (CPU intervals, any thread). A kernel belongs to the
innermost range of a given family whose CPU interval contains its launch. This is the rule
for backward kernels, which the autograd engine launches from its own thread while the main
thread sits inside the ``backward`` range: filtering by thread would lose them, filtering by
the kernel's GPU start would misplace kernels still queued when a range closes.

Range names the cells push (see lmperf.kinds.nsys.cell): one range around each model's measured blocks,
``lmperf model=<size>`` (where one capture holds several sizes, as under the torch.profiler
fallback, each size reads its own slice of the trace: ``model_slice``); one range per measured block,
``lmperf ctx=<ctx> <mode>``; inside it one range per phase and step (``forward``,
``backward``, ``optimizer_step`` inside ``training_step``; ``inference_forward``); inside the
course's attention the three ranges of ``ATTENTION_RANGES``.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from dataclasses import dataclass, field

from lmperf.profiling import kernels as kn

MODES = ("inference", "training")
MODE_PHASES = {"inference": ("inference_forward",), "training": ("forward", "backward", "optimizer_step")}
# Unions of phases summarised as well: forward+backward for nsys_profile (b), the full step for (d).
COMBINED_PHASES = {
    "training": {
        "forward_backward": ("forward", "backward"),
        "training_step": ("forward", "backward", "optimizer_step"),
    }
}
PHASE_NAMES = frozenset(p for phases in MODE_PHASES.values() for p in phases)
ATTENTION_RANGES = ("computing attention scores", "computing softmax", "final matmul")
FORWARD_PHASE = {"inference": "inference_forward", "training": "forward"}
_CELL_RANGE = re.compile(r"^lmperf ctx=(\d+) (inference|training)$")
_MODEL_RANGE = re.compile(r"^lmperf model=(\S+)$")


def cell_range_name(context_length: int, mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    return f"lmperf ctx={context_length} {mode}"


def parse_cell_range(name: str) -> tuple[int, str] | None:
    m = _CELL_RANGE.match(name)
    return (int(m.group(1)), m.group(2)) if m else None


def model_range_name(model: str) -> str:
    if not model or any(c.isspace() for c in model):
        raise ValueError(f"a model's range needs a name without spaces, not {model!r}")
    return f"lmperf model={model}"


def parse_model_range(name: str) -> str | None:
    m = _MODEL_RANGE.match(name)
    return m.group(1) if m else None


@dataclass(frozen=True)
class Kernel:
    name: str  # full (demangled) name
    start_ns: int  # GPU execution
    end_ns: int
    launch_ns: int  # CPU start of the launching API call (GPU start where unknown)
    short_name: str = ""
    duration_ns: int | None = None  # GPU time; defaults to end - start (CPU self time for CPU ops)
    launch_known: bool = True

    @property
    def time_ns(self) -> int:
        return self.duration_ns if self.duration_ns is not None else self.end_ns - self.start_ns


@dataclass(frozen=True)
class Range:
    name: str
    start_ns: int
    end_ns: int
    thread: int | None = None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class Trace:
    kernels: list[Kernel]
    ranges: list[Range]
    source: str = ""  # "nsys" or "torch.profiler"
    notes: dict = field(default_factory=dict)


class RangeIndex:
    """Innermost range (latest start) containing a time point, among ranges of chosen names."""

    def __init__(self, ranges: list[Range]):
        self.ranges = sorted(ranges, key=lambda r: (r.start_ns, -r.end_ns))
        self.starts = [r.start_ns for r in self.ranges]

    def find(self, t: int) -> Range | None:
        i = bisect.bisect_right(self.starts, t) - 1
        while i >= 0:  # walk back past ranges that closed before t (only nested ones remain)
            r = self.ranges[i]
            if r.start_ns <= t <= r.end_ns:
                return r
            i -= 1
        return None


def attribute(kernels: list[Kernel], ranges: list[Range], names) -> list[Range | None]:
    """For each kernel, the innermost range named in ``names`` containing its launch (or None)."""
    names = set(names) if not callable(names) else names
    keep = [r for r in ranges if (names(r.name) if callable(names) else r.name in names)]
    index = RangeIndex(keep)
    return [index.find(k.launch_ns) for k in kernels]


def model_slice(trace: Trace, model: str) -> Trace:
    """One model's part of a trace that holds several models' measured blocks: the ranges inside its
    range ``model_range_name(model)`` and the kernels launched inside it (the same rule as a phase's,
    `attribute`), so the blocks of another size with the same context length and mode are not seen."""
    name = model_range_name(model)
    outer = [r for r in trace.ranges if r.name == name]
    if len(outer) != 1:
        raise ValueError(f"expected one range {name!r} in the profile, found {len(outer)}")
    o = outer[0]
    return Trace(
        kernels=[k for k in trace.kernels if o.start_ns <= k.launch_ns <= o.end_ns],
        ranges=[r for r in trace.ranges if r is not o and _within(r, o)],
        source=trace.source,
        notes=trace.notes,
    )


def _within(inner: Range, outer: Range) -> bool:
    return outer.start_ns <= inner.start_ns and inner.end_ns <= outer.end_ns


def summarize_kernels(kernels: list[Kernel], steps: int, top_n: int) -> dict:
    """Kernels grouped by full name, sorted by total time; class totals; all per step."""
    total_ns = sum(k.time_ns for k in kernels)
    groups: dict[str, list[Kernel]] = defaultdict(list)
    for k in kernels:
        groups[k.name].append(k)
    rows = []
    for name, ks in groups.items():
        t = sum(k.time_ns for k in ks)
        short = ks[0].short_name or kn.short_name(name)
        rows.append(
            {
                "name": name,
                "short_name": short,
                "label": kn.label(name, short),
                "class": kn.classify(name),
                "launches": len(ks),
                "launches_per_step": len(ks) / steps,
                "total_ms": t / 1e6,
                "ms_per_step": t / 1e6 / steps,
                "mean_us": t / len(ks) / 1e3,
                "share": t / total_ns if total_ns else None,
            }
        )
    rows.sort(key=lambda r: (-r["total_ms"], r["name"]))
    class_ns = {cls: 0 for cls in kn.CLASSES}
    class_launches = {cls: 0 for cls in kn.CLASSES}
    for row in rows:
        class_ns[row["class"]] += row["total_ms"] * 1e6
        class_launches[row["class"]] += row["launches"]
    shown = rows[:top_n]
    return {
        "steps": steps,
        "kernel_ms_per_step": total_ns / 1e6 / steps,
        "launches_per_step": len(kernels) / steps,
        "distinct_kernels": len(rows),
        "class_ms_per_step": {c: v / 1e6 / steps for c, v in class_ns.items()},
        "class_launches_per_step": {c: v / steps for c, v in class_launches.items()},
        "class_share": {c: (v / total_ns if total_ns else None) for c, v in class_ns.items()},
        "matmul_share": class_ns["matmul"] / total_ns if total_ns else None,
        "top_kernels": shown,
        "other_kernels_ms_per_step": sum(r["ms_per_step"] for r in rows[top_n:]),
    }


def summarize_cell(trace: Trace, context_length: int, mode: str, top_n: int = 15) -> dict:
    """Per-phase kernel summaries and attention-range totals of one measured block."""
    cell_name = cell_range_name(context_length, mode)
    cells = [r for r in trace.ranges if r.name == cell_name]
    if len(cells) != 1:
        raise ValueError(f"expected one range {cell_name!r} in the profile, found {len(cells)}")
    cell = cells[0]
    phases = MODE_PHASES[mode]
    in_cell = [r for r in trace.ranges if _within(r, cell)]
    phase_ranges = [r for r in in_cell if r.name in phases]
    kernels = [k for k, c in zip(trace.kernels, attribute(trace.kernels, [cell], {cell_name})) if c is not None]
    phase_of = attribute(kernels, phase_ranges, set(phases))
    attention_of = attribute(kernels, [r for r in in_cell if r.name in ATTENTION_RANGES], set(ATTENTION_RANGES))

    by_phase: dict[str, list[Kernel]] = defaultdict(list)
    by_instance: dict[Range, list[Kernel]] = defaultdict(list)
    unattributed = []
    for k, p in zip(kernels, phase_of):
        if p is None:
            unattributed.append(k)
        else:
            by_phase[p.name].append(k)
            by_instance[p].append(k)
    steps = {p: sum(1 for r in phase_ranges if r.name == p) for p in phases}
    out: dict = {
        "phases": {},
        "unattributed_kernels": len(unattributed),
        "unattributed_kernel_ms": sum(k.time_ns for k in unattributed) / 1e6,
        "kernels_in_block": len(kernels),
        "kernels_without_launch_time": sum(1 for k in kernels if not k.launch_known),
    }
    for phase in phases:
        n = steps[phase]
        if n == 0:
            raise ValueError(f"no {phase!r} range inside {cell_name!r}")
        instances = sorted((r for r in phase_ranges if r.name == phase), key=lambda r: r.start_ns)
        summary = summarize_kernels(by_phase[phase], n, top_n)
        summary["range_ms_samples"] = [r.duration_ns / 1e6 for r in instances]
        summary["range_ms_mean"] = sum(summary["range_ms_samples"]) / n
        spans = []
        for r in instances:
            ks = by_instance.get(r, [])
            spans.append((max(k.end_ns for k in ks) - min(k.start_ns for k in ks)) / 1e6 if ks else 0.0)
        summary["gpu_span_ms_samples"] = spans
        summary["gpu_span_ms_mean"] = sum(spans) / n
        out["phases"][phase] = summary
    for combined, members in COMBINED_PHASES.get(mode, {}).items():
        n = steps[members[0]]
        ks = [k for m in members for k in by_phase[m]]
        summary = summarize_kernels(ks, n, top_n)
        summary["range_ms_mean"] = sum(out["phases"][m]["range_ms_mean"] for m in members)
        out["phases"][combined] = summary
    # The attention ranges of the forward pass (backward runs in autograd, outside them).
    fwd = FORWARD_PHASE[mode]
    n = steps[fwd]
    attention: dict = {}
    for name in ATTENTION_RANGES:
        ks = [
            k
            for k, a, p in zip(kernels, attention_of, phase_of)
            if a is not None and a.name == name and p is not None and p.name == fwd
        ]
        ranges = [r for r in in_cell if r.name == name and any(_within(r, f) for f in phase_ranges if f.name == fwd)]
        s = summarize_kernels(ks, n, top_n=3)
        attention[name] = {
            "range_count_per_step": len(ranges) / n,
            "range_ms_per_step": sum(r.duration_ns for r in ranges) / 1e6 / n,
            "kernel_ms_per_step": s["kernel_ms_per_step"],
            "launches_per_step": s["launches_per_step"],
            "matmul_ms_per_step": s["class_ms_per_step"]["matmul"],
            "class_ms_per_step": s["class_ms_per_step"],
            "top_kernels": s["top_kernels"],
        }
    out["attention"] = {"phase": fwd, "ranges": attention}
    return out
