"""leaderboard: the course's protocol, ours against SDPA flash and SDPA cuDNN, side by side in one process.

The course asks only for our kernel's time at the leaderboard's shape; that part runs first and the
record keeps the process's age at its end (``course_part_process_age_s``), so the report's header
counts the rest (SDPA's backends, d = 128, the eager table: issue 12's comparisons) as this
project's additions.

One record: ``lmperf.kinds.flash.harness.time_leaderboard`` (torch.compile, bf16, causal, (16, 16384, 64),
do_bench rep 10 s) for our kernel, SDPA flash and SDPA cuDNN, their medians and the ratios
ours/flash and ours/cuDNN; the same protocol at the other ``--protocol-head-dims`` (128: the
issue's second comparison) under ``protocol_by_head_dim``; plus forward, backward and
forward+backward time and TFLOP/s of each at causal head dims ``--forward-head-dims``, length
16384, batch ``--forward-batch`` (16: the leaderboard's heads folded into the batch), eager. Our
tiles come from lmperf.kernels.flash.tuning (``--tune``). Our kernels are compiled in ``--workers`` spawned
processes (lmperf.kernels.flash.warm) in two pools: the course's shape's before its protocol run, every
other shape's after it (``warm_compile_s`` adds up both pools' wall time); with ``--precompile`` each
shape then runs once before it is timed, and the seconds of tuning and of what compilation is left
are recorded apart from the timings. Without CUDA: an ``unsupported`` record.

    python -m lmperf flash_leaderboard --device h100 --output results/h100/flash/leaderboard.json
"""

from __future__ import annotations

import math
import sys
import timeit

import torch

from lmperf.core import device as devices
from lmperf.core.cell import free_memory, parse_job
from lmperf.core.dtypes import dtype_name
from lmperf.core.record import PartialOutOfMemory, Unsupported
from lmperf.core.units import MIB
from lmperf.kernels.flash.warm import warm_kernels, warm_specs
from lmperf.kinds.flash.benchmark import BENCH_IMPLEMENTATIONS  # noqa: F401 - one list of names
from lmperf.kinds.flash.common import (
    BENCH_PASSES,
    KIND,
    NO_CUDA,
    bench_metrics,
    first_calls,
    refuse_interpreter_on_cuda,
    tuned_choices,
    tuning_settings,
)

LEADERBOARD_IMPLEMENTATIONS = ("flash_triton", "sdpa_flash", "sdpa_cudnn")


def _merge_warm(parts: list[dict]) -> dict:
    """One record's warm-up metrics from the warm-ups of its parts: seconds, tasks, combinations and
    shapes added up, the largest pool; an error kept."""
    out: dict = {}
    for part in parts:
        for key, value in part.items():
            if key == "warm_compile_error":
                out[key] = value
            elif key == "warm_compile_workers":
                out[key] = max(out.get(key, 0), value)
            else:
                out[key] = out.get(key, 0) + value
    return out


def _merge_first_runs(parts: list[dict]) -> dict:
    """One record's ``first_runs`` from those of its parts (``flash_common.first_calls``)."""
    out: dict = {"first_call_s": {}, "tuning_s": 0.0, "tile_sources": {}, "compile_and_first_run_s": 0.0}
    for part in parts:
        out["first_call_s"].update(part["first_call_s"])
        out["tuning_s"] += part["tuning_s"]
        out["compile_and_first_run_s"] += part["compile_and_first_run_s"]
        for source, count in part["tile_sources"].items():
            out["tile_sources"][source] = out["tile_sources"].get(source, 0) + count
    return out


def leaderboard_measure(args, device: torch.device, labels: dict) -> dict:
    """The course's part first (our kernel under the course's protocol at the leaderboard's shape: its
    warm-up, first run and do_bench), then the process's age (``course_part_process_age_s``: the
    report's header counts the rest of the process as this project's additions), then the rest: the
    eager side-by-side table, SDPA's two backends under the same protocol, the other head dims."""
    if device.type != "cuda":
        raise Unsupported(NO_CUDA.format(what="the leaderboard"))
    from lmperf.kinds.flash import harness as bench

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
    metrics.update(labels, **tuning_settings(args.tune, args.autotune_warmup_ms, args.autotune_rep_ms))
    ours = "flash_triton" in args.implementations
    course_d = shape["head_dim"]
    course_part = ours and course_d in args.protocol_head_dims
    # every shape our kernel runs: the protocol's and the eager table's (all causal, in the shape's dtype)
    course_shapes = {(shape["batch"], shape["seq"], course_d)} if course_part else set()
    shapes = {(shape["batch"], shape["seq"], d) for d in args.protocol_head_dims}
    shapes |= {(args.forward_batch, args.forward_sequence_length, d) for d in args.forward_head_dims}
    warmed, first_runs = [], []

    def prepare(part: set) -> None:
        """Compile our kernels for `part`'s shapes side by side (the torch.compile'd protocol calls the
        same kernels: flash_forward and flash_backward run eagerly under it), then run each once."""
        if not (ours and part):
            return
        warmed.append(warm_kernels(warm_specs(sorted(part), dtype_name(dtype), True), args.workers))
        if args.precompile:

            def run_once(s):
                q, k, v, do = bench.make_inputs(*s, dtype)
                bench.flash_triton(q, k, v, True).backward(do)

            first_runs.append(first_calls(run_once, sorted(part)))
            free_memory(device)

    def protocol_run(impl: str, d: int) -> dict:
        t0 = timeit.default_timer()
        result = bench.time_leaderboard(
            impl, compile=args.compile, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, head_dim=d
        )
        result["wall_s"] = timeit.default_timer() - t0
        if impl == "flash_triton":
            result["tiles"] = tuned_choices()
        print(f"[flash leaderboard] protocol {impl} d={d}: {result}", file=sys.stderr, flush=True)
        free_memory(device)
        return result

    # The course's part: our kernel, the course's protocol, the leaderboard's own shape.
    protocols: dict[int, dict] = {d: {} for d in args.protocol_head_dims}
    if course_part:
        prepare(course_shapes)
        protocols[course_d]["flash_triton"] = protocol_run("flash_triton", course_d)
        metrics["course_part_process_age_s"] = devices.process_age_s()
    prepare(shapes - course_shapes)

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
            protocol[impl] = protocols[d].get(impl) or protocol_run(impl, d)
        ours_ms = protocol.get("flash_triton", {}).get("forward_backward_ms_median")
        for other in ("sdpa_flash", "sdpa_cudnn"):
            theirs = protocol.get(other, {}).get("forward_backward_ms_median")
            ok = ours_ms is not None and theirs is not None and math.isfinite(ours_ms) and math.isfinite(theirs)
            protocol[f"ratio_flash_triton_over_{other}"] = ours_ms / theirs if ok else None
        by_head_dim[str(d)] = protocol
    metrics.update(_merge_warm(warmed))
    if first_runs:
        metrics["first_runs"] = _merge_first_runs(first_runs)
    metrics["protocol_by_head_dim"] = by_head_dim
    # the leaderboard's own shape (d = 64) at the top level, as the course reports it
    protocol = by_head_dim.get(str(course_d)) or next(iter(by_head_dim.values()), {})
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


def run(job) -> int:
    args = job.args
    device = devices.check_device(args.device)
    labels = {
        "protocol": (
            "lmperf.kinds.flash.harness.time_leaderboard: f = torch.compile(impl); "
            "do_bench(lambda: f(q, k, v, True).sum().backward(), warmup, rep), median"
        )
    }
    job.write(KIND, {"test": "leaderboard"}, lambda: leaderboard_measure(args, device, labels))
    return 0


def main(argv=None) -> int:
    return run(parse_job("flash_leaderboard", argv, __doc__.splitlines()[0]))


if __name__ == "__main__":
    sys.exit(main())
