"""FlashAttention-2 cells: correctness (flash_forward, flash_backward), flash_benchmarking, leaderboard.

Three subcommands, each one process:

``correctness``  one record per implementation (``pytorch``: the tiled autograd.Function;
    ``triton``: the Triton forward and backward kernels). Over every precision × head dim ×
    causal × shape (batch, n_queries, n_keys) of the grid, on fresh random inputs (the seed is in
    the record, one per entry), it runs forward and backward through the autograd.Function and
    records the relative Frobenius error of O, L, dQ, dK and dV against float64 attention on the
    same rounded inputs (``lmperf.flash.reference.reference_with_grads``), the tolerance it is held
    to, and the saved-tensor contract (exactly one saved tensor of L's shape (batch, n_queries), in
    float32). Each entry gets a status: ``ok`` (within tolerance, contract kept), ``fail``, ``oom``
    or ``error`` (the exception; an entry's error does not stop the others). On a CPU the Triton
    kernels run in Triton's interpreter: this process sets TRITON_INTERPRET=1 before Triton is
    first imported. Entries run in groups of (precision, head dim), spread over ``--workers``
    processes (spawned: they compile their kernels in parallel). The Triton autotuners are pinned
    to one tile config per kernel (``CORRECTNESS_TILES``, recorded; ``--triton-tiles autotuned``
    leaves them alone), so the grid does not autotune every shape, and a CPU run checks the very
    tiles a GPU run compiles; the benchmark exercises the autotuned tilings.

``benchmark``  one record per (implementation, head dim, sequence length) of one precision:
    forward, backward and forward+backward median milliseconds from
    ``lmperf.flash.bench.time_attention`` (``triton.testing.do_bench``, inputs made before
    timing), TFLOP/s by ``lmperf.flops``, and the speed-up over ``plain`` (timed first, in the
    same process) stored with each timing. ``sdpa`` is PyTorch's fused attention pinned to the
    backend ``--sdpa-backend`` names (the flash backend takes only fp16/bf16: fp32 runs the
    memory-efficient one); the record names what ran. Before timing, every autotune candidate of
    the Triton kernels is compiled for each head dim in parallel processes
    (``lmperf.flash.bench.precompile``), and the autotuners benchmark candidates with a shorter
    ``do_bench`` (``--autotune-warmup-ms``/``--autotune-rep-ms``) so per-shape tuning does not
    dominate. Out of memory is a record with status ``oom`` (and what was timed before); an
    implementation that raises (e.g. an SDPA backend that refuses the shape) a record with status
    ``unsupported`` whose reason holds the exception.

``leaderboard``  one record: the course's protocol (``lmperf.flash.bench.time_leaderboard``:
    torch.compile, bf16, causal, (16, 16384, 64), do_bench rep 10 s) for our kernel, SDPA flash and
    SDPA cuDNN side by side in the same process, their medians and the ratios ours/flash and
    ours/cuDNN; plus forward, backward and forward+backward time and TFLOP/s of each at causal
    head dims 64 and 128, length 16384, batch ``--forward-batch`` (16: the leaderboard's heads
    folded into the batch), eager.

Without CUDA, ``benchmark`` and ``leaderboard`` write ``unsupported`` records.

    python -m lmperf.cells.flash correctness --device cpu --implementation triton \\
        --output results/cpu/flash/correctness_triton.json --precisions fp32 bf16 \\
        --head-dims 16 32 --causal false true --shapes 2x64x64 1x45x77
    python -m lmperf.cells.flash benchmark --device h100 --precision bf16 --sdpa-backend FLASH_ATTENTION \\
        --output 'results/h100/flash/bench_{impl}_bf16_d{head_dim}_n{seq_len}.json' \\
        --implementations plain flash_triton sdpa --head-dims 64 --sequence-lengths 1024 4096
    python -m lmperf.cells.flash leaderboard --device h100 --output results/h100/flash/leaderboard.json
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import timeit
import traceback

import torch

from lmperf import device as devices
from lmperf.cells.common import base_parser, free_memory
from lmperf.record import PartialOutOfMemory, Unsupported, is_out_of_memory, run_cell

KIND = "flash"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISION_OF = {dtype: name for name, dtype in DTYPES.items()}
TENSORS = ("O", "L", "dQ", "dK", "dV")
CORRECTNESS_IMPLEMENTATIONS = ("pytorch", "triton")
# Relative Frobenius error allowed, (O and L, gradients), per implementation and input dtype: the
# tolerances of tests/test_flash_pytorch.py and tests/test_flash_triton.py. Compiled for a GPU,
# float32 tl.dot runs in TF32 (10-bit mantissa); the interpreter multiplies in full float32.
TOLERANCES = {
    "pytorch": {"fp32": (1e-5, 1e-4), "bf16": (2e-2, 3e-2), "fp16": (5e-3, 5e-3)},
    "triton_interpreted": {"fp32": (1e-5, 1e-4), "bf16": (2e-2, 3e-2), "fp16": (5e-3, 1e-2)},
    "triton_compiled": {"fp32": (2e-3, 5e-3), "bf16": (2e-2, 3e-2), "fp16": (5e-3, 1e-2)},
}
# One tile config per kernel for the correctness grid on CUDA (autotuning every dtype x head dim x
# causal x shape would compile and time ~26 candidates each): the smallest candidates of the
# autotune lists, the ones that fit shared memory for float32 at d=128.
CORRECTNESS_TILES = {
    "fwd": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
    "dkdv": {"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    "dq": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
}
BENCH_PASSES = ("forward", "backward", "forward_backward")
BASELINE = "plain"
# Benchmark implementation names -> lmperf.flash.bench.IMPLEMENTATIONS names; `sdpa` resolves to
# the backend of --sdpa-backend.
SDPA_BACKEND_IMPLEMENTATIONS = {"FLASH_ATTENTION": "sdpa_flash", "CUDNN_ATTENTION": "sdpa_cudnn",
                                "EFFICIENT_ATTENTION": "sdpa_efficient", "MATH": "sdpa_math"}
BENCH_IMPLEMENTATIONS = ("plain", "flash_triton", "sdpa", *SDPA_BACKEND_IMPLEMENTATIONS.values())
LEADERBOARD_IMPLEMENTATIONS = ("flash_triton", "sdpa_flash", "sdpa_cudnn")
NO_CUDA = ("no CUDA device: {what} times CUDA kernels with triton.testing.do_bench (CUDA events); "
           "it runs on the GPU grid")
MIB = 2**20
MAX_WORKERS = 15


# --- shared helpers ---------------------------------------------------------------------------------


def default_workers() -> int:
    """Processes for parallel Triton compilation: the CPUs this process may use, less one, at most 15."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 2
    return max(1, min(MAX_WORKERS, cpus - 1))


def use_interpreter_without_cuda(device: torch.device) -> bool:
    """Turn Triton's interpreter on for a CPU run, before Triton is first imported.

    triton.jit reads TRITON_INTERPRET when a kernel is decorated, so it must be set before
    lmperf.flash's Triton modules load; spawned worker processes inherit it. Returns whether it is on.
    """
    if device.type == "cuda":
        return os.environ.get("TRITON_INTERPRET") == "1"
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 could be set: run this cell in "
                           "its own process (python -m lmperf.cells.flash …)")
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def refuse_interpreter_on_cuda() -> None:
    """Timings of interpreted kernels would be the interpreter's: refuse them."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1 is set: unset it to time the compiled Triton kernels")


def tuned_kernels() -> dict:
    """The three autotuned Triton kernels by short name."""
    from lmperf.flash import triton_backward, triton_forward

    return {"fwd": triton_forward.flash_fwd_kernel_tuned, "dkdv": triton_backward.flash_bwd_dkdv_kernel_tuned,
            "dq": triton_backward.flash_bwd_dq_kernel_tuned}


def _config_dict(config) -> dict:
    return {k: v for k, v in config.all_kwargs().items() if v is not None}


def pin_tiles(tiles: dict) -> dict:
    """Make each autotuner run one config (a single-config autotuner never benchmarks)."""
    import triton

    for name, kernel in tuned_kernels().items():
        t = dict(tiles[name])
        kernel.configs = [triton.Config({"BLOCK_M": t.pop("BLOCK_M"), "BLOCK_N": t.pop("BLOCK_N")}, **t)]
        kernel.cache.clear()
    return {name: [_config_dict(c) for c in kernel.configs] for name, kernel in tuned_kernels().items()}


def set_autotune_benchmark(warmup_ms: float | None, rep_ms: float | None) -> dict:
    """Benchmark autotune candidates with do_bench(warmup=warmup_ms, rep=rep_ms) instead of Triton's
    default (25 ms, 100 ms per candidate). Returns what was applied, for the record."""
    if warmup_ms is None and rep_ms is None:
        return {"autotune_do_bench": "triton default"}
    from triton.testing import do_bench

    bench = functools.partial(do_bench, warmup=warmup_ms if warmup_ms is not None else 25,
                              rep=rep_ms if rep_ms is not None else 100)
    applied = True
    for kernel in tuned_kernels().values():
        try:
            kernel.do_bench = bench  # a cached_property in Triton 3.x: the instance attribute wins
        except AttributeError:  # a read-only property in some other version: set what it reads
            kernel._do_bench = bench
        applied = applied and kernel.do_bench is bench
    return {"autotune_do_bench": f"do_bench(warmup={bench.keywords['warmup']}, rep={bench.keywords['rep']})"
            if applied else "triton default (override not accepted by this Triton)"}


def autotuned_configs() -> dict:
    """The config each autotuned kernel used in its last launch."""
    out = {}
    for name, kernel in tuned_kernels().items():
        best = getattr(kernel, "best_config", None)
        out[name] = _config_dict(best) if best is not None else None
    return out


def precompile_shapes(shapes, workers: int) -> dict:
    """Compile every autotune candidate for the shapes in parallel (lmperf.flash.bench.precompile).

    Only an optimisation (the autotuner would compile the same kernels one by one): a failure of
    the pool is recorded and timing goes on.
    """
    from lmperf.flash import bench

    start = timeit.default_timer()
    out = {"precompile_shapes": [[b, n, d, str(t).replace("torch.", ""), c] for b, n, d, t, c in shapes],
           "precompile_workers": workers}
    try:
        failed = bench.precompile(shapes, workers=workers)
        out["precompile_failed_candidates"] = [[k, str(c), e] for k, c, e in failed]
    except Exception as exc:  # noqa: BLE001 - optional speed-up; the timings do not depend on it
        traceback.print_exc(file=sys.stderr)
        out["precompile_error"] = f"{type(exc).__name__}: {exc}"[:500]
    out["precompile_s"] = timeit.default_timer() - start
    print(f"[flash] precompiled {len(shapes)} shape(s) in {out['precompile_s']:.1f} s", file=sys.stderr, flush=True)
    return out


# --- correctness --------------------------------------------------------------------------------------


def parse_shape(text: str) -> tuple[int, int, int]:
    """'2x1024x1000' -> (batch, n_queries, n_keys)."""
    try:
        batch, n_q, n_k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be BATCHxN_QUERIESxN_KEYS, got {text!r}") from None
    if batch < 1 or n_q < 2 or n_k < 2:
        # one key makes dQ and dK exactly zero: a relative error is undefined
        raise argparse.ArgumentTypeError(f"need batch >= 1 and at least 2 queries and 2 keys, got {text!r}")
    return batch, n_q, n_k


def parse_bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def correctness_specs(args, seed: int) -> list[dict]:
    """Every entry of the grid, each with its own seed (seed + index)."""
    specs = []
    for precision in args.precisions:
        for head_dim in args.head_dims:
            for causal in args.causal:
                for batch, n_q, n_k in args.shapes:
                    specs.append(dict(precision=precision, head_dim=head_dim, causal=causal, batch=batch,
                                      n_queries=n_q, n_keys=n_k, seed=seed + len(specs)))
    return specs


def tolerance_key(implementation: str, interpreted: bool) -> str:
    if implementation == "pytorch":
        return "pytorch"
    return "triton_interpreted" if interpreted else "triton_compiled"


def _function(implementation: str):
    if implementation == "pytorch":
        from lmperf.flash import FlashAttention2PyTorch

        return FlashAttention2PyTorch
    from lmperf.flash.autograd import FlashAttention2Triton

    return FlashAttention2Triton


def run_entry(fn, spec: dict, device: torch.device, tolerance: tuple[float, float]) -> dict:
    """One entry: forward and backward through ``fn``, errors against float64, the saved tensors."""
    from lmperf.flash.reference import reference_with_grads, relative_error

    start = timeit.default_timer()
    entry = dict(spec, tolerance_o_l=tolerance[0], tolerance_grad=tolerance[1])
    dtype = DTYPES[spec["precision"]]
    batch, n_q, n_k, d = spec["batch"], spec["n_queries"], spec["n_keys"], spec["head_dim"]
    q = k = v = do = o = qg = kg = vg = saved = ref = None
    try:
        gen = torch.Generator().manual_seed(spec["seed"])  # on the CPU: the same inputs on any device
        q, k, v, do = (torch.randn(batch, n, d, generator=gen).to(device, dtype) for n in (n_q, n_k, n_k, n_q))
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        o = fn.apply(qg, kg, vg, spec["causal"])
        saved = o.grad_fn.saved_tensors
        o.backward(do)
        l_like = [t for t in saved if tuple(t.shape) == (batch, n_q)]
        entry.update(saved_tensor_count=len(saved), saved_l_shaped_count=len(l_like),
                     saved_l_dtype=str(l_like[0].dtype).replace("torch.", "") if l_like else None)
        entry["saved_contract_ok"] = len(l_like) == 1 and l_like[0].dtype == torch.float32
        lse = l_like[0] if len(l_like) == 1 else None
        ref = reference_with_grads(q, k, v, do, spec["causal"])
        got = (o.detach(), lse, qg.grad, kg.grad, vg.grad)
        failed = []
        for name, g, r in zip(TENSORS, got, ref):
            error = relative_error(g, r) if g is not None and g.shape == r.shape else None
            entry[f"{name}_rel_error"] = error
            limit = tolerance[0] if name in ("O", "L") else tolerance[1]
            if error is None or not math.isfinite(error) or error >= limit:
                failed.append(f"{name} error {error if error is None else f'{error:.2e}'} >= {limit:.0e}")
        entry["output_dtype_ok"] = o.dtype == dtype and all(g.dtype == dtype for g in got[2:])
        if not entry["output_dtype_ok"]:
            failed.append("O or a gradient is not in the input dtype")
        if not entry["saved_contract_ok"]:
            failed.append(f"saved {len(l_like)} tensor(s) of L's shape (dtype {entry['saved_l_dtype']}), "
                          "want exactly one in float32")
        entry["status"] = "fail" if failed else "ok"
        entry["failed_checks"] = failed
    except Exception as exc:  # noqa: BLE001 - recorded per entry; the grid goes on
        if is_out_of_memory(exc):
            entry.update(status="oom", message=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        else:
            traceback.print_exc(file=sys.stderr)
            entry.update(status="error", message=f"{type(exc).__name__}: {exc}"[:500])
    q = k = v = do = o = qg = kg = vg = saved = ref = None
    free_memory(device)
    entry["entry_wall_s"] = timeit.default_timer() - start
    return entry


def correctness_group(implementation: str, specs: list[dict], device_type: str, tiles: dict | None,
                      tolerance: tuple | None = None) -> list[dict]:
    """Run a group of entries in this process (also the worker function of the process pool)."""
    device = torch.device(device_type)
    interpreted = False
    if implementation == "triton":
        from lmperf.flash.triton_forward import INTERPRETED

        interpreted = INTERPRETED
        if tiles is not None:
            pin_tiles(tiles)
    fn = _function(implementation)
    entries = []
    for spec in specs:
        tol = tolerance or TOLERANCES[tolerance_key(implementation, interpreted)][spec["precision"]]
        entry = run_entry(fn, spec, device, tol)
        print(f"[flash correctness {implementation}] {spec['precision']} d={spec['head_dim']} "
              f"causal={spec['causal']} {spec['batch']}x{spec['n_queries']}x{spec['n_keys']}: {entry['status']}"
              + (f" {entry.get('failed_checks') or entry.get('message')}" if entry["status"] != "ok" else ""),
              file=sys.stderr, flush=True)
        entries.append(entry)
    return entries


def _groups(specs: list[dict]) -> list[list[dict]]:
    """Entries grouped by (precision, head dim): each group compiles its own kernels."""
    groups: dict[tuple, list[dict]] = {}
    for spec in specs:
        groups.setdefault((spec["precision"], spec["head_dim"]), []).append(spec)
    return list(groups.values())


def summarize_correctness(entries: list[dict]) -> dict:
    """Counts per status and the largest error of each tensor per precision."""
    counts = {s: sum(e["status"] == s for e in entries) for s in ("ok", "fail", "oom", "error")}
    largest: dict[str, dict] = {}
    nonfinite = 0
    for e in entries:
        for name in TENSORS:
            error = e.get(f"{name}_rel_error")
            if error is not None and not math.isfinite(error):
                nonfinite += 1  # a failed entry already; kept out of the maxima
            elif error is not None:
                slot = largest.setdefault(e["precision"], {})
                slot[f"{name}_rel_error"] = max(slot.get(f"{name}_rel_error", 0.0), error)
    ran = [e for e in entries if "saved_contract_ok" in e]
    return {
        "entries": len(entries),
        **{f"entries_{s}": n for s, n in counts.items()},
        "all_within_tolerance": counts["ok"] == len(entries),
        "max_rel_error_by_precision": largest,
        "nonfinite_errors": nonfinite,
        "saved_contract_ok_entries": sum(bool(e["saved_contract_ok"]) for e in ran),
        "saved_contract_checked_entries": len(ran),
    }


def correctness_measure(args, device: torch.device, seed: int) -> dict:
    start = timeit.default_timer()
    interpreted = False
    if args.implementation == "triton":
        try:
            import triton  # noqa: F401
        except ImportError:
            raise Unsupported("Triton is not installed") from None
        from lmperf.flash.triton_forward import INTERPRETED

        interpreted = INTERPRETED
        if device.type != "cuda" and not interpreted:
            raise RuntimeError("the Triton kernels need CUDA or TRITON_INTERPRET=1 (set by this cell on CPU)")
    specs = correctness_specs(args, seed)
    tiles = CORRECTNESS_TILES if args.implementation == "triton" and args.triton_tiles == "pinned" else None
    groups = _groups(specs)
    workers = min(args.workers or default_workers(), len(groups))
    if workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(correctness_group, args.implementation, g, device.type, tiles) for g in groups]
            entries = [e for f in futures for e in f.result()]
    else:
        entries = [e for g in groups for e in correctness_group(args.implementation, g, device.type, tiles)]
    metrics = {
        "implementation": args.implementation,
        "function": _function(args.implementation).__name__,
        "kernel_mode": ("pytorch" if args.implementation == "pytorch"
                        else "triton interpreter (TRITON_INTERPRET=1)" if interpreted else "triton compiled"),
        "seed": seed,
        "reference": "lmperf.flash.reference.attention_reference in float64 on the same rounded inputs",
        "error_measure": "relative Frobenius norm ||x - ref||_F / ||ref||_F",
        "tolerances": TOLERANCES[tolerance_key(args.implementation, interpreted)],
        "workers": workers,
    }
    if args.implementation == "triton":
        if tiles is not None:
            metrics["triton_tiles"] = tiles
        else:  # the autotune candidates (the interpreter's: one config per kernel)
            metrics["triton_tiles"] = {name: [_config_dict(c) for c in kernel.configs]
                                       for name, kernel in tuned_kernels().items()}
    metrics.update(summarize_correctness(entries))
    metrics["entries_detail"] = entries
    metrics["cell_wall_s"] = timeit.default_timer() - start
    return metrics


def correctness_main(args) -> int:
    device = devices.check_device(args.device)
    if args.implementation == "triton":
        use_interpreter_without_cuda(device)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    settings = {key: value for key, value in vars(args).items() if key not in ("output", "func")}
    settings["seed"] = seed
    cell = {"test": "correctness", "implementation": args.implementation}
    run_cell(KIND, cell, args.output, lambda: devices.provenance(args.device, settings),
             lambda: correctness_measure(args, device, seed))
    return 0


# --- benchmark ----------------------------------------------------------------------------------------


def bench_implementation(name: str, sdpa_backend: str) -> str:
    """The lmperf.flash.bench name a benchmark implementation runs as (registering SDPA backends)."""
    from lmperf.flash import bench

    if name == "sdpa":
        name = SDPA_BACKEND_IMPLEMENTATIONS[sdpa_backend]
    if name not in bench.IMPLEMENTATIONS:
        backend = next(b for b, n in SDPA_BACKEND_IMPLEMENTATIONS.items() if n == name)
        bench.IMPLEMENTATIONS[name] = bench._sdpa(backend)
    return name


def bench_metrics(result: dict, batch: int, seq: int, head_dim: int, causal: bool, baseline: dict | None) -> dict:
    """Times, FLOPs, TFLOP/s and speed-ups over the baseline for one time_attention result."""
    from lmperf.flash.bench import attention_flops, tflops_per_s

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


def time_one(impl: str, ran: str, args, head_dim: int, seq: int, baseline: dict | None, extra: dict) -> dict:
    """Time one implementation at one shape; raise PartialOutOfMemory / Unsupported for the record."""
    from lmperf.flash import bench

    dtype = DTYPES[args.precision]
    torch.cuda.reset_peak_memory_stats()
    start = timeit.default_timer()
    result = bench.time_attention(args.batch_size, seq, head_dim, dtype, args.causal, ran,
                                  warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
    metrics = {"ran": ran, "batch_size": args.batch_size, "head_dim": head_dim, "sequence_length": seq,
               "causal": args.causal, "timing_status": result["status"]}
    if ran.startswith("sdpa_"):
        metrics["sdpa_backend"] = next(b for b, n in SDPA_BACKEND_IMPLEMENTATIONS.items() if n == ran)
    metrics.update(bench_metrics(result, args.batch_size, seq, head_dim, args.causal, baseline))
    metrics["peak_allocated_mib"] = torch.cuda.max_memory_allocated() / MIB
    metrics["cell_wall_s"] = timeit.default_timer() - start
    if impl == "flash_triton" and result["status"] == "ok":
        metrics["autotuned_configs"] = autotuned_configs()
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


class UnsupportedWithMetrics(Unsupported):
    """An implementation refused this shape; run_cell records `unsupported` (the reason holds the error)."""

    def __init__(self, reason: str, metrics: dict):
        super().__init__(reason)
        self.metrics = metrics


def _record(cell: dict, output: str, settings: dict, args, measure) -> dict:
    """run_cell, keeping the metrics of an UnsupportedWithMetrics (run_cell drops an Unsupported's)."""
    kept = {}

    def wrapped():
        try:
            return measure()
        except UnsupportedWithMetrics as exc:
            kept.update(exc.metrics)
            raise

    record = run_cell(KIND, cell, output, lambda: devices.provenance(args.device, settings), wrapped)
    if kept and record["status"] == "unsupported":
        from lmperf.record import make_record, write_record

        record = make_record(KIND, cell, "unsupported", kept, record["provenance"], record["reason"])
        write_record(output, record)
    return record


def benchmark_main(args) -> int:
    device = devices.check_device(args.device)
    settings = {key: value for key, value in vars(args).items() if key not in ("output", "func")}
    settings["timing"] = ("lmperf.flash.bench.time_attention: do_bench medians (CUDA events); backward on one "
                          "retained graph, input grads set to None outside the timed region")
    impls = sorted(args.implementations, key=lambda impl: impl != BASELINE)  # plain first: the speed-ups need it
    cells = [(d, n, impl) for d in args.head_dims for n in sorted(args.sequence_lengths) for impl in impls]
    if device.type != "cuda":
        for d, n, impl in cells:
            cell = bench_cell(args, impl, d, n)
            run_cell(KIND, cell, args.output.format(impl=impl, head_dim=d, seq_len=n),
                     lambda: devices.provenance(args.device, settings),
                     functools.partial(_raise_unsupported, NO_CUDA.format(what="flash_benchmarking")))
        return 0
    refuse_interpreter_on_cuda()
    extra = {}
    if "flash_triton" in args.implementations:
        settings.update(set_autotune_benchmark(args.autotune_warmup_ms, args.autotune_rep_ms))
        if args.precompile:
            extra = precompile_shapes(precompile_set(args.batch_size, args.sequence_lengths, args.head_dims,
                                                     DTYPES[args.precision], args.causal),
                                      args.workers or default_workers())
    baseline: dict[tuple, dict | None] = {}
    for d, n, impl in cells:
        ran = bench_implementation(impl, args.sdpa_backend)
        base = baseline.get((d, n)) if impl != BASELINE else None
        cell = bench_cell(args, impl, d, n)
        record = _record(cell, args.output.format(impl=impl, head_dim=d, seq_len=n), settings, args,
                         functools.partial(time_one, impl, ran, args, d, n, base,
                                           extra if impl == "flash_triton" else {}))
        if impl == BASELINE:  # out of memory in backward still leaves its forward to compare with
            baseline[(d, n)] = record["metrics"]
    return 0


def _raise_unsupported(reason: str):
    raise Unsupported(reason)


def bench_cell(args, impl: str, head_dim: int, seq: int) -> dict:
    return {"test": "benchmark", "implementation": impl, "precision": args.precision, "head_dim": head_dim,
            "sequence_length": seq, "batch_size": args.batch_size, "causal": args.causal}


def precompile_set(batch: int, lengths, head_dims, dtype, causal: bool) -> list[tuple]:
    """One shape per compiled specialisation: Triton specialises integer arguments on divisibility
    by 16 (and batch == 1), so one length per class stands for all of them."""
    classes = {}
    for n in sorted(lengths):
        classes.setdefault(n % 16 == 0, n)
    return [(batch, n, d, dtype, causal) for d in head_dims for n in classes.values()]


# --- leaderboard --------------------------------------------------------------------------------------


def leaderboard_measure(args, device: torch.device, settings: dict) -> dict:
    if device.type != "cuda":
        raise Unsupported(NO_CUDA.format(what="the leaderboard"))
    from lmperf.flash import bench

    refuse_interpreter_on_cuda()
    start = timeit.default_timer()
    shape = bench.LEADERBOARD_SHAPE
    dtype = shape["dtype"]
    metrics: dict = {"leaderboard_shape": {**shape, "dtype": PRECISION_OF[dtype]},
                     "implementations": list(args.implementations), "compiled": args.compile,
                     "forward_batch": args.forward_batch,
                     "forward_batch_note": ("the leaderboard's heads folded into the batch"
                                            if args.forward_batch == shape["batch"] else None)}
    settings.update(set_autotune_benchmark(args.autotune_warmup_ms, args.autotune_rep_ms))
    if args.precompile and "flash_triton" in args.implementations:
        shapes = {(shape["batch"], shape["seq"], shape["head_dim"], dtype, shape["causal"])}
        shapes |= {(args.forward_batch, args.forward_sequence_length, d, dtype, True) for d in args.forward_head_dims}
        metrics.update(precompile_shapes(sorted(shapes, key=str), args.workers or default_workers()))

    # Eager forward, backward and forward+backward at causal d = 64, 128 (forward TFLOP/s).
    table = []
    for d in args.forward_head_dims:
        for impl in args.implementations:
            torch.cuda.reset_peak_memory_stats()
            result = bench.time_attention(args.forward_batch, args.forward_sequence_length, d, dtype, True, impl,
                                          warmup_ms=args.table_warmup_ms, rep_ms=args.table_rep_ms)
            row = {"implementation": impl, "head_dim": d, "batch_size": args.forward_batch,
                   "sequence_length": args.forward_sequence_length, "causal": True,
                   "precision": PRECISION_OF[dtype],
                   "status": result["status"], "error": result["error"],
                   "peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB}
            row.update(bench_metrics(result, args.forward_batch, args.forward_sequence_length, d, True, None))
            for p in BENCH_PASSES:
                row.pop(f"speedup_vs_plain_{p}", None)
            if impl == "flash_triton" and result["status"] == "ok":
                row["autotuned_configs"] = autotuned_configs()
            print(f"[flash leaderboard] eager {impl} d={d}: {result}", file=sys.stderr, flush=True)
            table.append(row)
            free_memory(device)
    metrics["side_by_side"] = table

    # The course's protocol, each implementation in turn, in this one process.
    protocol = {}
    for impl in args.implementations:
        t0 = timeit.default_timer()
        result = bench.time_leaderboard(impl, compile=args.compile, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
        result["wall_s"] = timeit.default_timer() - t0
        print(f"[flash leaderboard] protocol {impl}: {result}", file=sys.stderr, flush=True)
        protocol[impl] = result
        free_memory(device)
    metrics["protocol"] = protocol
    ours = protocol.get("flash_triton", {}).get("forward_backward_ms_median")
    for other in ("sdpa_flash", "sdpa_cudnn"):
        theirs = protocol.get(other, {}).get("forward_backward_ms_median")
        ok = ours is not None and theirs is not None and math.isfinite(ours) and math.isfinite(theirs)
        metrics[f"ratio_flash_triton_over_{other}"] = ours / theirs if ok else None
    for impl, result in protocol.items():
        metrics[f"{impl}_forward_backward_ms_median"] = result.get("forward_backward_ms_median")
    metrics["cell_wall_s"] = timeit.default_timer() - start
    if protocol.get("flash_triton", {}).get("status") == "oom":
        raise PartialOutOfMemory("out of memory in the leaderboard protocol: "
                                 f"{protocol['flash_triton']['error']}", metrics)
    return metrics


def leaderboard_main(args) -> int:
    device = devices.check_device(args.device)
    settings = {key: value for key, value in vars(args).items() if key not in ("output", "func")}
    settings["protocol"] = ("lmperf.flash.bench.time_leaderboard: f = torch.compile(impl); "
                            "do_bench(lambda: f(q, k, v, True).sum().backward(), warmup, rep), median")
    run_cell(KIND, {"test": "leaderboard"}, args.output, lambda: devices.provenance(args.device, settings),
             lambda: leaderboard_measure(args, device, settings))
    return 0


# --- command line -------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name, help_text):
        return sub.add_parser(name, parents=[base_parser(help_text)], add_help=False, help=help_text,
                              description=help_text)

    c = command("correctness", "FlashAttention-2 against float64 attention (flash_forward, flash_backward)")
    c.add_argument("--implementation", required=True, choices=CORRECTNESS_IMPLEMENTATIONS)
    c.add_argument("--precisions", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16", "fp16"])
    c.add_argument("--head-dims", type=int, nargs="+", default=[16, 32, 64, 128])
    c.add_argument("--causal", type=parse_bool, nargs="+", default=[False, True])
    c.add_argument("--shapes", type=parse_shape, nargs="+", required=True, help="BATCHxN_QUERIESxN_KEYS …")
    c.add_argument("--triton-tiles", choices=("pinned", "autotuned"), default="pinned",
                   help="pinned: CORRECTNESS_TILES for every entry; autotuned: the autotuner's candidates")
    c.add_argument("--seed", type=int, default=None, help="base seed (default: fresh, recorded)")
    c.add_argument("--workers", type=int, default=None, help="processes (default: CPUs - 1, at most 15)")
    c.set_defaults(func=correctness_main)

    b = command("benchmark", "forward/backward timing against plain attention (flash_benchmarking)")
    b.add_argument("--precision", required=True, choices=("bf16", "fp32", "fp16"))
    b.add_argument("--implementations", nargs="+", choices=BENCH_IMPLEMENTATIONS,
                   default=["plain", "flash_triton", "sdpa"])
    b.add_argument("--sdpa-backend", choices=sorted(SDPA_BACKEND_IMPLEMENTATIONS), default="FLASH_ATTENTION",
                   help="the backend `sdpa` is pinned to")
    b.add_argument("--head-dims", type=int, nargs="+", required=True)
    b.add_argument("--sequence-lengths", type=int, nargs="+", required=True)
    b.add_argument("--batch-size", type=int, default=1)
    b.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    b.add_argument("--warmup-ms", type=float, default=25)
    b.add_argument("--rep-ms", type=float, default=100)
    b.add_argument("--autotune-warmup-ms", type=float, default=None)
    b.add_argument("--autotune-rep-ms", type=float, default=None)
    b.add_argument("--precompile", action=argparse.BooleanOptionalAction, default=True)
    b.add_argument("--workers", type=int, default=None, help="precompile processes (default: CPUs - 1, at most 15)")
    b.set_defaults(func=benchmark_main)

    lb = command("leaderboard", "the course's leaderboard protocol, ours against SDPA flash and cuDNN")
    lb.add_argument("--implementations", nargs="+", choices=LEADERBOARD_IMPLEMENTATIONS,
                    default=list(LEADERBOARD_IMPLEMENTATIONS))
    lb.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    lb.add_argument("--warmup-ms", type=float, default=1000)
    lb.add_argument("--rep-ms", type=float, default=10000)
    lb.add_argument("--forward-head-dims", type=int, nargs="+", default=[64, 128])
    lb.add_argument("--forward-sequence-length", type=int, default=16384)
    lb.add_argument("--forward-batch", type=int, default=16)
    lb.add_argument("--table-warmup-ms", type=float, default=25)
    lb.add_argument("--table-rep-ms", type=float, default=100)
    lb.add_argument("--autotune-warmup-ms", type=float, default=None)
    lb.add_argument("--autotune-rep-ms", type=float, default=None)
    lb.add_argument("--precompile", action=argparse.BooleanOptionalAction, default=True)
    lb.add_argument("--workers", type=int, default=None)
    lb.set_defaults(func=leaderboard_main)

    args = parser.parse_args(argv)
    if args.command == "benchmark":
        for key in ("{impl}", "{head_dim}", "{seq_len}"):
            if key not in args.output:
                b.error(f"--output must contain {key}")
        if "flash_triton" in args.implementations and min(args.head_dims) < 16:
            b.error("flash_triton takes head dims 16, 32, 64, 128")
    if getattr(args, "workers", None) is not None and args.workers < 1:
        parser.error("--workers must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
