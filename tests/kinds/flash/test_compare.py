"""flash across devices: host-bound short cells apart from GPU-bound long ones, and where the ratio levels."""

from __future__ import annotations

from lmperf.core.record import make_record
from lmperf.kinds.flash.compare import compare

from .builders import provenance

LENGTHS = (256, 512, 1024, 2048, 4096, 8192, 16384)


def bench(device: str, implementation: str, n: int, ms: float) -> dict:
    cell = {"test": "benchmark", "implementation": implementation, "precision": "bf16", "head_dim": 64}
    cell |= {"sequence_length": n, "batch_size": 1, "causal": True}
    return make_record("flash", cell, "ok", {"forward_backward_ms_median": ms}, provenance(device))


def grid(device: str, launch_ms: float, gpu_scale: float) -> list[dict]:
    """A fixed cost per call (``launch_ms``) up to 1024, then time growing as N² (times ``gpu_scale``):
    256 and 512 are host-bound (their doubling takes no longer), 1024 is not (its doubling does)."""
    out = []
    for impl, spread in (("flash", 1.0), ("plain", 1.01)):
        for n in LENGTHS:
            ms = launch_ms * spread if n <= 1024 else (n / 2048) ** 2 * 2.0 * gpu_scale * spread
            out.append(bench(device, impl, n, ms))
    # neither the leaderboard nor the correctness checks are benchmark cells
    out.append(make_record("flash", {"test": "leaderboard"}, "ok", {"x": 1}, provenance(device)))
    return out


def test_slower_on_host_bound_cells_level_from_a_length_on():
    c = compare({"h100": grid("h100", 0.4, 1.0), "h200": grid("h200", 0.52, 1.0)})
    assert c.cells == 14
    assert c.verdict.endswith(
        "level where the GPU's work sets the time, `h200` slower where the host sets it: the hosts' kernel-launch speed"
    )
    assert c.evidence.startswith(
        "4 host-bound cells (time grows under 1.3× when the length doubles, at most 0.4 ms on `h100`): 1.30×"
    )
    assert "; 10 GPU-bound: 1.00×" in c.evidence and "level from N = 2048 on" in c.evidence
    assert list(c.table["N"]) == list(LENGTHS) and list(c.table["host-bound cells"]) == [2, 2, 0, 0, 0, 0, 0]


def test_slower_on_gpu_bound_cells_is_the_gpus_and_no_shared_benchmark_cell_is_no_comparison():
    c = compare({"h100": grid("h100", 0.4, 1.0), "h200": grid("h200", 0.4, 1.2)})
    assert c.verdict.endswith(
        "`h200` slower where the GPU's work sets the time, level where the host sets it: the GPUs differ"
    )
    assert "level from" not in c.evidence  # the long cells are the slower ones
    c = compare({"h100": grid("h100", 0.4, 1.0)[-1:], "h200": grid("h200", 0.4, 1.0)[-1:]})
    assert c.verdict == "not compared: no flash benchmark cell was measured on both devices"
