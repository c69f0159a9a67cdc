"""Across devices, end-to-end steps: the training step's time on two devices, cell by cell (no torch).

A device is faster only beyond the noise. Whether a cell is host-bound is measured, never guessed
from its times: the GPU busy under half its training step (``gpu_busy_fraction``); a cell whose
records do not measure it is untested.
"""

from __future__ import annotations

import pandas as pd

from lmperf.kinds.e2e.facts import HOST_BOUND_BUSY, model_rank
from lmperf.report import compare as C

KIND, WHAT = "e2e", "training step time"
TIME = ("training_step_ms_median", "training_step_ms_mean")
BUSY = "gpu_busy_fraction"
GROUP_WORDS = {"all": "all", "host": "host-bound", "gpu": "GPU-bound"}


def bound_tests(records: dict[str, dict]) -> dict[str, bool]:
    """Host-bound or not per cell key of one device, where the record measured the GPU's busy share."""
    return {k: r["metrics"][BUSY] < HOST_BOUND_BUSY for k, r in records.items() if BUSY in r["metrics"]}


def table(cells: list[C.Pair], groups: dict[str, list[C.Pair]]) -> pd.DataFrame:
    """Per model (in size order) and precision: cells, host-bound cells, and the ratio on each group."""
    rows = []
    for model, precision in sorted(
        {(p.cell["model"], p.cell["precision"]) for p in cells}, key=lambda k: (model_rank(k[0]), k)
    ):
        of = {
            g: [p for p in group if (p.cell["model"], p.cell["precision"]) == (model, precision)]
            for g, group in (("all", cells), *groups.items())
        }
        row = {"model": model, "precision": precision, "cells": len(of["all"]), "host-bound cells": len(of["host"])}
        for group, words in GROUP_WORDS.items():
            row[f"ratio, {words}"] = C.fmt_ratio(C.ratio_of(of[group]))
        rows.append(row)
    return pd.DataFrame(rows)


def evidence(groups: dict[str, list[C.Pair]]) -> str:
    host, gpu, untested = groups["host"], groups["gpu"], groups["untested"]
    text = f"{len(host)} host-bound cells (the GPU busy under half the step): {C.fmt_ratio(C.ratio_of(host))}"
    text += f"; {len(gpu)} GPU-bound: {C.fmt_ratio(C.ratio_of(gpu))}"
    if host:
        text += f"; the host-bound steps take up to {max(p.ref.median for p in host):.0f} ms"
    return text + (f"; {len(untested)} untested (no busy share measured)" if untested else "")


def compare(records: dict[str, list[dict]]) -> C.Comparison:
    """The e2e training step on the first two devices of ``records`` (the first is the reference)."""
    devices = C.two_devices(records)
    if devices is None:
        return C.not_compared(KIND, WHAT, tuple(records), "fewer than two devices have e2e records")
    ref, other = devices
    a, b = C.by_cell(records[ref], (KIND,)), C.by_cell(records[other], (KIND,))
    cells = C.pairs(a, b, lambda r: C.time_of(r, TIME))
    if not cells:
        return C.not_compared(KIND, WHAT, devices, "no e2e cell was measured on both devices")
    groups = C.split_by_host(cells, bound_tests(a), bound_tests(b))
    ratio, how = C.median_ratio([p.ratio for p in cells])
    verdict = (
        f"{C.speed(other, ratio)}; {C.bound_verdict(other, C.ratio_of(groups['host']), C.ratio_of(groups['gpu']))}"
    )
    return C.Comparison(KIND, devices, WHAT, ratio, how, len(cells), verdict, evidence(groups), table(cells, groups))
