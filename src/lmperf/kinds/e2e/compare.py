"""Across devices, the training step's time cell by cell (no torch); host-bound where the measured GPU
busy share is under half the step, untested where the records do not measure it."""

from __future__ import annotations

from lmperf.kinds.e2e.facts import HOST_BOUND_BUSY
from lmperf.report import compare as C
from lmperf.report.common import model_rank, times

KIND, WHAT = "e2e", "training step time"
TIME = ("training_step_ms_median", "training_step_ms_mean")
BUSY = "gpu_busy_fraction"
GROUP_WORDS = {"all": "all", "host": "host-bound", "gpu": "GPU-bound"}


def table(cells: list[C.Pair], groups: dict[str, list[C.Pair]]) -> list[dict]:
    """Per model (in size order) and precision: cells, host-bound cells, and the ratio on each group."""
    rows, groups = [], {"all": cells, **groups}
    for key in sorted({(p.cell["model"], p.cell["precision"]) for p in cells}, key=lambda k: (model_rank(k[0]), k)):
        of = {g: [p for p in ps if (p.cell["model"], p.cell["precision"]) == key] for g, ps in groups.items()}
        row = {"model": key[0], "precision": key[1], "cells": len(of["all"]), "host-bound cells": len(of["host"])}
        rows.append(row | {f"ratio, {words}": times(C.ratio_of(of[g])) for g, words in GROUP_WORDS.items()})
    return rows


def compare(records: dict[str, list[dict]]) -> C.Comparison:
    """The e2e training step on the first two devices of ``records`` (the first is the reference)."""
    return C.compare_kind(records, KIND, WHAT, lambda r: C.time_of(r, TIME), judge)


def judge(s: C.Shared) -> tuple:
    # host-bound or not per cell key of each device, where the record measured the GPU's busy share
    tests = (
        {k: r["metrics"][BUSY] < HOST_BOUND_BUSY for k, r in rs.items() if BUSY in r["metrics"]} for rs in (s.a, s.b)
    )
    groups = C.split_by_host(s.cells, *tests)
    host, gpu, untested = groups["host"], groups["gpu"], groups["untested"]
    evidence = f"{len(host)} host-bound cells (the GPU busy under half the step): {times(C.ratio_of(host))}"
    evidence += f"; {len(gpu)} GPU-bound: {times(C.ratio_of(gpu))}"
    if host:
        evidence += f"; the host-bound steps take up to {max(p.ref.median for p in host):.0f} ms"
    evidence += f"; {len(untested)} untested (no busy share measured)" if untested else ""
    bound = C.bound_verdict(s.other, C.ratio_of(host), C.ratio_of(gpu))
    return f"{C.speed(s.other, s.ratio)}; {bound}", evidence, table(s.cells, groups)
