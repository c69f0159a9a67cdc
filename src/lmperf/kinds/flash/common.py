"""What the flash cells share: the no-CUDA refusal, our kernels' tiles (``lmperf.kernels.flash.tuning``:
per bucket, remembered, or tuned in do_bench's untimed first call) and warm-up (every kernel compiled
in parallel processes before timing: ``lmperf.kernels.flash.warm``), the metrics of one timed shape."""

from __future__ import annotations

import math

from lmperf.core.flops import tflops_per_s
from lmperf.core.record import Unsupported
from lmperf.kinds.flash.harness import PASSES, attention_flops

KIND = "flash"
NO_CUDA = (
    "no CUDA device: {what} times CUDA kernels with triton.testing.do_bench (CUDA events); it runs on the GPU grid"
)


def no_cuda(what: str) -> dict:
    """Ends a cell as ``unsupported``: the device has no CUDA."""
    raise Unsupported(NO_CUDA.format(what=what))


def configure_tuning(settings: dict) -> dict:
    """The tuner's policy (``off``: remembered or heuristic tiles; ``missing``: tune buckets without a
    remembered choice) and the do_bench timing its candidates; returns them for the metrics."""
    from lmperf.kernels.flash import tuning

    tuning.reset_stats()
    return tuning.configure(settings["tune"], settings["autotune_warmup_ms"], settings["autotune_rep_ms"])


def tuned() -> dict:
    """Our kernels' tiles in their latest launch (bucket, config, source) and the seconds the tuner spent
    since the last look (in untimed first calls)."""
    from lmperf.kernels.flash import tuning

    seconds = tuning.stats()["tuning_s"]
    tuning.reset_stats()
    return {"tiles": {kernel: dict(choice) for kernel, choice in tuning.LAST.items()}, "tuning_s": seconds}


def warm(shapes, precision: str, causal: bool, workers: int | None) -> dict:
    """Compile our kernels for every (batch, N, d) of ``shapes`` at once; the warm-up's metrics."""
    from lmperf.kernels.flash.warm import warm_kernels, warm_specs

    return warm_kernels(warm_specs(shapes, precision, causal), workers)


def pass_metrics(result: dict, batch: int, seq: int, head_dim: int, causal: bool, baseline: dict | None) -> dict:
    """Each pass's median ms, FLOPs, TFLOP/s and speed-up over the baseline's metrics (when given)."""
    metrics = {}
    for p in PASSES:
        ms = result.get(f"{p}_ms")
        ms = ms if ms is not None and math.isfinite(ms) else None
        flops = attention_flops(batch, seq, head_dim, causal, p)
        metrics |= {f"{p}_ms_median": ms, f"{p}_flops": flops, f"{p}_tflops": tflops_per_s(flops, ms) if ms else None}
        if baseline is not None:
            base = baseline.get(f"{p}_ms_median")
            metrics[f"speedup_vs_plain_{p}"] = base / ms if base and ms else None
    return metrics
