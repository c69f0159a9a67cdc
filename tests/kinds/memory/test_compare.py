"""memory across devices: the same program's peaks, equal or not, and cells out of memory on one device only."""

from __future__ import annotations

from lmperf.kinds.memory.compare import compare

from .records import cell, record


def grid(device: str, scale: float = 1.0, oom_from: int = 10_000) -> list[dict]:
    return [
        record(cell(ctx), {}, "oom", "CUDA out of memory", device)
        if ctx >= oom_from
        else record(cell(ctx), {"peak_allocated_mib": 60_000.0 * (1 + ctx / 1024) * scale}, device=device)
        for ctx in (128, 256, 512, 1024)
    ]


def test_the_same_peaks_are_the_same_allocations_and_a_difference_names_its_side():
    c = compare({"h100": grid("h100"), "h200": grid("h200")})
    assert (c.cells, c.verdict) == (4, "the same peaks: the same allocations on both devices")
    assert c.evidence == "largest difference 0.0% over 4 cells"
    assert list(c.table.columns) == ["cell", "peak MiB `h100`", "peak MiB `h200`", "ratio"]
    assert c.table.iloc[0]["cell"] == "2.7B ctx128 fp32 training"
    assert compare({"h100": grid("h100"), "h200": grid("h200", 1.1)}).verdict.startswith("`h200` peaks higher (1.10×)")
    assert compare({"h100": grid("h100"), "h200": grid("h200", 0.9)}).verdict.startswith("`h200` peaks lower")
    c = compare({"h100": grid("h100", oom_from=512), "h200": grid("h200")})  # out of memory on one device only
    assert c.cells == 2 and c.evidence.endswith("; 2 cells run out of memory on `h100` only")
