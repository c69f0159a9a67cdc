"""Across devices, time per token of every rung (a rung may pick another batch on a larger GPU), no
torch. On rungs that reach half their measured matmul ceiling or more, a matmul-bound step changes by
the ratio of the ceilings: the ratio of the ratios says whether it does.
"""

from __future__ import annotations

import pandas as pd

from lmperf.core.stats import Estimate
from lmperf.kinds.ladder.facts import scaled
from lmperf.report import compare as C
from lmperf.report.common import times

KIND = "ladder"
WHAT = "time per token (speed ladder)"
TIME = ("step_ms_median",)
HEAVY = 0.5  # a rung that reaches half its device's measured matmul ceiling or more is matmul-heavy


def ms_per_token(record: dict) -> Estimate | None:
    est, tokens = C.time_of(record, TIME), (record.get("metrics") or {}).get("tokens_per_step")
    return scaled(est, 1.0 / tokens) if est is not None and tokens else None


def metric(record: dict, name: str) -> float | None:
    value = (record.get("metrics") or {}).get(name)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def against_ceilings(p: C.Pair, a: dict, b: dict) -> Estimate | None:
    """A cell's ratio over the ratio its matmuls would give (reference ceiling / other ceiling)."""
    ca, cb = metric(a[p.key], "ceiling_measured"), metric(b[p.key], "ceiling_measured")
    return scaled(p.ratio, cb / ca) if ca and cb else None


def heavy(p: C.Pair, a: dict, b: dict) -> bool:
    ua, ub = metric(a[p.key], "mfu_measured"), metric(b[p.key], "mfu_measured")
    return ua is not None and ub is not None and min(ua, ub) >= HEAVY


def first_ok(records: dict[str, list[dict]], devices: tuple[str, str], kind: str) -> list[dict] | None:
    """Each device's first ok record of ``kind`` (its metrics), or None unless both have one."""
    found = [
        next((r["metrics"] for r in records[d] if r["kind"] == kind and r["status"] == "ok"), None) for d in devices
    ]
    return None if None in found else found


def ceilings(records: dict[str, list[dict]], devices: tuple[str, str]) -> str:
    """'bf16 0.95×, fp32 0.98×': the other device's measured matmul ceilings over the reference's."""
    ref, other = first_ok(records, devices, "gemm_peak") or ({}, {})
    both = [p for p in ("bf16", "fp8", "tf32", "fp32") if ref.get(f"{p}_tflops") and other.get(f"{p}_tflops")]
    return ", ".join(f"{p} {other[f'{p}_tflops'] / ref[f'{p}_tflops']:.2f}×" for p in both)


def profiles(records: dict[str, list[dict]], devices: tuple[str, str]) -> str:
    """'GPU busy 98% / 99%, matmuls 72% / 84% of kernel time' from each device's ladder_profile."""
    m = first_ok(records, devices, "ladder_profile")
    if m is None:
        return ""
    busy = " / ".join(f"{100 * x.get('busy_fraction', 0):.0f}%" for x in m)
    matmul = " / ".join(f"{100 * (x.get('class_share') or {}).get('matmul', 0):.0f}%" for x in m)
    return f"profiled best rung: GPU busy {busy}, matmuls {matmul} of kernel time"


def mechanism(other: str, relative: Estimate | None) -> str:
    if relative is None:
        return "no rung reaches half its measured matmul ceiling on both devices"
    verdict = C.side(relative)
    if verdict == "within noise":
        return "matmul-heavy rungs follow the measured matmul ceilings: compute-bound"
    more = "faster" if verdict == "faster" else "slower"
    return f"`{other}` {more} than its measured matmul ceiling predicts on matmul-heavy rungs: the difference is outside the matmuls"


def table(cells: list[C.Pair], a: dict, b: dict) -> pd.DataFrame:
    order = {p.cell["rung"]: metric(a[p.key], "rung_index") or 0.0 for p in cells}
    rows = []
    for rung in sorted(order, key=lambda r: (order[r], r)):
        members = [p for p in cells if p.cell["rung"] == rung]
        rel = C.median_ratio([x for x in (against_ceilings(p, a, b) for p in members) if x])[0]
        row = {"rung": rung, "cells": len(members), "matmul-heavy cells": sum(heavy(p, a, b) for p in members)}
        rows.append(row | {"ratio": times(C.ratio_of(members)), "ratio over the ceilings' ratio": times(rel)})
    return pd.DataFrame(rows)


def compare(records: dict[str, list[dict]]) -> C.Comparison:
    """The speed ladder on the first two devices of ``records`` (the first is the reference)."""
    return C.compare_kind(
        records, KIND, WHAT, ms_per_token, judge, "speed-ladder", "no rung was measured on both devices"
    )


def judge(s: C.Shared) -> tuple:
    ref, other, a, b, cells, records = s.ref, s.other, s.a, s.b, s.cells, s.records
    devices = (ref, other)
    matmul_heavy = [p for p in cells if heavy(p, a, b)]
    relative = C.median_ratio([x for x in (against_ceilings(p, a, b) for p in matmul_heavy) if x])[0]
    rest = [p for p in cells if not heavy(p, a, b)]
    evidence = (
        f"{len(matmul_heavy)} matmul-heavy cells (half their measured matmul ceiling or more): "
        f"{times(C.ratio_of(matmul_heavy))}, {times(relative)} of the ceilings' ratio; "
        f"{len(rest)} others: {times(C.ratio_of(rest))}"
    )
    ratios = ceilings(records, devices)
    evidence += f"; measured matmul ceilings `{other}` / `{ref}`: {ratios}" if ratios else ""
    profiled = profiles(records, devices)
    evidence += f"; {profiled}" if profiled else ""
    return f"{C.speed(other, s.ratio)}; {mechanism(other, relative)}", evidence, table(cells, a, b)
