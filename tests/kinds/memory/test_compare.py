"""memory across devices: the same program's peaks, equal or not, and cells out of memory on one device only."""

from __future__ import annotations

from lmperf.core.record import make_record
from lmperf.kinds.memory.compare import compare


def provenance(device: str) -> dict:
    return {
        "device_slug": device,
        "device_name": device.upper(),
        "torch_version": "2.11",
        "git_commit": "0" * 40,
        "git_dirty": False,
        "start_time": "2026-11-26T10:00:00+00:00",
        "settings": {},
    }


def grid(device: str, scale: float = 1.0, oom_from: int = 10_000) -> list[dict]:
    out = []
    for ctx in (128, 256, 512, 1024):
        cell = {"model": "2.7B", "context_length": ctx, "precision": "fp32", "mode": "training", "batch_size": 4}
        if ctx >= oom_from:
            out.append(make_record("memory", cell, "oom", {}, provenance(device), "CUDA out of memory"))
        else:
            metrics = {"peak_allocated_mib": 60_000.0 * (1 + ctx / 1024) * scale}
            out.append(make_record("memory", cell, "ok", metrics, provenance(device)))
    return out


def test_the_same_peaks_are_the_same_allocations():
    c = compare({"h100": grid("h100"), "h200": grid("h200")})
    assert c.cells == 4 and c.verdict == "the same peaks: the same allocations on both devices"
    assert c.evidence == "largest difference 0.0% over 4 cells"
    assert list(c.table.columns) == ["cell", "peak MiB `h100`", "peak MiB `h200`", "ratio"]
    assert c.table.iloc[0]["cell"] == "2.7B ctx128 fp32 training"


def test_higher_peaks_say_the_allocator_differs():
    c = compare({"h100": grid("h100"), "h200": grid("h200", scale=1.1)})
    assert c.verdict.startswith("`h200` peaks higher (1.10×)")
    assert compare({"h100": grid("h100"), "h200": grid("h200", scale=0.9)}).verdict.startswith("`h200` peaks lower")


def test_cells_out_of_memory_on_one_device_only():
    c = compare({"h100": grid("h100", oom_from=512), "h200": grid("h200")})
    assert c.cells == 2 and c.evidence.endswith("; 2 cells run out of memory on `h100` only")
