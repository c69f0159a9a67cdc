"""Across devices, the flash benchmark: forward+backward time of every attention kernel on two devices.

A device is faster only beyond the noise. A cell is host-bound where its time hardly grows when the
length doubles (``lmperf.report.compare.host_bound``: a fixed cost per call, the host launching
kernels); the length from which the devices are level comes from the per-length ratios. No torch.
"""

from __future__ import annotations

from lmperf.report import compare as rc
from lmperf.report.common import times

KIND, WHAT, AXIS = "flash", "forward+backward time (flash benchmark)", "sequence_length"
TIME = ("forward_backward_ms_median",)


def benchmark_cells(records: list[dict]) -> dict[str, dict]:
    """The benchmark records (not the correctness checks or the leaderboard) by compared cell."""
    return {k: r for k, r in rc.by_cell(records, (KIND,)).items() if r["cell"].get("test") == "benchmark"}


def compare(records: dict[str, list[dict]]) -> rc.Comparison:
    """The flash benchmark on the first two devices of ``records`` (the first is the reference)."""
    none = "no flash benchmark cell was measured on both devices"
    return rc.compare_kind(records, KIND, WHAT, lambda r: rc.time_of(r, TIME), judge, none=none, select=benchmark_cells)


def judge(s: rc.Shared) -> tuple:
    tests = [rc.host_bound({k: t.median for k, r in d.items() if (t := rc.time_of(r, TIME))}, AXIS) for d in (s.a, s.b)]
    groups = rc.split_by_host(s.cells, *tests)
    host, gpu = groups["host"], groups["gpu"]
    lengths = sorted({int(p.cell[AXIS]) for p in s.cells})
    by_length = [(n, [p for p in s.cells if int(p.cell[AXIS]) == n]) for n in lengths]
    most = f", at most {max(p.ref.median for p in host):.2g} ms on `{s.ref}`" if host else ""
    evidence = (
        f"{len(host)} host-bound cells (time grows under {rc.LAUNCH_BOUND_GROWTH:.1f}× when the length doubles{most})"
        f": {times(rc.ratio_of(host))}; {len(gpu)} GPU-bound: {times(rc.ratio_of(gpu))}"
    )
    level = rc.level_from([(n, rc.ratio_of(m)) for n, m in by_length])
    evidence += f"; level from N = {level:.0f} on" if level is not None else ""
    evidence += f"; {len(groups['untested'])} untested" if groups["untested"] else ""
    rows = []  # per length: cells, the median time on the reference, host-bound cells, the ratio
    for n, members in by_length:
        r, refs = rc.ratio_of(members), sorted(p.ref.median for p in members)
        row = {"N": n, "cells": len(members), f"median ms `{s.ref}`": f"{refs[len(refs) // 2]:.3g}"}
        row["host-bound cells"] = sum(p in host for p in members)
        rows.append(row | {"ratio": times(r), "verdict": rc.side(r)})
    bound = rc.bound_verdict(s.other, rc.ratio_of(host), rc.ratio_of(gpu))
    return f"{rc.speed(s.other, s.ratio)}; {bound}", evidence, rows
