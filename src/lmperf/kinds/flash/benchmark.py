"""flash_benchmarking: one record per (implementation, head dim, sequence length) of one precision.

Forward, backward and forward+backward median milliseconds from
``lmperf.kinds.flash.harness.time_attention`` (``triton.testing.do_bench``, inputs made before timing),
TFLOP/s by ``lmperf.core.flops``, and the speed-up over ``plain`` (timed first, in the same process)
stored with each timing. ``sdpa`` is PyTorch's fused attention pinned to the backend
``--sdpa-backend`` names (the flash backend takes only fp16/bf16: fp32 and tf32 run the
memory-efficient one); the record names what ran. Precision ``tf32`` is float32 inputs with TF32
matmuls allowed for every implementation (torch.backends.cuda.matmul.allow_tf32, which our kernels
follow); ``fp32`` keeps fp32 products: PyTorch's in IEEE float32, our kernels' in 3xTF32 (or IEEE,
``LMPERF_FLASH_FP32``; lmperf.kernels.flash.products).

Our kernels' tiles come from lmperf.kernels.flash.tuning: ``--tune missing`` (default) tunes each bucket
without a remembered choice (``--autotune-warmup-ms``/``--autotune-rep-ms`` time its candidates);
``--tune off`` takes remembered or heuristic tiles. On CUDA, before anything is timed, every kernel
flash_triton will run is compiled at once in ``--workers`` spawned processes (lmperf.kernels.flash.warm:
a task per kernel of each distinct set of binaries, each shape's cheapest equivalent); the flash_triton records
keep that job-wide wall time as ``warm_compile_s``. With ``--precompile`` every (head dim, length)
then runs once before timing, so tuning and what compilation is left stay out of the timed region;
the flash_triton records keep the seconds they took (``tuning_s``, ``compile_and_first_run_s``)
apart from the kernel times, and the tiles that ran. Out of memory is a record with status ``oom`` (and what was
timed before); an implementation that raises (e.g. an SDPA backend that refuses the shape) a record
with status ``unsupported`` whose reason holds the exception. Without CUDA: ``unsupported`` records.

    python -m lmperf flash_benchmark --device h100 --precision bf16 --sdpa-backend FLASH_ATTENTION \\
        --output 'results/h100/flash/bench_{impl}_bf16_d{head_dim}_n{seq_len}.json' \\
        --implementations plain flash_triton sdpa --head-dims 64 80 --sequence-lengths 1024 4096
"""

from __future__ import annotations

import functools
import sys
import timeit

import torch

from lmperf.core import device as devices
from lmperf.core.cell import free_memory, parse_job
from lmperf.core.dtypes import torch_dtype
from lmperf.core.record import PartialOutOfMemory
from lmperf.core.units import MIB
from lmperf.kernels.flash.products import dot_precision_for
from lmperf.kernels.flash.warm import warm_kernels, warm_specs
from lmperf.kinds.flash.common import (
    KIND,
    NO_CUDA,
    UnsupportedWithMetrics,
    bench_metrics,
    first_calls,
    raise_unsupported,
    record_keeping_metrics,
    refuse_interpreter_on_cuda,
    tuned_choices,
    tuning_settings,
)

BASELINE = "plain"
# Benchmark implementation names -> lmperf.kinds.flash.harness.IMPLEMENTATIONS names; `sdpa` resolves to
# the backend of --sdpa-backend.
SDPA_BACKEND_IMPLEMENTATIONS = {
    "FLASH_ATTENTION": "sdpa_flash",
    "CUDNN_ATTENTION": "sdpa_cudnn",
    "EFFICIENT_ATTENTION": "sdpa_efficient",
    "MATH": "sdpa_math",
}
BENCH_IMPLEMENTATIONS = ("plain", "flash_triton", "sdpa", *SDPA_BACKEND_IMPLEMENTATIONS.values())
HEAD_DIM_RANGE = (16, 256)


def bench_implementation(name: str, sdpa_backend: str) -> str:
    """The lmperf.kinds.flash.harness name a benchmark implementation runs as (`sdpa`: the pinned backend's)."""
    return SDPA_BACKEND_IMPLEMENTATIONS[sdpa_backend] if name == "sdpa" else name


def time_one(impl: str, ran: str, args, head_dim: int, seq: int, baseline: dict | None, extra: dict) -> dict:
    """Time one implementation at one shape; raise PartialOutOfMemory / Unsupported for the record."""
    from lmperf.kinds.flash import harness as bench

    dtype = torch_dtype(args.precision)
    torch.cuda.reset_peak_memory_stats()
    start = timeit.default_timer()
    with bench.matmul_precision(args.precision):
        result = bench.time_attention(
            args.batch_size, seq, head_dim, dtype, args.causal, ran, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms
        )
    metrics = {
        "ran": ran,
        "batch_size": args.batch_size,
        "head_dim": head_dim,
        "sequence_length": seq,
        "causal": args.causal,
        "timing_status": result["status"],
    }
    if ran.startswith("sdpa_"):
        metrics["sdpa_backend"] = next(b for b, n in SDPA_BACKEND_IMPLEMENTATIONS.items() if n == ran)
    metrics.update(bench_metrics(result, args.batch_size, seq, head_dim, args.causal, baseline))
    metrics["peak_allocated_mib"] = torch.cuda.max_memory_allocated() / MIB
    metrics["cell_wall_s"] = timeit.default_timer() - start
    if impl == "flash_triton" and result["status"] == "ok":
        metrics["tiles"] = tuned_choices()
    metrics.update(extra)
    if result["status"] != "ok":  # time_attention empties the cache itself; collect what a failure left
        free_memory(torch.device("cuda"))
    if result["status"] == "oom":
        raise PartialOutOfMemory(f"out of memory: {result['error']}", metrics)
    if result["status"] == "error":
        metrics["error"] = result["error"]
        print(f"[flash benchmark] {ran} d={head_dim} n={seq}: {result['error']}", file=sys.stderr, flush=True)
        raise UnsupportedWithMetrics(f"{ran} raised {result['error']}", metrics)
    return metrics


def run(job) -> int:
    args = job.args
    device = devices.check_device(args.device)
    labels = {}
    # what flash_triton's tl.dot multiplies float32 inputs in (bf16/fp16 run the tensor cores anyway);
    # fp32 runs under matmul_precision("fp32"), which turns allow_tf32 off
    labels["dot_precision"] = dot_precision_for(args.precision, allow_tf32=False)
    labels["timing"] = (
        "lmperf.kinds.flash.harness.time_attention: do_bench medians (CUDA events); backward on one "
        "retained graph, input grads set to None outside the timed region"
    )
    impls = sorted(args.implementations, key=lambda impl: impl != BASELINE)  # plain first: the speed-ups need it
    cells = [(d, n, impl) for d in args.head_dims for n in sorted(args.sequence_lengths) for impl in impls]
    if device.type != "cuda":
        for d, n, impl in cells:
            cell = bench_cell(args, impl, d, n)
            output = args.output.format(impl=impl, head_dim=d, seq_len=n)
            job.write(KIND, cell, functools.partial(raise_unsupported, NO_CUDA.format(what="flash_benchmarking")), output)
        return 0
    refuse_interpreter_on_cuda()
    extra: dict[tuple, dict] = {}
    warmed: dict = {}
    if "flash_triton" in args.implementations:
        labels.update(tuning_settings(args.tune, args.autotune_warmup_ms, args.autotune_rep_ms))
        # every kernel flash_triton will run, compiled side by side before anything is timed (a
        # bucket the tuner still tunes, --tune missing, compiles its other candidates here, later)
        warmed = warm_kernels(warm_specs(flash_shapes(args), args.precision, args.causal), args.workers)
        if args.precompile:
            extra = first_runs(args)
    baseline: dict[tuple, dict | None] = {}
    for d, n, impl in cells:
        ran = bench_implementation(impl, args.sdpa_backend)
        base = baseline.get((d, n)) if impl != BASELINE else None
        cell = bench_cell(args, impl, d, n)
        record = record_keeping_metrics(
            job,
            cell,
            args.output.format(impl=impl, head_dim=d, seq_len=n),
            functools.partial(
                time_one,
                impl,
                ran,
                args,
                d,
                n,
                base,
                {**warmed, **extra.get((d, n), {})} if impl == "flash_triton" else {},
            ),
            labels,
        )
        if impl == BASELINE:  # out of memory in backward still leaves its forward to compare with
            baseline[(d, n)] = record["metrics"]
    return 0


def bench_cell(args, impl: str, head_dim: int, seq: int) -> dict:
    return {
        "test": "benchmark",
        "implementation": impl,
        "precision": args.precision,
        "head_dim": head_dim,
        "sequence_length": seq,
        "batch_size": args.batch_size,
        "causal": args.causal,
    }


def flash_shapes(args) -> list[tuple[int, int, int]]:
    """The (batch, length, head dim) shapes flash_triton is timed at, in the order they are timed."""
    return [(args.batch_size, n, d) for d in args.head_dims for n in sorted(args.sequence_lengths)]


def first_runs(args) -> dict[tuple, dict]:
    """Forward+backward of flash_triton once per (head dim, length), before any timing: the seconds
    of tuning and of compilation plus the first run, per cell (the timings exclude them)."""
    from lmperf.kinds.flash import harness as bench

    def run_once(shape):
        batch, n, d = shape
        q, k, v, do = bench.make_inputs(batch, n, d, torch_dtype(args.precision))
        with bench.matmul_precision(args.precision):
            bench.flash_triton(q, k, v, args.causal).backward(do)

    out = {}
    for batch, n, d in flash_shapes(args):
        try:
            out[(d, n)] = first_calls(run_once, [(batch, n, d)])
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: the timing records say it
            out[(d, n)] = {"first_call_error": f"{type(exc).__name__}: {exc}"[:300]}
        free_memory(torch.device("cuda"))
    print(f"[flash benchmark] first runs: {out}", file=sys.stderr, flush=True)
    return out


def main(argv=None) -> int:
    return run(parse_job("flash_benchmark", argv, __doc__.splitlines()[0]))


if __name__ == "__main__":
    sys.exit(main())
