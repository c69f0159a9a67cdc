"""Across devices, the training step's time cell by cell (no torch); host-bound where the measured GPU
busy share is under half the step, untested where the records do not measure it."""

from __future__ import annotations

import pandas as pd

from lmperf.kinds.e2e.facts import HOST_BOUND_BUSY, model_rank
from lmperf.report import compare as C
from lmperf.report.common import times

KIND, WHAT = "e2e", "training step time"
TIME = ("training_step_ms_median", "training_step_ms_mean")
BUSY = "gpu_busy_fraction"
GROUP_WORDS = {"all": "all", "host": "host-bound", "gpu": "GPU-bound"}


def bound_tests(records: dict[str, dict]) -> dict[str, bool]:
    """Host-bound or not per cell key of one device, where the record measured the GPU's busy share."""
    return {k: r["metrics"][BUSY] < HOST_BOUND_BUSY for k, r in records.items() if BUSY in r["metrics"]}


def table(cells: list[C.Pair], groups: dict[str, list[C.Pair]]) -> pd.DataFrame:
    """Per model (in size order) and precision: cells, host-bound cells, and the ratio on each group."""
    rows, groups = [], {"all": cells, **groups}
    keys = sorted({(p.cell["model"], p.cell["precision"]) for p in cells}, key=lambda k: (model_rank(k[0]), k))
    for key in keys:  # (model, precision)
        of = {g: [p for p in ps if (p.cell["model"], p.cell["precision"]) == key] for g, ps in groups.items()}
        row = {"model": key[0], "precision": key[1], "cells": len(of["all"]), "host-bound cells": len(of["host"])}
        rows.append(row | {f"ratio, {words}": times(C.ratio_of(of[g])) for g, words in GROUP_WORDS.items()})
    return pd.DataFrame(rows)


def evidence(groups: dict[str, list[C.Pair]]) -> str:
    host, gpu, untested = groups["host"], groups["gpu"], groups["untested"]
    text = f"{len(host)} host-bound cells (the GPU busy under half the step): {times(C.ratio_of(host))}"
    text += f"; {len(gpu)} GPU-bound: {times(C.ratio_of(gpu))}"
    if host:
        text += f"; the host-bound steps take up to {max(p.ref.median for p in host):.0f} ms"
    return text + (f"; {len(untested)} untested (no busy share measured)" if untested else "")


def compare(records: dict[str, list[dict]]) -> C.Comparison:
    """The e2e training step on the first two devices of ``records`` (the first is the reference)."""
    return C.compare_kind(records, KIND, WHAT, lambda r: C.time_of(r, TIME), judge)


def judge(s: C.Shared) -> tuple:
    groups = C.split_by_host(s.cells, bound_tests(s.a), bound_tests(s.b))
    bound = C.bound_verdict(s.other, C.ratio_of(groups["host"]), C.ratio_of(groups["gpu"]))
    return f"{C.speed(s.other, s.ratio)}; {bound}", evidence(groups), table(s.cells, groups)
