"""Across devices, end-to-end steps: the training step's time on two devices, cell by cell (no torch).

A device is faster only beyond the noise (``lmperf.report.compare.side``). Whether a cell is
host-bound comes from the cell itself: the GPU's busy share of the step where the records carry it
(``gpu_busy_fraction``), else how the step's time grows with the context
(``lmperf.report.compare.host_bound``: the work at least doubles, the time hardly moves).
"""

from __future__ import annotations

import math

import pandas as pd

from lmperf.core.sizes import SIZES, config_from_name, parameter_count
from lmperf.report.compare import (
    LAUNCH_BOUND_GROWTH,
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
    speed,
    split_by_host,
    time_of,
    two_devices,
)

KIND = "e2e"
WHAT = "training step time"
TIME = ("training_step_ms_median", "training_step_ms_mean")
BUSY = "gpu_busy_fraction"  # the share of a step the GPU runs kernels, where the records measure it
HOST_BUSY = 0.5  # a step whose GPU is busy under half of it is host-bound


def bound_tests(records: dict[str, dict]) -> dict[str, bool]:
    """Host-bound or not per cell key of one device: by the GPU's busy share where every timed record
    has one, else by the growth of the step's time with the context."""
    timed = {k: r for k, r in records.items() if time_of(r, TIME) is not None}
    busy = {k: r["metrics"].get(BUSY) for k, r in timed.items()}
    if timed and all(isinstance(v, (int, float)) for v in busy.values()):
        return {k: v < HOST_BUSY for k, v in busy.items()}
    return host_bound({k: time_of(r, TIME).median for k, r in timed.items()}, "context_length")


def _model_rank(name: str) -> float:
    return parameter_count(config_from_name(name)) if name in SIZES else math.inf


def table(cells: list[Pair], groups: dict[str, list[Pair]]) -> pd.DataFrame:
    """Per model (in size order) and precision: cells, host-bound cells, and the ratio on each group."""
    bound = {p.key: name for name, members in groups.items() for p in members}
    rows = []
    by_model: dict[tuple[str, str], list[Pair]] = {}
    for p in cells:
        by_model.setdefault((p.cell.get("model", "?"), p.cell.get("precision", "?")), []).append(p)
    for (model, precision), members in sorted(by_model.items(), key=lambda kv: (_model_rank(kv[0][0]), kv[0])):
        host = [p for p in members if bound[p.key] == "host"]
        gpu = [p for p in members if bound[p.key] == "gpu"]
        rows.append(
            {
                "model": model,
                "precision": precision,
                "cells": len(members),
                "host-bound cells": len(host),
                "ratio, all": fmt_ratio(ratio_of(members)),
                "ratio, host-bound": fmt_ratio(ratio_of(host)),
                "ratio, GPU-bound": fmt_ratio(ratio_of(gpu)),
            }
        )
    return pd.DataFrame(rows)


def evidence(groups: dict[str, list[Pair]], by_busy: bool) -> str:
    host, gpu, untested = groups["host"], groups["gpu"], groups["untested"]
    test = (
        "the GPU busy under half the step"
        if by_busy
        else f"a step that grows under {LAUNCH_BOUND_GROWTH:.1f}× when the context doubles"
    )
    text = f"{len(host)} host-bound cells ({test}): {fmt_ratio(ratio_of(host))}"
    text += f"; {len(gpu)} GPU-bound: {fmt_ratio(ratio_of(gpu))}"
    if host:
        slowest = max(p.ref.median for p in host)
        text += f"; the host-bound steps take up to {slowest:.0f} ms"
    return text + (f"; {len(untested)} untested" if untested else "")


def compare(records: dict[str, list[dict]]) -> Comparison:
    """The e2e training step on the first two devices of ``records`` (the first is the reference)."""
    devices = two_devices(records)
    if devices is None:
        return not_compared(KIND, WHAT, tuple(records), "fewer than two devices have e2e records")
    ref, other = devices
    a, b = by_cell(records[ref], (KIND,)), by_cell(records[other], (KIND,))
    cells = pairs(a, b, lambda r: time_of(r, TIME))
    if not cells:
        return not_compared(KIND, WHAT, devices, "no e2e cell was measured on both devices")
    ref_test, other_test = bound_tests(a), bound_tests(b)
    groups = split_by_host(cells, ref_test, other_test)
    ratio, how = median_ratio([p.ratio for p in cells])
    verdict = f"{speed(other, ratio)}; {bound_verdict(other, ratio_of(groups['host']), ratio_of(groups['gpu']))}"
    by_busy = all(BUSY in (r.get("metrics") or {}) for r in (*a.values(), *b.values()) if time_of(r, TIME))
    return Comparison(
        KIND, devices, WHAT, ratio, how, len(cells), verdict, evidence(groups, by_busy), table(cells, groups)
    )
