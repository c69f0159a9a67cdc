"""leaderboard: the course's protocol, ours against SDPA flash and SDPA cuDNN, side by side in one process.

One record: ``lmperf.benchmarks.flash.time_leaderboard`` (torch.compile, bf16, causal, (16, 16384, 64),
do_bench rep 10 s) for our kernel, SDPA flash and SDPA cuDNN, their medians and the ratios
ours/flash and ours/cuDNN; the same protocol at the other ``--protocol-head-dims`` (128: the
issue's second comparison) under ``protocol_by_head_dim``; plus forward, backward and
forward+backward time and TFLOP/s of each at causal head dims ``--forward-head-dims``, length
16384, batch ``--forward-batch`` (16: the leaderboard's heads folded into the batch), eager. Our
tiles come from lmperf.flash.tuning (``--tune``). Before anything is timed our kernels for every
shape are compiled at once in ``--workers`` spawned processes (lmperf.flash.warm; its wall time is
``warm_compile_s``); with ``--precompile`` every shape then runs once first, and the seconds of
tuning and of what compilation is left are recorded apart from the timings. Without CUDA: an
``unsupported`` record.

    python -m lmperf.cells flash_leaderboard --device h100 --output results/h100/flash/leaderboard.json
"""

from __future__ import annotations

import argparse
import math
import sys
import timeit

import torch

from lmperf import device as devices
from lmperf.cells.common import base_parser, free_memory
from lmperf.cells.flash_benchmark import BENCH_IMPLEMENTATIONS  # noqa: F401 - one list of names
from lmperf.cells.flash_common import (
    BENCH_PASSES,
    KIND,
    NO_CUDA,
    bench_metrics,
    first_calls,
    refuse_interpreter_on_cuda,
    tuned_choices,
    tuning_settings,
    warm_kernels,
    warm_specs,
)
from lmperf.dtypes import dtype_name
from lmperf.record import PartialOutOfMemory, Unsupported, run_cell
from lmperf.units import MIB

LEADERBOARD_IMPLEMENTATIONS = ("flash_triton", "sdpa_flash", "sdpa_cudnn")


def leaderboard_measure(args, device: torch.device, settings: dict) -> dict:
    if device.type != "cuda":
        raise Unsupported(NO_CUDA.format(what="the leaderboard"))
    from lmperf.benchmarks import flash as bench

    refuse_interpreter_on_cuda()
    start = timeit.default_timer()
    shape = bench.LEADERBOARD_SHAPE
    dtype = shape["dtype"]
    metrics: dict = {
        "leaderboard_shape": {**shape, "dtype": dtype_name(dtype)},
        "implementations": list(args.implementations),
        "compiled": args.compile,
        "forward_batch": args.forward_batch,
        "forward_batch_note": (
            "the leaderboard's heads folded into the batch" if args.forward_batch == shape["batch"] else None
        ),
    }
    settings.update(tuning_settings(args.tune, args.autotune_warmup_ms, args.autotune_rep_ms))
    # every shape our kernel runs: the protocol's and the eager table's (all causal, in the shape's dtype)
    shapes = {(shape["batch"], shape["seq"], d) for d in args.protocol_head_dims}
    shapes |= {(args.forward_batch, args.forward_sequence_length, d) for d in args.forward_head_dims}
    if "flash_triton" in args.implementations:
        # compiled side by side before anything is timed (the torch.compile'd protocol calls the same
        # kernels: flash_forward and flash_backward run eagerly under it)
        metrics.update(warm_kernels(warm_specs(sorted(shapes), dtype_name(dtype), True), args.workers))
    if args.precompile and "flash_triton" in args.implementations:

        def run_once(s):
            q, k, v, do = bench.make_inputs(*s, dtype)
            bench.flash_triton(q, k, v, True).backward(do)

        metrics["first_runs"] = first_calls(run_once, sorted(shapes))
        free_memory(device)

    # Eager forward, backward and forward+backward at causal d = 64, 128 (forward TFLOP/s).
    table = []
    for d in args.forward_head_dims:
        for impl in args.implementations:
            torch.cuda.reset_peak_memory_stats()
            result = bench.time_attention(
                args.forward_batch,
                args.forward_sequence_length,
                d,
                dtype,
                True,
                impl,
                warmup_ms=args.table_warmup_ms,
                rep_ms=args.table_rep_ms,
            )
            row = {
                "implementation": impl,
                "head_dim": d,
                "batch_size": args.forward_batch,
                "sequence_length": args.forward_sequence_length,
                "causal": True,
                "precision": dtype_name(dtype),
                "status": result["status"],
                "error": result["error"],
                "peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB,
            }
            row.update(bench_metrics(result, args.forward_batch, args.forward_sequence_length, d, True, None))
            for p in BENCH_PASSES:
                row.pop(f"speedup_vs_plain_{p}", None)
            if impl == "flash_triton" and result["status"] == "ok":
                row["tiles"] = tuned_choices()
            print(f"[flash leaderboard] eager {impl} d={d}: {result}", file=sys.stderr, flush=True)
            table.append(row)
            free_memory(device)
    metrics["side_by_side"] = table

    # The course's protocol, each implementation in turn, in this one process, per head dim.
    by_head_dim = {}
    for d in args.protocol_head_dims:
        protocol = {}
        for impl in args.implementations:
            t0 = timeit.default_timer()
            result = bench.time_leaderboard(
                impl, compile=args.compile, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, head_dim=d
            )
            result["wall_s"] = timeit.default_timer() - t0
            if impl == "flash_triton":
                result["tiles"] = tuned_choices()
            print(f"[flash leaderboard] protocol {impl} d={d}: {result}", file=sys.stderr, flush=True)
            protocol[impl] = result
            free_memory(device)
        ours = protocol.get("flash_triton", {}).get("forward_backward_ms_median")
        for other in ("sdpa_flash", "sdpa_cudnn"):
            theirs = protocol.get(other, {}).get("forward_backward_ms_median")
            ok = ours is not None and theirs is not None and math.isfinite(ours) and math.isfinite(theirs)
            protocol[f"ratio_flash_triton_over_{other}"] = ours / theirs if ok else None
        by_head_dim[str(d)] = protocol
    metrics["protocol_by_head_dim"] = by_head_dim
    # the leaderboard's own shape (d = 64) at the top level, as the course reports it
    protocol = by_head_dim.get(str(shape["head_dim"])) or next(iter(by_head_dim.values()), {})
    metrics["protocol"] = {k: v for k, v in protocol.items() if not k.startswith("ratio_")}
    for other in ("sdpa_flash", "sdpa_cudnn"):
        metrics[f"ratio_flash_triton_over_{other}"] = protocol.get(f"ratio_flash_triton_over_{other}")
        for d, p in by_head_dim.items():
            metrics[f"ratio_flash_triton_over_{other}_d{d}"] = p.get(f"ratio_flash_triton_over_{other}")
    protocol = metrics["protocol"]
    for impl, result in protocol.items():
        metrics[f"{impl}_forward_backward_ms_median"] = result.get("forward_backward_ms_median")
    metrics["cell_wall_s"] = timeit.default_timer() - start
    if protocol.get("flash_triton", {}).get("status") == "oom":
        raise PartialOutOfMemory(
            f"out of memory in the leaderboard protocol: {protocol['flash_triton']['error']}", metrics
        )
    return metrics


def run(args) -> int:
    device = devices.check_device(args.device)
    settings = {key: value for key, value in vars(args).items() if key not in ("output", "func")}
    settings["protocol"] = (
        "lmperf.benchmarks.flash.time_leaderboard: f = torch.compile(impl); "
        "do_bench(lambda: f(q, k, v, True).sum().backward(), warmup, rep), median"
    )
    run_cell(
        KIND,
        {"test": "leaderboard"},
        args.output,
        lambda: devices.provenance(args.device, settings),
        lambda: leaderboard_measure(args, device, settings),
    )
    return 0


def parse_args(argv=None):
    parser = base_parser("the course's leaderboard protocol, ours against SDPA flash and cuDNN")
    parser.add_argument(
        "--implementations", nargs="+", choices=LEADERBOARD_IMPLEMENTATIONS, default=list(LEADERBOARD_IMPLEMENTATIONS)
    )
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--warmup-ms", type=float, default=1000)
    parser.add_argument("--rep-ms", type=float, default=10000)
    parser.add_argument(
        "--protocol-head-dims",
        type=int,
        nargs="+",
        default=[64, 128],
        help="head dims the protocol runs at (64 is the leaderboard's)",
    )
    parser.add_argument("--forward-head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--forward-sequence-length", type=int, default=16384)
    parser.add_argument("--forward-batch", type=int, default=16)
    parser.add_argument("--table-warmup-ms", type=float, default=25)
    parser.add_argument("--table-rep-ms", type=float, default=100)
    parser.add_argument(
        "--tune",
        choices=("off", "missing"),
        default="missing",
        help="missing: tune buckets without remembered tiles; off: remembered or heuristic tiles",
    )
    parser.add_argument("--autotune-warmup-ms", type=float, default=None, help="do_bench warm-up per tuning candidate")
    parser.add_argument("--autotune-rep-ms", type=float, default=None, help="do_bench rep per tuning candidate")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes that compile our kernels side by side before timing (default: CPUs - 1, at most 15)",
    )
    parser.add_argument(
        "--precompile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run every shape once before timing (tuning, compilation)",
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
