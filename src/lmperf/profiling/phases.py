"""Kernels attributed to NVTX phases by launch time, and per-phase summaries.

A ``Trace`` holds kernels (GPU interval, launch time) and named ranges (CPU intervals, any thread). A
kernel belongs to the innermost range of a family that holds its launch: autograd launches backward
kernels from its own thread, and a kernel still queued when its range closes runs after it, so
neither thread nor GPU start would place it. The nsys cell's ranges: ``lmperf model=<size>``, ``lmperf
ctx=<n> <mode>`` per block, a range per phase and step inside, the attention's three inside those.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from lmperf.profiling import kernels as kn

MODES = ("inference", "training")
MODE_PHASES = {"inference": ("inference_forward",), "training": ("forward", "backward", "optimizer_step")}
FORWARD_PHASE = {"inference": "inference_forward", "training": "forward"}
# unions of the training phases summarised too: forward + backward (nsys_profile (b)), the whole step (d)
COMBINED_PHASES = {"forward_backward": ("forward", "backward"), "training_step": MODE_PHASES["training"]}
ATTENTION_RANGES = ("computing attention scores", "computing softmax", "final matmul")
SOFTMAX_FLOPS_PER_SCORE = 5  # the course's softmax: max, subtract, exp, sum, divide
# every range name the cell pushes: these, and the ones that start with "lmperf "
RANGE_NAMES = frozenset({"training_step", *MODE_PHASES["training"], "inference_forward", *ATTENTION_RANGES})


def attention_flops(config, batch: int, ctx: int) -> dict[str, float]:
    """FLOPs per forward, all layers, of each attention range of the plain implementation (every score is
    computed, causal or not): each matmul 2·B·H·T²·d, the softmax 5 per score."""
    scores = config.num_layers * batch * config.num_heads * ctx * ctx
    matmul = 2 * scores * config.d_head
    return dict(zip(ATTENTION_RANGES, (matmul, SOFTMAX_FLOPS_PER_SCORE * scores, matmul)))


def cell_range_name(context_length: int, mode: str) -> str:
    return f"lmperf ctx={context_length} {mode}"


def model_range_name(model: str) -> str:
    return f"lmperf model={model}"


def is_range_name(name: str) -> bool:
    return name in RANGE_NAMES or name.startswith("lmperf ")


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


def attribute(kernels: list[Kernel], ranges: list[Range], names) -> list[Range | None]:
    """For each kernel, the innermost range named in ``names`` that holds its launch (or None)."""
    keep = sorted((r for r in ranges if r.name in names), key=lambda r: (r.start_ns, -r.end_ns))
    starts = [r.start_ns for r in keep]
    owners = []
    for k in kernels:
        i = bisect.bisect_right(starts, k.launch_ns) - 1
        while i >= 0 and keep[i].end_ns < k.launch_ns:  # closed before the launch: back to an enclosing one
            i -= 1
        owners.append(keep[i] if i >= 0 else None)
    return owners


def _within(inner: Range, outer: Range) -> bool:
    return outer.start_ns <= inner.start_ns and inner.end_ns <= outer.end_ns


def _one_range(trace: Trace, name: str) -> Range:
    found = [r for r in trace.ranges if r.name == name]
    if len(found) != 1:
        raise ValueError(f"expected one range {name!r} in the profile, found {len(found)}")
    return found[0]


def model_slice(trace: Trace, model: str) -> Trace:
    """One size's part of a trace of several: the ranges inside its range ``model_range_name(model)`` and
    the kernels launched inside it, so another size's blocks of the same name are not seen."""
    outer = _one_range(trace, model_range_name(model))
    return Trace(
        kernels=[k for k in trace.kernels if outer.start_ns <= k.launch_ns <= outer.end_ns],
        ranges=[r for r in trace.ranges if r is not outer and _within(r, outer)],
        source=trace.source,
        notes=trace.notes,
    )


def summarize_kernels(kernels: list[Kernel], steps: int, top_n: int) -> dict:
    """Kernels grouped by full name, largest total time first (the top ``top_n``), and class totals;
    times and launches per step."""
    total_ns = sum(k.time_ns for k in kernels)
    groups: dict[str, list[Kernel]] = defaultdict(list)
    for k in kernels:
        groups[k.name].append(k)
    class_ns = dict.fromkeys(kn.CLASSES, 0)
    rows = []
    for name, ks in groups.items():
        ns, cls = sum(k.time_ns for k in ks), kn.classify(name)
        class_ns[cls] += ns
        rows.append(
            {
                "name": name,
                "label": kn.label(name, ks[0].short_name or None),
                "class": cls,
                "launches": len(ks),
                "launches_per_step": len(ks) / steps,
                "ms_per_step": ns / 1e6 / steps,
                "share": ns / total_ns if total_ns else None,
            }
        )
    rows.sort(key=lambda r: (-r["ms_per_step"], r["name"]))
    return {
        "steps": steps,
        "kernel_ms_per_step": total_ns / 1e6 / steps,
        "launches_per_step": len(kernels) / steps,
        "class_ms_per_step": {c: ns / 1e6 / steps for c, ns in class_ns.items()},
        "class_share": {c: ns / total_ns if total_ns else None for c, ns in class_ns.items()},
        "matmul_share": class_ns["matmul"] / total_ns if total_ns else None,
        "top_kernels": rows[:top_n],
    }


def summarize_cell(trace: Trace, context_length: int, mode: str, top_n: int = 15) -> dict:
    """One measured block: each phase's kernels (and the training unions), the kernels launched in the
    block outside every phase, and the kernels of the forward's attention ranges."""
    block = _one_range(trace, cell_range_name(context_length, mode))
    inside = [r for r in trace.ranges if _within(r, block)]
    kernels = [k for k in trace.kernels if block.start_ns <= k.launch_ns <= block.end_ns]
    phases = MODE_PHASES[mode]
    phase_ranges = [r for r in inside if r.name in phases]
    by_phase: dict[str | None, list[Kernel]] = defaultdict(list)
    for k, owner in zip(kernels, attribute(kernels, phase_ranges, phases)):
        by_phase[owner.name if owner else None].append(k)
    out: dict = {
        "phases": {},
        "unattributed_kernels": len(by_phase[None]),
        "unattributed_kernel_ms": sum(k.time_ns for k in by_phase[None]) / 1e6,
        "kernels_in_block": len(kernels),
        "kernels_without_launch_time": sum(not k.launch_known for k in kernels),
    }
    for phase in phases:
        ranges = sorted((r for r in phase_ranges if r.name == phase), key=lambda r: r.start_ns)
        if not ranges:
            raise ValueError(f"no {phase!r} range inside {block.name!r}")
        s = out["phases"][phase] = summarize_kernels(by_phase[phase], len(ranges), top_n)
        s["range_ms_samples"] = [r.duration_ns / 1e6 for r in ranges]
        s["range_ms_mean"] = statistics.fmean(s["range_ms_samples"])
    if mode == "training":
        steps = out["phases"]["forward"]["steps"]
        for combined, members in COMBINED_PHASES.items():
            s = out["phases"][combined] = summarize_kernels([k for m in members for k in by_phase[m]], steps, top_n)
            s["range_ms_mean"] = sum(out["phases"][m]["range_ms_mean"] for m in members)
    # the attention ranges of the forward (the backward runs in autograd, outside them)
    fwd = FORWARD_PHASE[mode]
    steps = out["phases"][fwd]["steps"]
    forwards = [r for r in phase_ranges if r.name == fwd]
    att_ranges = [r for r in inside if r.name in ATTENTION_RANGES and any(_within(r, f) for f in forwards)]
    att_of = attribute(by_phase[fwd], att_ranges, ATTENTION_RANGES)
    attention = {}
    for name in ATTENTION_RANGES:
        s = summarize_kernels([k for k, a in zip(by_phase[fwd], att_of) if a and a.name == name], steps, top_n=3)
        ranges = [r for r in att_ranges if r.name == name]
        attention[name] = {
            "range_count_per_step": len(ranges) / steps,
            "range_ms_per_step": sum(r.duration_ns for r in ranges) / 1e6 / steps,
            "kernel_ms_per_step": s["kernel_ms_per_step"],
            "launches_per_step": s["launches_per_step"],
            "matmul_ms_per_step": s["class_ms_per_step"]["matmul"],
            "class_ms_per_step": s["class_ms_per_step"],
            "top_kernels": s["top_kernels"],
        }
    out["attention"] = {"phase": fwd, "ranges": attention}
    return out
