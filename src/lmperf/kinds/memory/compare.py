"""Across devices, memory: each cell's peak allocated memory on two devices (no torch).

The same program allocates the same tensors on any GPU; a peak that differs beyond the noise says
that the allocator or a library's workspaces differ. A cell that runs out of memory on one device
only says that its memory is smaller.
"""

from __future__ import annotations

import pandas as pd

from lmperf.report import compare as C

KIND, WHAT = "memory", "peak allocated memory"


def compare(records: dict[str, list[dict]]) -> C.Comparison:
    """Peak memory on the first two devices of ``records`` (the first is the reference)."""
    devices = C.two_devices(records)
    if devices is None:
        return C.not_compared(KIND, WHAT, tuple(records), "fewer than two devices have memory records")
    ref, other = devices
    a, b = C.by_cell(records[ref], (KIND,)), C.by_cell(records[other], (KIND,))
    cells = C.pairs(a, b, lambda r: C.time_of(r, ("peak_allocated_mib",)))
    if not cells:
        return C.not_compared(KIND, WHAT, devices, "no memory cell was measured on both devices")
    ratio, how = C.median_ratio([p.ratio for p in cells])
    evidence = f"largest difference {100 * max(abs(p.ratio.median - 1) for p in cells):.1f}% over {len(cells)} cells"
    for device, oom, ok in ((ref, a, b), (other, b, a)):
        n = sum(oom[k]["status"] == "oom" and ok[k]["status"] == "ok" for k in set(a) & set(b))
        evidence += f"; {n} cells run out of memory on `{device}` only" if n else ""
    verdict = {"faster": "lower", "slower": "higher"}.get(C.side(ratio))
    verdict = (
        f"`{other}` peaks {verdict} ({ratio.median:.2f}×): the allocator or library workspaces differ"
        if verdict
        else "the same peaks: the same allocations on both devices"
    )
    rows = [
        {
            "cell": f"{p.cell['model']} ctx{p.cell['context_length']} {p.cell['precision']} {p.cell['mode']}",
            f"peak MiB `{ref}`": f"{p.ref.median:,.0f}",
            f"peak MiB `{other}`": f"{p.other.median:,.0f}",
            "ratio": C.fmt_ratio(p.ratio),
        }
        for p in cells
    ]
    return C.Comparison(KIND, devices, WHAT, ratio, how, len(cells), verdict, evidence, pd.DataFrame(rows))
