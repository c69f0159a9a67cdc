"""Across devices, each cell's peak allocated memory (no torch): the same program allocates the same
tensors on any GPU, so a peak that differs says the allocator or a library's workspaces differ."""

from __future__ import annotations

import pandas as pd

from lmperf.kinds.memory.facts import LOWER_HIGHER
from lmperf.report import compare as C
from lmperf.report.common import num, times

KIND, WHAT = "memory", "peak allocated memory"


def compare(records: dict[str, list[dict]]) -> C.Comparison:
    """Peak memory on the first two devices of ``records`` (the first is the reference)."""
    return C.compare_kind(records, KIND, WHAT, lambda r: C.time_of(r, ("peak_allocated_mib",)), judge)


def judge(s: C.Shared) -> tuple:
    ref, other, a, b, cells = s.ref, s.other, s.a, s.b, s.cells
    evidence = f"largest difference {100 * max(abs(p.ratio.median - 1) for p in cells):.1f}% over {len(cells)} cells"
    for device, oom, ok in ((ref, a, b), (other, b, a)):
        n = sum(oom[k]["status"] == "oom" and ok[k]["status"] == "ok" for k in set(a) & set(b))
        evidence += f"; {n} cells run out of memory on `{device}` only" if n else ""
    verdict = "the same peaks: the same allocations on both devices"
    if higher := LOWER_HIGHER.get(C.side(s.ratio)):
        verdict = f"`{other}` peaks {higher} ({s.ratio.median:.2f}×): the allocator or library workspaces differ"
    columns = ["cell", f"peak MiB `{ref}`", f"peak MiB `{other}`", "ratio"]
    cell = "{model} ctx{context_length} {precision} {mode}"
    rows = [(cell.format(**p.cell), num(p.ref.median, 0), num(p.other.median, 0), times(p.ratio)) for p in cells]
    return verdict, evidence, pd.DataFrame(rows, columns=columns)
