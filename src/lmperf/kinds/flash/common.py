"""What the three FlashAttention-2 cells share (flash_correctness, flash_benchmark, flash_leaderboard).

The Triton kernels' tiles are chosen by lmperf.kernels.flash.tuning (per bucket, remembered); the cells only
set its policy and timing through `tuning_settings` and read back what was chosen through
`tuned_choices` - nothing here patches Triton. Before timing, the GPU cells compile every kernel
they will run in parallel processes (`warm_specs`, `warm_kernels`: lmperf.kernels.flash.warm; the attention
cell's ``flash`` does too).
"""

from __future__ import annotations

import math
import os
import sys
import timeit

import torch

from lmperf.core.record import Unsupported, make_record, write_record

KIND = "flash"
# the flash cells' precisions (lmperf.core.dtypes); tf32: float32 inputs with TF32 matmuls allowed (in plain, SDPA
# and our kernels alike)
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
BENCH_PASSES = ("forward", "backward", "forward_backward")
NO_CUDA = (
    "no CUDA device: {what} times CUDA kernels with triton.testing.do_bench (CUDA events); it runs on the GPU grid"
)


def use_interpreter_without_cuda(
    device: torch.device, restart_argv: list[str] | None = None, module: str = "lmperf.kinds.flash.correctness"
) -> bool:
    """Turn Triton's interpreter on for a CPU run, before Triton is first imported.

    triton.jit reads TRITON_INTERPRET when a kernel is decorated, so it must be set before
    lmperf.kernels.flash's Triton modules load; spawned worker processes inherit it. Where triton was
    imported already (the cell launcher's fork server preloads it), the process restarts itself
    in place with TRITON_INTERPRET=1 (os.execve of ``python -m <module> <restart_argv>``: same pid,
    same stdio) when `restart_argv` is given, else raises. Returns whether the interpreter is on.
    """
    if device.type == "cuda":
        return os.environ.get("TRITON_INTERPRET") == "1"
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        if restart_argv is None:
            raise RuntimeError(
                "triton was imported before TRITON_INTERPRET=1 could be set: run this cell in "
                "its own process (python -m lmperf flash_correctness …)"
            )
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(
            sys.executable, [sys.executable, "-m", module, *restart_argv], {**os.environ, "TRITON_INTERPRET": "1"}
        )
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def refuse_interpreter_on_cuda() -> None:
    """Timings of interpreted kernels would be the interpreter's: refuse them."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1 is set: unset it to time the compiled Triton kernels")


def tuning_settings(policy: str | None, warmup_ms: float | None, rep_ms: float | None) -> dict:
    """Set the tuner's policy (off: remembered or heuristic tiles; missing: tune buckets without a
    remembered choice) and the do_bench that times its candidates. Returns them for the record."""
    from lmperf.kernels.flash import tuning

    return tuning.configure(policy, warmup_ms, rep_ms)


def tuned_choices() -> dict:
    """The tiles each Triton kernel used in its latest launch, with their bucket and source."""
    from lmperf.kernels.flash import tuning

    return {kernel: dict(choice) for kernel, choice in tuning.LAST.items()}


def first_calls(run, shapes) -> dict:
    """Run `run(shape)` once per shape before timing, so tuning and compilation happen outside the
    timed region; returns the seconds each took and the tuner's seconds, kept apart from kernel time."""
    from lmperf.kernels.flash import tuning

    tuning.reset_stats()
    out = {"first_call_s": {}, "tuning_s": 0.0}
    for shape in shapes:
        start = timeit.default_timer()
        run(shape)
        torch.cuda.synchronize()
        out["first_call_s"]["x".join(map(str, shape))] = timeit.default_timer() - start
    stats = tuning.stats()
    out["tuning_s"] = stats.pop("tuning_s")
    out["tile_sources"] = stats
    out["compile_and_first_run_s"] = sum(out["first_call_s"].values()) - out["tuning_s"]
    return out


def parse_bool(text: str) -> bool:
    import argparse

    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def bench_metrics(result: dict, batch: int, seq: int, head_dim: int, causal: bool, baseline: dict | None) -> dict:
    """Times, FLOPs, TFLOP/s and speed-ups over the baseline for one time_attention result."""
    from lmperf.core.flops import tflops_per_s
    from lmperf.kinds.flash.harness import attention_flops

    metrics = {}
    for p in BENCH_PASSES:
        ms = result.get(f"{p}_ms")
        ms = ms if ms is not None and math.isfinite(ms) else None
        flops = attention_flops(batch, seq, head_dim, causal, p)
        metrics[f"{p}_ms_median"] = ms
        metrics[f"{p}_flops"] = flops
        metrics[f"{p}_tflops"] = tflops_per_s(flops, ms) if ms else None
        base = (baseline or {}).get(f"{p}_ms_median")
        metrics[f"speedup_vs_plain_{p}"] = base / ms if base and ms else None
    return metrics


class UnsupportedWithMetrics(Unsupported):
    """An implementation refused this shape; run_cell records `unsupported` (the reason holds the error)."""

    def __init__(self, reason: str, metrics: dict):
        super().__init__(reason)
        self.metrics = metrics


def record_keeping_metrics(job, cell: dict, output: str, measure, labels: dict | None = None) -> dict:
    """job.write, keeping the metrics of an UnsupportedWithMetrics (run_cell drops an Unsupported's);
    ``labels`` (what the code ran: product precision, timing method, tuning policy) join the metrics."""
    kept = {}
    labels = labels or {}

    def wrapped():
        try:
            return {**measure(), **labels}
        except UnsupportedWithMetrics as exc:
            kept.update(exc.metrics, **labels)
            raise

    record = job.write(KIND, cell, wrapped, output)
    if kept and record["status"] == "unsupported":
        record = make_record(KIND, cell, "unsupported", kept, record["provenance"], record["reason"])
        write_record(output, record)
    return record


def raise_unsupported(reason: str):
    raise Unsupported(reason)
