"""Across devices, attention alone: the forward time of each implementation on two devices (no torch).

A device is faster only beyond the noise (``lmperf.report.compare.side``). What bounds a cell comes
from the cells: host-bound where the time hardly grows with the length (``host_bound``); among the
others, an implementation's arithmetic intensity — its forward's FLOPs per byte of the memory its
forward holds (``forward_flops`` over ``forward_peak_extra_mib``: the N×N scores of an unfused one).
Where only the implementations of the lowest intensity differ between the devices, they are
bandwidth-bound. The out-of-memory boundary of each device is a fact of its own.
"""

from __future__ import annotations

import statistics

import pandas as pd

from lmperf.core.units import MIB
from lmperf.report.compare import (
    Comparison,
    Pair,
    bound_verdict,
    by_cell,
    fmt_ratio,
    host_bound,
    median_ratio,
    not_compared,
    pairs,
    ratio_of,
    side,
    speed,
    split_by_host,
    time_of,
    two_devices,
)

KIND = "attention"
WHAT = "attention forward time"
TIME = ("forward_ms_median", "forward_ms_mean")
AXIS = "sequence_length"


def bound_tests(records: dict[str, dict]) -> dict[str, bool]:
    times = {k: time_of(r, TIME).median for k, r in records.items() if time_of(r, TIME) is not None}
    return host_bound(times, AXIS)


def intensity(record: dict) -> float | None:
    """FLOPs of the forward per byte of the memory it holds (None where the record lacks either)."""
    metrics = record.get("metrics") or {}
    flops, extra = metrics.get("forward_flops"), metrics.get("forward_peak_extra_mib")
    return flops / (extra * MIB) if flops and extra else None


def by_implementation(cells: list[Pair]) -> dict[str, list[Pair]]:
    out: dict[str, list[Pair]] = {}
    for p in cells:
        out.setdefault(str(p.cell.get("implementation")), []).append(p)
    return dict(sorted(out.items()))


def boundary(records: dict[str, dict], implementation: str) -> str:
    """'16384 / 32768': the longest length that ran and the shortest out of memory ('none')."""
    mine = [r for r in records.values() if r["cell"].get("implementation") == implementation]
    ok = [r["cell"][AXIS] for r in mine if r["status"] == "ok"]
    oom = [r["cell"][AXIS] for r in mine if r["status"] == "oom"]
    return f"{max(ok) if ok else '—'} / {min(oom) if oom else 'none'}"


def impl_facts(cells: list[Pair], gpu: list[Pair], ref_records: dict[str, dict]) -> list[dict]:
    """Per implementation: its GPU-bound cells' ratio, its side, and its median arithmetic intensity."""
    gpu_keys = {p.key for p in gpu}
    facts = []
    for impl, members in by_implementation(cells).items():
        bound = [p for p in members if p.key in gpu_keys]
        ratio = ratio_of(bound)
        ai = [x for x in (intensity(ref_records[p.key]) for p in bound) if x]
        facts.append(
            {
                "implementation": impl,
                "cells": len(members),
                "ratio": ratio,
                "side": side(ratio) if ratio else None,
                "flop_per_byte": statistics.median(ai) if ai else None,
            }
        )
    return facts


def impl_verdict(other: str, facts: list[dict]) -> str | None:
    """'`h200` faster for `plain` (0.86×), the lowest arithmetic intensity (16 FLOP/B …): bandwidth-bound';
    None where every implementation is level."""
    differ = [f for f in facts if f["side"] in ("faster", "slower")]
    if not differ:
        return None
    level = [f for f in facts if f["side"] == "within noise"]
    names = ", ".join(f"`{f['implementation']}` ({f['ratio'].median:.2f}×)" for f in differ)
    sides = sorted({f["side"] for f in differ})
    text = f"`{other}` {' or '.join(sides)} for {names} on GPU-bound cells"
    ai_differ = [f["flop_per_byte"] for f in differ]
    ai_level = [f["flop_per_byte"] for f in level if f["flop_per_byte"]]
    if level and None not in ai_differ and ai_level and max(ai_differ) < min(ai_level):
        text += (
            f", the lowest arithmetic intensity ({max(ai_differ):.0f} FLOP per byte held, against "
            f"{min(ai_level):.0f} or more for the level ones): bandwidth-bound"
        )
    return text + ("; the others level" if level else "")


def table(facts: list[dict], ref_records: dict[str, dict], other_records: dict[str, dict], devices) -> pd.DataFrame:
    ref, other = devices
    rows = []
    for f in facts:
        impl = f["implementation"]
        rows.append(
            {
                "implementation": impl,
                "cells": f["cells"],
                "ratio, GPU-bound cells": fmt_ratio(f["ratio"]),
                "verdict": f["side"] or "—",
                "FLOP per byte held": "—" if f["flop_per_byte"] is None else f"{f['flop_per_byte']:.3g}",
                f"longest N / first OOM `{ref}`": boundary(ref_records, impl),
                f"longest N / first OOM `{other}`": boundary(other_records, impl),
            }
        )
    return pd.DataFrame(rows)


def oom_fact(a: dict[str, dict], b: dict[str, dict], devices: tuple[str, str]) -> str:
    """'`h200` runs 4 cells that run out of memory on `h100`' (or the reverse; '' where neither)."""
    ref, other = devices
    shared = set(a) & set(b)
    more = sum(a[k]["status"] == "oom" and b[k]["status"] == "ok" for k in shared)
    fewer = sum(a[k]["status"] == "ok" and b[k]["status"] == "oom" for k in shared)
    parts = [f"`{other}` runs {more} cells that run out of memory on `{ref}`"] if more else []
    parts += [f"`{ref}` runs {fewer} cells that run out of memory on `{other}`"] if fewer else []
    return "; ".join(parts)


def compare(records: dict[str, list[dict]]) -> Comparison:
    """Attention forward time on the first two devices of ``records`` (the first is the reference)."""
    devices = two_devices(records)
    if devices is None:
        return not_compared(KIND, WHAT, tuple(records), "fewer than two devices have attention records")
    ref, other = devices
    a, b = by_cell(records[ref], (KIND,)), by_cell(records[other], (KIND,))
    cells = pairs(a, b, lambda r: time_of(r, TIME))
    if not cells:
        return not_compared(KIND, WHAT, devices, "no attention cell was measured on both devices")
    groups = split_by_host(cells, bound_tests(a), bound_tests(b))
    ratio, how = median_ratio([p.ratio for p in cells])
    facts = impl_facts(cells, groups["gpu"], a)
    host = ratio_of(groups["host"])
    why = impl_verdict(other, facts) or bound_verdict(other, host, ratio_of(groups["gpu"]))
    evidence = f"{len(groups['gpu'])} GPU-bound cells: " + ", ".join(
        f"`{f['implementation']}` {fmt_ratio(f['ratio'])}" for f in facts if f["ratio"]
    )
    evidence += f"; {len(groups['host'])} host-bound: {fmt_ratio(host)}" if groups["host"] else ""
    oom = oom_fact(a, b, devices)
    evidence += f"; {oom}" if oom else ""
    verdict = f"{speed(other, ratio)}; {why}"
    return Comparison(KIND, devices, WHAT, ratio, how, len(cells), verdict, evidence, table(facts, a, b, devices))
