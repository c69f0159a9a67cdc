"""attention across devices: per implementation, and bandwidth-bound only where the intensity says so."""

from __future__ import annotations

from lmperf.core.record import make_record
from lmperf.kinds.attention.compare import compare
from tests.kinds.records import provenance

LENGTHS = (1024, 2048, 4096, 8192)


def grid(device: str, plain: float = 1.0, flash: float = 1.0, oom_from: int = 10**6) -> list[dict]:
    """plain holds the N×N scores (memory grows as N², few FLOPs per byte); flash holds O(N) (many).
    Both take time growing as N² (GPU-bound); each device scales an implementation's times."""
    out = []
    for n in LENGTHS:
        for impl, scale, held_mib in (("plain", plain, 8 * n * n * 4 * 3 / 2**20), ("flash", flash, n / 256)):
            cell = {"implementation": impl, "head_dim": 64, "sequence_length": n, "batch_size": 8, "precision": "fp32"}
            metrics = {"forward_ms_median": n * n / 1e6 * scale, "forward_flops": 4 * 8 * n * n * 64}
            oom = impl == "plain" and n >= oom_from
            metrics = {} if oom else metrics | {"forward_peak_extra_mib": held_mib}
            out.append(
                make_record(
                    "attention",
                    cell,
                    "oom" if oom else "ok",
                    metrics,
                    provenance(device),
                    oom and "out of memory" or None,
                )
            )
    return out


def test_only_the_lowest_intensity_faster_is_bandwidth_bound():
    c = compare({"h100": grid("h100"), "h200": grid("h200", plain=0.85)})
    assert c.cells == 8
    assert "`h200` faster for `plain` (0.85×) on GPU-bound cells, the lowest arithmetic intensity" in c.verdict
    assert c.verdict.endswith(": bandwidth-bound; the others level")
    rows = {r["implementation"]: r for r in c.table.to_dict("records")}
    assert rows["plain"]["verdict"] == "faster" and rows["flash"]["verdict"] == "within noise"
    assert rows["plain"]["FLOP per byte held"] == "21.3"  # 4·N²·d FLOPs over 3 N×N fp32 matrices: 64·4/12


def test_a_high_intensity_implementation_faster_is_not_called_bandwidth_bound():
    c = compare({"h100": grid("h100"), "h200": grid("h200", flash=0.85)})
    assert "`h200` faster for `flash` (0.85×)" in c.verdict and "bandwidth-bound" not in c.verdict
    level = compare({"h100": grid("h100"), "h200": grid("h200")})
    assert level.verdict == "level (1.00×); GPU-bound cells level, within the noise"


def test_the_out_of_memory_boundary_of_each_device():
    c = compare({"h100": grid("h100", oom_from=8192), "h200": grid("h200")})
    assert c.evidence.endswith("`h200` runs 1 cells that run out of memory on `h100`")
    rows = {r["implementation"]: r for r in c.table.to_dict("records")}
    assert (rows["plain"]["longest N / first OOM `h100`"], rows["plain"]["longest N / first OOM `h200`"]) == (
        "4096 / 8192",
        "8192 / none",
    )
