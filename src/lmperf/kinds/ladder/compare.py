"""Across devices, time per token of every rung (a rung may pick another batch on a larger GPU), no
torch. On rungs that reach half their measured matmul ceiling or more, a matmul-bound step changes by
the ratio of the ceilings: the ratio of the ratios says whether it does.
"""

from __future__ import annotations

from lmperf.core.stats import Estimate
from lmperf.kinds.ladder.facts import number, scaled
from lmperf.report import compare as C
from lmperf.report.common import times

HEAVY = 0.5  # a rung that reaches half its device's measured matmul ceiling or more is matmul-heavy


def ms_per_token(record: dict) -> Estimate | None:
    est, tokens = C.time_of(record, ("step_ms_median",)), (record.get("metrics") or {}).get("tokens_per_step")
    return scaled(est, 1.0 / tokens) if est is not None and tokens else None


def metric(record: dict, name: str) -> float | None:
    return number(record.get("metrics") or {}, name)


def against_ceilings(cells: list[C.Pair], a: dict, b: dict) -> Estimate | None:
    """The median over ``cells`` of their ratios over the ratio their matmuls would give (reference / other ceiling)."""
    found = [(p.ratio, metric(a[p.key], "ceiling_measured"), metric(b[p.key], "ceiling_measured")) for p in cells]
    return C.median_ratio([scaled(ratio, cb / ca) for ratio, ca, cb in found if ca and cb])[0]


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
    """'profiled best rung `h200` / `h100` (`b` / `a`): GPU busy 99% / 98%, matmuls 84% / 72% of kernel
    time' from each device's ladder_profile, the other device first (as the ceilings' ratio)."""
    m = first_ok(records, devices, "ladder_profile")
    if m is None:
        return ""
    (ref, other), m = devices, m[::-1]
    names = [x.get("rung") for x in m]
    rungs = " (" + " / ".join(f"`{n}`" for n in names) + ")" if all(names) else ""
    busy = " / ".join(f"{100 * x.get('busy_fraction', 0):.0f}%" for x in m)
    matmul = " / ".join(f"{100 * (x.get('class_share') or {}).get('matmul', 0):.0f}%" for x in m)
    return f"profiled best rung `{other}` / `{ref}`{rungs}: GPU busy {busy}, matmuls {matmul} of kernel time"


def mechanism(other: str, relative: Estimate | None) -> str:
    if relative is None:
        return "no rung reaches half its measured matmul ceiling on both devices"
    if (verdict := C.side(relative)) == "within noise":
        return "matmul-heavy rungs follow the measured matmul ceilings: compute-bound"
    return f"`{other}` {verdict} than its measured matmul ceiling predicts on matmul-heavy rungs: the difference is outside the matmuls"


def table(cells: list[C.Pair], a: dict, b: dict) -> list[dict]:
    order = {p.cell["rung"]: metric(a[p.key], "rung_index") or 0.0 for p in cells}
    rows = []
    for rung in sorted(order, key=lambda r: (order[r], r)):
        members = [p for p in cells if p.cell["rung"] == rung]
        row = {"rung": rung, "cells": len(members), "matmul-heavy cells": sum(heavy(p, a, b) for p in members)}
        row |= {"ratio": times(C.ratio_of(members))}
        rows.append(row | {"ratio over the ceilings' ratio": times(against_ceilings(members, a, b))})
    return rows


def compare(records: dict[str, list[dict]]) -> C.Comparison:
    """The speed ladder on the first two devices of ``records`` (the first is the reference)."""
    what, none = "time per token (speed ladder)", "no rung was measured on both devices"
    return C.compare_kind(records, "ladder", what, ms_per_token, judge, "speed-ladder", none)


def judge(s: C.Shared) -> tuple:
    a, b, devices = s.a, s.b, (s.ref, s.other)
    matmul_heavy, rest = [p for p in s.cells if heavy(p, a, b)], [p for p in s.cells if not heavy(p, a, b)]
    relative = against_ceilings(matmul_heavy, a, b)
    evidence = (
        f"{len(matmul_heavy)} matmul-heavy cells (half their measured matmul ceiling or more): "
        f"{times(C.ratio_of(matmul_heavy))}, {times(relative)} of the ceilings' ratio; "
        f"{len(rest)} others: {times(C.ratio_of(rest))}"
    )
    ratios, profiled = ceilings(s.records, devices), profiles(s.records, devices)
    evidence += f"; measured matmul ceilings `{s.other}` / `{s.ref}`: {ratios}" if ratios else ""
    evidence += f"; {profiled}" if profiled else ""
    return f"{C.speed(s.other, s.ratio)}; {mechanism(s.other, relative)}", evidence, table(s.cells, a, b)
