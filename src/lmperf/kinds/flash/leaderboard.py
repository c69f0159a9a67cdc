"""leaderboard: the course's protocol (torch.compile, bf16, causal, (16, 16384, d), do_bench) for ours
and SDPA's flash and cuDNN backends at each ``protocol_head_dims``, then ``side_by_side``: eager times
and TFLOP/s at ``forward_head_dims`` (the 16 heads folded into the batch). One record; without CUDA
``unsupported``.
"""

from __future__ import annotations

import sys

import torch

from lmperf.core import device as devices
from lmperf.core.cell import free_memory, parse_job
from lmperf.core.dtypes import dtype_name
from lmperf.core.record import PartialOutOfMemory
from lmperf.core.units import MIB
from lmperf.kinds.flash import common, harness

OURS = "flash"


def protocol(s: dict, device: torch.device) -> dict:
    """Per head dim, each implementation under the course's protocol (ours first)."""
    out = {}
    for d in s["protocol_head_dims"]:
        out[str(d)] = {}
        for impl in sorted(s["implementations"], key=lambda impl: impl != OURS):
            timing = {"compile": s["compile"], "warmup_ms": s["warmup_ms"], "rep_ms": s["rep_ms"], "head_dim": d}
            result = harness.time_leaderboard(harness.implementation(impl), **timing)
            result |= common.tuned() if impl == OURS else {}
            print(f"[flash leaderboard] protocol {impl} d={d}: {result}", file=sys.stderr, flush=True)
            out[str(d)][impl] = result
            free_memory(device)
    return out


def side_by_side(s: dict, device: torch.device, dtype: torch.dtype) -> list[dict]:
    """Eager forward, backward and forward+backward of each implementation at each forward head dim."""
    batch, n, rows = s["forward_batch"], s["forward_sequence_length"], []
    for d in s["forward_head_dims"]:
        for impl in s["implementations"]:
            torch.cuda.reset_peak_memory_stats()
            timing = {"warmup_ms": s["table_warmup_ms"], "rep_ms": s["table_rep_ms"]}
            result = harness.time_attention(batch, n, d, dtype, True, harness.implementation(impl), **timing)
            print(f"[flash leaderboard] eager {impl} d={d}: {result}", file=sys.stderr, flush=True)
            row = {"implementation": impl, "head_dim": d, "batch_size": batch, "sequence_length": n, "causal": True}
            row |= {"precision": dtype_name(dtype), "status": result["status"], "error": result["error"]}
            row |= {"peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB}
            rows.append(row | common.pass_metrics(result, batch, n, d, True, None))
            free_memory(device)
    return rows


def measure(s: dict, device: torch.device) -> dict:
    if device.type != "cuda":
        common.no_cuda("the leaderboard")
    shape = harness.LEADERBOARD_SHAPE
    metrics = {"leaderboard_shape": {**shape, "dtype": dtype_name(shape["dtype"])}}
    if OURS in s["implementations"]:
        shapes = {(shape["batch"], shape["seq"], d) for d in s["protocol_head_dims"]}
        shapes |= {(s["forward_batch"], s["forward_sequence_length"], d) for d in s["forward_head_dims"]}
        metrics |= common.configure_tuning(s) | common.warm(
            sorted(shapes), metrics["leaderboard_shape"]["dtype"], True, s["workers"]
        )
    metrics["protocol_by_head_dim"] = protocol(s, device)
    for d, results in metrics["protocol_by_head_dim"].items():  # at the top level: trials merge them
        metrics |= {
            f"{impl}_d{d}_forward_backward_ms_median": r["forward_backward_ms_median"] for impl, r in results.items()
        }
    metrics["side_by_side"] = side_by_side(s, device, shape["dtype"])
    ours = metrics["protocol_by_head_dim"].get(str(shape["head_dim"]), {}).get(OURS, {})
    if ours.get("status") == "oom":
        raise PartialOutOfMemory(f"out of memory in the leaderboard protocol: {ours['error']}", metrics)
    return metrics


def run(job) -> int:
    device = devices.check_device(job.device)
    job.write(common.KIND, {"test": "leaderboard"}, lambda: measure(job.settings, device))
    return 0


def main(argv=None) -> int:
    return run(parse_job("flash_leaderboard", argv, __doc__.splitlines()[0]))


if __name__ == "__main__":
    sys.exit(main())
