"""Across devices, the speed ladder: time per token of every rung on two devices (no torch).

Time per token (the step's time over its tokens), since a rung may pick another batch on a device
with more memory. A device is faster only beyond the noise (``lmperf.report.compare.side``). What
bounds the rungs comes from their own records: each rung knows the matmul ceiling measured on its
device (``ceiling_measured``, from the gemm_peak probe) and the share of it the step reaches
(``mfu_measured``). On rungs that reach half of it or more, a matmul-bound step would change by the
ratio of the ceilings; the ratio of the ratios says whether they follow it.
"""

from __future__ import annotations

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
    time_of,
    two_devices,
)

KIND = "ladder"
WHAT = "time per token (speed ladder)"
TIME = ("step_ms_median", "step_ms_mean")
HEAVY = 0.5  # a rung that reaches half its device's measured matmul ceiling or more is matmul-heavy


def scaled(est: Estimate, factor: float) -> Estimate:
    low = None if est.low is None else est.low * factor
    high = None if est.high is None else est.high * factor
    return Estimate(est.median * factor, low, high, est.trials, est.method)


def ms_per_token(record: dict) -> Estimate | None:
    est, tokens = time_of(record, TIME), (record.get("metrics") or {}).get("tokens_per_step")
    return scaled(est, 1.0 / tokens) if est is not None and tokens else None


def metric(record: dict, name: str) -> float | None:
    value = (record.get("metrics") or {}).get(name)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def against_ceilings(p: Pair, a: dict, b: dict) -> Estimate | None:
    """A cell's ratio over the ratio its matmuls would give (reference ceiling / other ceiling)."""
    ca, cb = metric(a[p.key], "ceiling_measured"), metric(b[p.key], "ceiling_measured")
    return scaled(p.ratio, cb / ca) if ca and cb else None


def heavy(p: Pair, a: dict, b: dict) -> bool:
    ua, ub = metric(a[p.key], "mfu_measured"), metric(b[p.key], "mfu_measured")
    return ua is not None and ub is not None and min(ua, ub) >= HEAVY


def ceilings(records: dict[str, list[dict]], devices: tuple[str, str]) -> str:
    """'bf16 0.95×, fp32 0.98×, tf32 0.96×': the other device's measured matmul ceilings over the
    reference's (gemm_peak records; '' without them on both)."""
    probe = {
        d: next((r for r in records[d] if r["kind"] == "gemm_peak" and r["status"] == "ok"), None) for d in devices
    }
    if None in probe.values():
        return ""
    ref, other = (probe[d]["metrics"] for d in devices)
    parts = [
        f"{p} {other[f'{p}_tflops'] / ref[f'{p}_tflops']:.2f}×"
        for p in ("bf16", "tf32", "fp32")
        if ref.get(f"{p}_tflops") and other.get(f"{p}_tflops")
    ]
    return ", ".join(parts)


def profiles(records: dict[str, list[dict]], devices: tuple[str, str]) -> str:
    """'GPU busy 98% / 99%, matmuls 72% / 84% of kernel time' from each device's ladder_profile."""
    prof = {
        d: next((r for r in records[d] if r["kind"] == "ladder_profile" and r["status"] == "ok"), None) for d in devices
    }
    if None in prof.values():
        return ""
    m = [prof[d]["metrics"] for d in devices]
    busy = " / ".join(f"{100 * x.get('busy_fraction', 0):.0f}%" for x in m)
    matmul = " / ".join(f"{100 * (x.get('class_share') or {}).get('matmul', 0):.0f}%" for x in m)
    return f"profiled best rung: GPU busy {busy}, matmuls {matmul} of kernel time"


def mechanism(other: str, relative: Estimate | None) -> str:
    if relative is None:
        return "no rung reaches half its measured matmul ceiling on both devices"
    verdict = side(relative)
    if verdict == "within noise":
        return "matmul-heavy rungs follow the measured matmul ceilings: compute-bound"
    more = "faster" if verdict == "faster" else "slower"
    return f"`{other}` {more} than its measured matmul ceiling predicts on matmul-heavy rungs: the difference is outside the matmuls"


def table(cells: list[Pair], a: dict, b: dict) -> pd.DataFrame:
    order = {p.cell["rung"]: metric(a[p.key], "rung_index") or 0.0 for p in cells}
    rows = []
    for rung in sorted(order, key=lambda r: (order[r], r)):
        members = [p for p in cells if p.cell["rung"] == rung]
        rel = median_ratio([x for x in (against_ceilings(p, a, b) for p in members) if x])[0]
        rows.append(
            {
                "rung": rung,
                "cells": len(members),
                "matmul-heavy cells": sum(heavy(p, a, b) for p in members),
                "ratio": fmt_ratio(ratio_of(members)),
                "ratio over the ceilings' ratio": fmt_ratio(rel),
            }
        )
    return pd.DataFrame(rows)


def compare(records: dict[str, list[dict]]) -> Comparison:
    """The speed ladder on the first two devices of ``records`` (the first is the reference)."""
    devices = two_devices(records)
    if devices is None:
        return not_compared(KIND, WHAT, tuple(records), "fewer than two devices have speed-ladder records")
    ref, other = devices
    a, b = by_cell(records[ref], (KIND,)), by_cell(records[other], (KIND,))
    cells = pairs(a, b, ms_per_token)
    if not cells:
        return not_compared(KIND, WHAT, devices, "no rung was measured on both devices")
    ratio, how = median_ratio([p.ratio for p in cells])
    matmul_heavy = [p for p in cells if heavy(p, a, b)]
    relative = median_ratio([x for x in (against_ceilings(p, a, b) for p in matmul_heavy) if x])[0]
    rest = [p for p in cells if not heavy(p, a, b)]
    evidence = (
        f"{len(matmul_heavy)} matmul-heavy cells (half their measured matmul ceiling or more): "
        f"{fmt_ratio(ratio_of(matmul_heavy))}, {fmt_ratio(relative)} of the ceilings' ratio; "
        f"{len(rest)} others: {fmt_ratio(ratio_of(rest))}"
    )
    ratios = ceilings(records, devices)
    evidence += f"; measured matmul ceilings `{other}` / `{ref}`: {ratios}" if ratios else ""
    profiled = profiles(records, devices)
    evidence += f"; {profiled}" if profiled else ""
    verdict = f"{speed(other, ratio)}; {mechanism(other, relative)}"
    return Comparison(KIND, devices, WHAT, ratio, how, len(cells), verdict, evidence, table(cells, a, b))
