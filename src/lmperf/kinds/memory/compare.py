"""Across devices, memory: the 2.7B model's peak allocated memory on two devices, cell by cell (no torch).

The same program allocates the same tensors on any GPU; a peak that differs beyond the noise
(``lmperf.report.compare.side``) says that the allocator or a library's workspaces differ between
the devices. A cell that runs out of memory on one device only says that its memory is smaller.
"""

from __future__ import annotations

import pandas as pd

from lmperf.core.stats import Estimate
from lmperf.report.compare import (
    Comparison,
    by_cell,
    fmt_ratio,
    median_ratio,
    not_compared,
    pairs,
    side,
    two_devices,
)

KIND = "memory"
WHAT = "peak allocated memory"
PEAK = "peak_allocated_mib"


def peak(record: dict) -> Estimate | None:
    value = (record.get("metrics") or {}).get(PEAK) if record.get("status") == "ok" else None
    return Estimate(float(value)) if isinstance(value, (int, float)) and value > 0 else None


def label(cell: dict) -> str:
    parts = [cell.get("model"), f"ctx{cell.get('context_length')}", cell.get("precision"), cell.get("mode")]
    return " ".join(str(p) for p in parts if p is not None)


def oom_only(a: dict, b: dict) -> dict[str, list[str]]:
    """Cells that ran out of memory on one device only, per device where they did."""
    shared = sorted(set(a) & set(b))
    return {
        "ref": [k for k in shared if a[k]["status"] == "oom" and b[k]["status"] == "ok"],
        "other": [k for k in shared if a[k]["status"] == "ok" and b[k]["status"] == "oom"],
    }


def verdict_of(other: str, ratio: Estimate) -> str:
    verdict = side(ratio)
    if verdict == "within noise":
        return "the same peaks: the same allocations on both devices"
    higher = "lower" if verdict == "faster" else "higher"
    return f"`{other}` peaks {higher} ({ratio.median:.2f}×): the allocator or library workspaces differ"


def compare(records: dict[str, list[dict]]) -> Comparison:
    """Peak memory on the first two devices of ``records`` (the first is the reference)."""
    devices = two_devices(records)
    if devices is None:
        return not_compared(KIND, WHAT, tuple(records), "fewer than two devices have memory records")
    ref, other = devices
    a, b = by_cell(records[ref], (KIND,)), by_cell(records[other], (KIND,))
    cells = pairs(a, b, peak)
    if not cells:
        return not_compared(KIND, WHAT, devices, "no memory cell was measured on both devices")
    ratio, how = median_ratio([p.ratio for p in cells])
    worst = max(abs(p.ratio.median - 1) for p in cells)
    evidence = f"largest difference {100 * worst:.1f}% over {len(cells)} cells"
    oom = oom_only(a, b)
    if oom["ref"]:
        evidence += f"; {len(oom['ref'])} cells run out of memory on `{ref}` only"
    if oom["other"]:
        evidence += f"; {len(oom['other'])} cells run out of memory on `{other}` only"
    rows = [
        {
            "cell": label(p.cell),
            f"peak MiB `{ref}`": f"{p.ref.median:,.0f}",
            f"peak MiB `{other}`": f"{p.other.median:,.0f}",
            "ratio": fmt_ratio(p.ratio),
        }
        for p in cells
    ]
    return Comparison(
        KIND, devices, WHAT, ratio, how, len(cells), verdict_of(other, ratio), evidence, pd.DataFrame(rows)
    )
