"""Across devices, the flash benchmark: forward+backward time of every attention kernel on two devices.

A device is faster only beyond the noise (``lmperf.report.compare.side``). Whether a cell is
host-bound comes from the cells: how its time grows with the sequence length, all else equal
(``lmperf.report.compare.host_bound``: the work at least doubles, the time hardly moves: a fixed
cost per call, the host launching kernels). The length from which the devices are level comes from
the per-length ratios. No torch.
"""

from __future__ import annotations

import pandas as pd

from lmperf.report.compare import (
    LAUNCH_BOUND_GROWTH,
    Comparison,
    Pair,
    bound_verdict,
    fmt_ratio,
    host_bound,
    level_from,
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
from lmperf.report.compare import by_cell as _by_cell

KIND = "flash"
WHAT = "forward+backward time (flash benchmark)"
TIME = ("forward_backward_ms_median",)
AXIS = "sequence_length"


def benchmark_cells(records: list[dict]) -> dict[str, dict]:
    """The benchmark records (not the correctness checks or the leaderboard) by compared cell."""
    return {k: r for k, r in _by_cell(records, (KIND,)).items() if r["cell"].get("test") == "benchmark"}


def bound_tests(records: dict[str, dict]) -> dict[str, bool]:
    times = {k: time_of(r, TIME).median for k, r in records.items() if time_of(r, TIME) is not None}
    return host_bound(times, AXIS)


def by_length(cells: list[Pair]) -> list[tuple[int, list[Pair]]]:
    lengths: dict[int, list[Pair]] = {}
    for p in cells:
        lengths.setdefault(int(p.cell[AXIS]), []).append(p)
    return sorted(lengths.items())


def table(cells: list[Pair], groups: dict[str, list[Pair]], ref: str) -> pd.DataFrame:
    """Per sequence length: cells, the median time on the reference, host-bound cells, the ratio."""
    host = {p.key for p in groups["host"]}
    rows = []
    for n, members in by_length(cells):
        r = ratio_of(members)
        ms = sorted(p.ref.median for p in members)
        rows.append(
            {
                "N": n,
                "cells": len(members),
                f"median ms `{ref}`": f"{ms[len(ms) // 2]:.3g}",
                "host-bound cells": sum(p.key in host for p in members),
                "ratio": fmt_ratio(r),
                "verdict": side(r),
            }
        )
    return pd.DataFrame(rows)


def evidence(cells: list[Pair], groups: dict[str, list[Pair]], ref: str) -> str:
    host, gpu = groups["host"], groups["gpu"]
    text = (
        f"{len(host)} host-bound cells (time grows under {LAUNCH_BOUND_GROWTH:.1f}× when the length doubles"
        + (f", at most {max(p.ref.median for p in host):.2g} ms on `{ref}`" if host else "")
        + f"): {fmt_ratio(ratio_of(host))}; {len(gpu)} GPU-bound: {fmt_ratio(ratio_of(gpu))}"
    )
    level = level_from([(n, ratio_of(m)) for n, m in by_length(cells)])
    if level is not None:
        text += f"; level from N = {level:.0f} on"
    return text + (f"; {len(groups['untested'])} untested" if groups["untested"] else "")


def compare(records: dict[str, list[dict]]) -> Comparison:
    """The flash benchmark on the first two devices of ``records`` (the first is the reference)."""
    devices = two_devices(records)
    if devices is None:
        return not_compared(KIND, WHAT, tuple(records), "fewer than two devices have flash records")
    ref, other = devices
    a, b = benchmark_cells(records[ref]), benchmark_cells(records[other])
    cells = pairs(a, b, lambda r: time_of(r, TIME))
    if not cells:
        return not_compared(KIND, WHAT, devices, "no flash benchmark cell was measured on both devices")
    groups = split_by_host(cells, bound_tests(a), bound_tests(b))
    ratio, how = median_ratio([p.ratio for p in cells])
    verdict = f"{speed(other, ratio)}; {bound_verdict(other, ratio_of(groups['host']), ratio_of(groups['gpu']))}"
    return Comparison(
        KIND, devices, WHAT, ratio, how, len(cells), verdict, evidence(cells, groups, ref), table(cells, groups, ref)
    )
