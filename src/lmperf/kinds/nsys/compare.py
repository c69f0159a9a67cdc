"""Across devices, the Nsight Systems profiles: GPU kernel time per step on two devices, by kernel class.

The ratio is of the profiled kernel time of a whole step (training: forward, backward and optimizer;
inference: the forward), so the host does not enter it. What bounds it comes from the kernels
themselves: the ratio of each kernel class's time. Matmuls do many FLOPs per byte (compute-bound);
elementwise, reduction, memory, softmax and optimizer kernels do few (bandwidth-bound). Where only
the bandwidth-bound classes differ between the devices beyond the noise, the difference is memory
bandwidth; where only the matmuls do, compute. No torch.
"""

from __future__ import annotations

import statistics

import pandas as pd

from lmperf.core.stats import Estimate
from lmperf.report.compare import (
    Comparison,
    Pair,
    by_cell,
    fmt_ratio,
    median_ratio,
    not_compared,
    pairs,
    ratio_of,
    side,
    speed,
    two_devices,
)

KIND = "nsys"
WHAT = "GPU kernel time per step (profiled)"
STEP_PHASE = {"training": "training_step", "inference": "inference_forward"}
COMPUTE_CLASSES = ("matmul",)
BANDWIDTH_CLASSES = ("elementwise", "reduction", "memory", "softmax", "optimizer")
CLASSES = COMPUTE_CLASSES + BANDWIDTH_CLASSES + ("other",)


def step_phase(record: dict) -> dict | None:
    """The phase of a whole step of an ok record (None where it has none)."""
    if record.get("status") != "ok":
        return None
    phases = (record.get("metrics") or {}).get("phases") or {}
    phase = phases.get(STEP_PHASE.get(record["cell"].get("mode"), ""))
    return phase if isinstance(phase, dict) and phase.get("kernel_ms_per_step") else None


def kernel_ms(record: dict, classes: tuple[str, ...] | None = None) -> Estimate | None:
    """Kernel ms per step of a whole step: all kernels, or only ``classes`` (None where zero)."""
    phase = step_phase(record)
    if phase is None:
        return None
    if classes is None:
        return Estimate(float(phase["kernel_ms_per_step"]))
    ms = sum(float((phase.get("class_ms_per_step") or {}).get(c) or 0.0) for c in classes)
    return Estimate(ms) if ms > 0 else None


def share(record: dict, classes: tuple[str, ...]) -> float | None:
    phase = step_phase(record)
    total, part = kernel_ms(record), kernel_ms(record, classes)
    return part.median / total.median if phase and total and part else None


def class_pairs(a: dict, b: dict, classes: tuple[str, ...]) -> list[Pair]:
    return pairs(a, b, lambda r: kernel_ms(r, classes))


def mechanism(other: str, compute: Estimate | None, bandwidth: Estimate | None) -> str:
    """What the class ratios say: where the difference is, judged by ``side`` on each."""
    c = side(compute) if compute is not None else "within noise"
    w = side(bandwidth) if bandwidth is not None else "within noise"
    if c == w == "within noise":
        return "level in matmuls and in bandwidth-bound kernels"
    if c == "within noise":
        return f"`{other}` {w} in its bandwidth-bound kernels, matmuls level: memory bandwidth"
    if w == "within noise":
        return f"`{other}` {c} in its matmuls, bandwidth-bound kernels level: compute"
    if c == w:
        return f"`{other}` {c} in matmuls and bandwidth-bound kernels alike"
    return f"`{other}` {c} in its matmuls and {w} in its bandwidth-bound kernels"


def table(a: dict, b: dict) -> pd.DataFrame:
    """Per precision, the whole step and each kernel class: cells, share of the reference's kernel
    time, the ratio and its side."""
    rows = []
    for precision in sorted({r["cell"].get("precision") for r in a.values()}):
        pa = {k: r for k, r in a.items() if r["cell"].get("precision") == precision}
        for name, classes in (("all kernels", None), *((c, (c,)) for c in CLASSES)):
            cells = pairs(pa, b, lambda r, classes=classes: kernel_ms(r, classes))
            if not cells:
                continue
            shares = [share(pa[p.key], classes) for p in cells] if classes else [1.0]
            r = ratio_of(cells)
            rows.append(
                {
                    "precision": precision,
                    "kernels": name,
                    "cells": len(cells),
                    "share of kernel time": f"{100 * statistics.median(s for s in shares if s is not None):.0f}%",
                    "ratio": fmt_ratio(r),
                    "verdict": side(r),
                }
            )
    return pd.DataFrame(rows)


def compare(records: dict[str, list[dict]]) -> Comparison:
    """Profiled kernel time on the first two devices of ``records`` (the first is the reference)."""
    devices = two_devices(records)
    if devices is None:
        return not_compared(KIND, WHAT, tuple(records), "fewer than two devices have nsys records")
    ref, other = devices
    a, b = by_cell(records[ref], (KIND,)), by_cell(records[other], (KIND,))
    cells = pairs(a, b, kernel_ms)
    if not cells:
        return not_compared(KIND, WHAT, devices, "no profile was taken of one cell on both devices")
    ratio, how = median_ratio([p.ratio for p in cells])
    compute, bandwidth = class_pairs(a, b, COMPUTE_CLASSES), class_pairs(a, b, BANDWIDTH_CLASSES)
    rc, rw = ratio_of(compute), ratio_of(bandwidth)
    bw_share = [s for s in (share(a[p.key], BANDWIDTH_CLASSES) for p in cells) if s is not None]
    evidence = f"matmuls {fmt_ratio(rc)}, bandwidth-bound kernels {fmt_ratio(rw)}"
    if bw_share:
        evidence += f" ({100 * statistics.median(bw_share):.0f}% of the kernel time on `{ref}`, median cell)"
    verdict = f"{speed(other, ratio)}; {mechanism(other, rc, rw)}"
    return Comparison(KIND, devices, WHAT, ratio, how, len(cells), verdict, evidence, table(a, b))
