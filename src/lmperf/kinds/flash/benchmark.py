"""flash_benchmarking: one record per (implementation, head dim, length) of one precision: forward,
backward and forward+backward median ms, TFLOP/s and the speed-up over ``plain`` (timed first at each
shape). ``sdpa`` is pinned to the precision's backend; ``fp32`` keeps every product in fp32, ``tf32``
allows TF32 for all. Out of memory is an ``oom`` record, an implementation that raises ``unsupported``.
"""

from __future__ import annotations

import functools
import sys

import torch

from lmperf.core import device as devices
from lmperf.core.cell import free_memory, parse_job
from lmperf.core.dtypes import torch_dtype
from lmperf.core.record import PartialOutOfMemory, Unsupported
from lmperf.core.units import MIB
from lmperf.kernels.flash.products import dot_precision_for
from lmperf.kinds.flash import common, harness

BASELINE = "plain"


def cells(s: dict) -> list[dict]:
    """Every record's cell, in the order they are timed: per shape, ``plain`` first."""
    return [
        {"test": "benchmark", "implementation": impl, "precision": s["precision"], "head_dim": d}
        | {"sequence_length": n, "batch_size": s["batch_size"], "causal": s["causal"]}
        for d in s["head_dims"]
        for n in sorted(s["sequence_lengths"])
        for impl in sorted(s["implementations"], key=lambda impl: impl != BASELINE)
    ]


def time_one(s: dict, cell: dict, baseline: dict | None, labels: dict) -> dict:
    """One implementation at one shape; PartialOutOfMemory or Unsupported where it does not finish."""
    impl, d, n = cell["implementation"], cell["head_dim"], cell["sequence_length"]
    torch.cuda.reset_peak_memory_stats()
    fn = harness.implementation(impl, s["sdpa_backend"])
    dtype, timing = torch_dtype(s["precision"]), {"warmup_ms": s["warmup_ms"], "rep_ms": s["rep_ms"]}
    result = harness.time_attention(s["batch_size"], n, d, dtype, s["causal"], fn, **timing)
    metrics = common.pass_metrics(result, s["batch_size"], n, d, s["causal"], baseline) | labels
    metrics["peak_allocated_mib"] = torch.cuda.max_memory_allocated() / MIB
    if impl == "sdpa":
        metrics["sdpa_backend"] = s["sdpa_backend"]
    if impl == "flash":
        metrics |= common.tuned()
    if result["status"] != "ok":
        free_memory(torch.device("cuda"))
        print(f"[flash benchmark] {impl} d={d} n={n}: {result['error']}", file=sys.stderr, flush=True)
    if result["status"] == "oom":
        raise PartialOutOfMemory(f"out of memory: {result['error']}", metrics)
    if result["status"] == "error":
        raise Unsupported(f"{impl} raised {result['error']}")
    return metrics


def run(job) -> int:
    s = job.settings
    device = devices.check_device(job.device)
    if device.type != "cuda":
        for cell in cells(s):
            job.write(common.KIND, cell, functools.partial(common.no_cuda, "flash_benchmarking"))
        return 0
    # TF32 matmuls for tf32 only, in PyTorch's and our kernels alike (they follow the flag), the whole process
    torch.backends.cuda.matmul.allow_tf32 = s["precision"] == "tf32"
    labels = {"dot_precision": dot_precision_for(s["precision"])}
    ours = {}  # our kernels' tuning policy and warm-up, in our records
    if "flash" in s["implementations"]:
        ours = common.configure_tuning(s)
        shapes = [(s["batch_size"], n, d) for d in s["head_dims"] for n in s["sequence_lengths"]]
        ours |= common.warm(shapes, s["precision"], s["causal"], s["workers"])
    baseline: dict[tuple, dict] = {}
    for cell in cells(s):
        shape, impl = (cell["head_dim"], cell["sequence_length"]), cell["implementation"]
        base = baseline.get(shape) if impl != BASELINE and BASELINE in s["implementations"] else None
        extra = labels | ours if impl == "flash" else labels
        record = job.write(common.KIND, cell, functools.partial(time_one, s, cell, base, extra))
        if impl == BASELINE:  # an out-of-memory backward still leaves its forward
            baseline[shape] = record["metrics"]
    return 0


def main(argv=None) -> int:
    return run(parse_job("flash_benchmark", argv, __doc__.splitlines()[0]))


if __name__ == "__main__":
    sys.exit(main())
