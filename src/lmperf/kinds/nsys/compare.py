"""Across devices, profiled GPU kernel time of a whole step by kernel class (no torch; the host does not
enter it). Where only the bandwidth-bound classes (elementwise, reduction, memory, softmax, optimizer)
differ beyond the noise, the difference is memory bandwidth; where only the matmuls do, compute.
"""

from __future__ import annotations

import statistics

from lmperf.core.stats import Estimate
from lmperf.report.common import pct, times
from lmperf.report.compare import Comparison, Shared, compare_kind, pairs, ratio_of, side, speed

KIND, WHAT = "nsys", "GPU kernel time per step (profiled)"
STEP_PHASE = {"training": "training_step", "inference": "inference_forward"}
COMPUTE = ("matmul", "attention")
BANDWIDTH = ("elementwise", "reduction", "memory", "softmax", "optimizer")


def kernel_ms(record: dict, classes: tuple[str, ...] | None = None) -> Estimate | None:
    """Kernel ms per step of a whole step of an ok record: all kernels, or only ``classes`` (None where 0)."""
    phases = (record.get("metrics") or {}).get("phases") or {} if record.get("status") == "ok" else {}
    phase = phases.get(STEP_PHASE.get(record["cell"].get("mode"), "")) or {}
    by_class = phase.get("class_ms_per_step") or {}
    ms = phase.get("kernel_ms_per_step") if classes is None else sum(by_class.get(c) or 0.0 for c in classes)
    return Estimate(float(ms)) if ms else None


def mechanism(other: str, compute: Estimate | None, bandwidth: Estimate | None) -> str:
    """What the class ratios say: where the difference is, judged by ``side`` on each."""
    c, w = (side(r) if r is not None else "within noise" for r in (compute, bandwidth))
    if c == w == "within noise":
        return "level in matmuls and in bandwidth-bound kernels"
    if c == w:
        return f"`{other}` {c} in matmuls and bandwidth-bound kernels alike"
    if c == "within noise":
        return f"`{other}` {w} in its bandwidth-bound kernels, matmuls level: memory bandwidth"
    if w == "within noise":
        return f"`{other}` {c} in its matmuls, bandwidth-bound kernels level: compute"
    return f"`{other}` {c} in its matmuls and {w} in its bandwidth-bound kernels"


def compare(records: dict[str, list[dict]]) -> Comparison:
    """Profiled kernel time on the first two devices of ``records`` (the first is the reference)."""
    return compare_kind(records, KIND, WHAT, kernel_ms, judge, none="no profile was taken of one cell on both devices")


def judge(s: Shared) -> tuple[str, str]:
    rc, rw = (ratio_of(pairs(s.a, s.b, lambda r, cs=cs: kernel_ms(r, cs))) for cs in (COMPUTE, BANDWIDTH))
    shares = [w.median / kernel_ms(s.a[p.key]).median for p in s.cells if (w := kernel_ms(s.a[p.key], BANDWIDTH))]
    evidence = f"matmuls {times(rc)}, bandwidth-bound kernels {times(rw)}"
    if shares:
        evidence += f" ({pct(statistics.median(shares), 0)} of the kernel time on `{s.ref}`, median cell)"
    return f"{speed(s.other, s.ratio)}; {mechanism(s.other, rc, rw)}", evidence
