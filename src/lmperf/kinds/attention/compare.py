"""Across devices, attention alone: each implementation's forward time on two devices (no torch).
A device is faster only beyond the noise (``lmperf.report.compare.side``); a cell is host-bound where
its time hardly grows with N (``host_bound``); among the others, where only the implementations of the
lowest arithmetic intensity (forward FLOPs per byte the forward holds) differ, they are bandwidth-bound.
"""

from __future__ import annotations

import statistics

from lmperf.core.units import MIB
from lmperf.report import compare as rc
from lmperf.report.common import times

KIND, WHAT, AXIS = "attention", "attention forward time", "sequence_length"
TIME = ("forward_ms_median", "forward_ms_mean")


def impl_facts(cells: list[rc.Pair], gpu_keys: set[str], ref: dict[str, dict]) -> list[dict]:
    """Per implementation: its GPU-bound cells' ratio and side, and their median FLOPs per byte held."""
    facts = []
    for impl in sorted({p.cell["implementation"] for p in cells}):
        members = [p for p in cells if p.cell["implementation"] == impl]
        bound = [p for p in members if p.key in gpu_keys]
        held = [ref[p.key]["metrics"] for p in bound]
        ai = [m["forward_flops"] / (m["forward_peak_extra_mib"] * MIB) for m in held if m.get("forward_peak_extra_mib")]
        fact = {"implementation": impl, "cells": len(members), "ratio": rc.ratio_of(bound)}
        facts.append(fact | {"side": fact["ratio"] and rc.side(fact["ratio"]), "ai": ai and statistics.median(ai)})
    return facts


def impl_verdict(other: str, facts: list[dict]) -> str | None:
    """'`h200` faster for `plain` (0.86×) on GPU-bound cells, the lowest arithmetic intensity (…):
    bandwidth-bound; the others level'; None where every implementation is level."""
    differ = [f for f in facts if f["side"] in ("faster", "slower")]
    level = [f["ai"] for f in facts if f["side"] == "within noise"]
    if not differ:
        return None
    names = ", ".join(f"`{f['implementation']}` ({f['ratio'].median:.2f}×)" for f in differ)
    text = f"`{other}` {' or '.join(sorted({f['side'] for f in differ}))} for {names} on GPU-bound cells"
    low = [f["ai"] for f in differ]
    if level and all(low) and all(level) and max(low) < min(level):
        text += (
            f", the lowest arithmetic intensity ({max(low):.0f} FLOP per byte held, against "
            f"{min(level):.0f} or more for the level ones): bandwidth-bound"
        )
    return text + ("; the others level" if level else "")


def reach(records: dict[str, dict], implementation: str) -> str:
    """'16384 / 32768': the longest length that ran and the shortest that ran out of memory ('none')."""
    mine = [r for r in records.values() if r["cell"]["implementation"] == implementation]
    ok, oom = ([r["cell"][AXIS] for r in mine if r["status"] == s] for s in ("ok", "oom"))
    return f"{max(ok) if ok else '—'} / {min(oom) if oom else 'none'}"


def compare(records: dict[str, list[dict]]) -> rc.Comparison:
    """Attention forward time on the first two devices of ``records`` (the first is the reference)."""
    return rc.compare_kind(records, KIND, WHAT, lambda r: rc.time_of(r, TIME), judge)


def judge(s: rc.Shared) -> tuple:
    ref, other, a, b, cells = s.ref, s.other, s.a, s.b, s.cells
    tests = [rc.host_bound({k: t.median for k, r in d.items() if (t := rc.time_of(r, TIME))}, AXIS) for d in (a, b)]
    groups = rc.split_by_host(cells, *tests)
    facts, host = impl_facts(cells, {p.key for p in groups["gpu"]}, a), rc.ratio_of(groups["host"])
    why = impl_verdict(other, facts) or rc.bound_verdict(other, host, rc.ratio_of(groups["gpu"]))
    evidence = f"{len(groups['gpu'])} GPU-bound cells: "
    evidence += ", ".join(f"`{f['implementation']}` {times(f['ratio'])}" for f in facts if f["ratio"])
    evidence += f"; {len(groups['host'])} host-bound: {times(host)}" if groups["host"] else ""
    for x, y, runs, fails in ((a, b, other, ref), (b, a, ref, other)):
        more = sum(x[k]["status"] == "oom" and y[k]["status"] == "ok" for k in set(a) & set(b))
        evidence += f"; `{runs}` runs {more} cells that run out of memory on `{fails}`" if more else ""
    table = [
        {
            "implementation": f["implementation"],
            "cells": f["cells"],
            "ratio, GPU-bound cells": times(f["ratio"]),
            "verdict": f["side"] or "—",
            "FLOP per byte held": f"{f['ai']:.3g}" if f["ai"] else "—",
            f"longest N / first OOM `{ref}`": reach(a, f["implementation"]),
            f"longest N / first OOM `{other}`": reach(b, f["implementation"]),
        }
        for f in facts
    ]
    return f"{rc.speed(other, s.ratio)}; {why}", evidence, table
