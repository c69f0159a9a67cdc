"""Compile the Triton FlashAttention-2 kernels for many shapes at once, in parallel processes.

Compilation dominates the first call of every new (head dim, dtype, causal, tiles) combination:
4.5-33 s each on an H100, while a repeat costs about a millisecond. The combinations are
independent, so a pool of processes can compile them side by side: each worker runs the
forward and backward of the shapes it is given once, and Triton writes the binaries to its
on-disk cache (TRITON_CACHE_DIR, shared by all processes of this user), where the calling
process finds them on its own first call instead of compiling.

    from lmperf.kernels.flash.warm import warm
    warm([dict(batch=2, n_queries=1000, n_keys=777, head_dim=80, dtype="bf16", causal=True), ...])

A spec's optional ``tf32`` (float32 inputs only) runs it with torch.backends.cuda.matmul.allow_tf32
on, as the caller will (our kernels follow that flag: TF32 products are other binaries).

Workers are spawned (CUDA cannot be forked) and see the same environment, so the tile choices
(lmperf.kernels.flash.tuning: remembered tables, the heuristic) and hence the compiled binaries match the
caller's. They never tune (policy ``off`` whatever the environment says): candidates timed side by
side on one GPU would be timed wrong. A caller that tunes (policy ``missing``) still compiles the
candidates of an untuned bucket itself; the heuristic tiles it starts from are warm.

The kernels do not specialise on the batch, and only the dK/dV kernel on the lengths (a length of 1,
a multiple of 16, any other), so the shapes are first reduced to the cheapest ones that compile the
same binaries (`cheapest`): of the shapes that share a combination, the tiles of each kernel (what
lmperf.kernels.flash.tuning would give them on this device with nothing tuned: lengths of several buckets
often share tiles), the lengths' classes and what Triton specialises the batch strides
(n x head dim) on (16-divisibility, 32-bit width), the one with the fewest query x key pairs, at
batch 1. Each kernel of each of those (the forward, the dK/dV pass, the dQ pass with the backward's
small preprocessing kernel) is a task of its own, launched once on made-up inputs with the tiles
flash_forward / flash_backward choose for it (`kernel_once`), so the pool's wall time is the slowest
single kernel, not a shape's three one after the other: the dK/dV pass takes about half of a set's
compile time (46-62 % for fp32 at d = 128 and 256 and bf16 at 64 and 128, compiled for sm_90 on a
CPU with lmperf.kernels.flash.aot). Nothing is timed here; use it before timing.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
import timeit
from concurrent.futures import ProcessPoolExecutor

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MAX_WORKERS = 15


def default_workers() -> int:
    """Processes for parallel Triton compilation (here and in the cells that compile or check in
    parallel): the CPUs this process may use, less one, at most MAX_WORKERS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 2
    return max(1, min(MAX_WORKERS, cpus - 1))


def combination(spec: dict) -> tuple:
    """What decides which kernels a shape needs compiled, apart from their tiles and Triton's
    specialisations: (head dim, dtype, causal, TF32 products)."""
    return spec["head_dim"], spec["dtype"], bool(spec["causal"]), bool(spec.get("tf32")) and spec["dtype"] == "fp32"


def tiles(spec: dict, device: str) -> tuple:
    """The tiles the shape's forward, dK/dV and dQ launches run with on `device` (a slug of
    lmperf.kernels.flash.tuning) when nothing is tuned, as sorted (name, value) pairs per kernel."""
    from . import tuning
    from .triton_common import dot_precision

    dtype = DTYPES[spec["dtype"]]
    precision = dot_precision(dtype, bool(spec.get("tf32")))
    n_q, n_k, d, causal = spec["n_queries"], spec["n_keys"], spec["head_dim"], bool(spec["causal"])
    return tuple(
        tuple(sorted(tuning.planned(kernel, dtype, precision, d, causal, n_q, n_k, device).items()))
        for kernel in tuning.KERNELS
    )


def binaries(spec: dict, device: str) -> tuple:
    """What decides every binary a shape runs on `device`: its combination, its kernels' `tiles` and
    what Triton specialises the integer arguments on: the lengths (the dK/dV kernel's: 1, a multiple
    of 16 or neither), whether the batch strides (n_queries x d, n_keys x d) are multiples of 16, and
    whether they fit 32 bits."""
    n_q, n_k, d = spec["n_queries"], spec["n_keys"], spec["head_dim"]
    strides = (n_q * d, n_k * d)
    return (
        combination(spec),
        tiles(spec, device),
        tuple((n == 1, n % 16 == 0) for n in (n_q, n_k)),
        tuple(s % 16 == 0 for s in strides),
        max(strides) < 2**31,
    )


def cheapest(specs: list[dict], device: str) -> list[dict]:
    """One shape per distinct `binaries` of `specs` on `device`: batch 1 and the fewest query x key
    pairs of its group (the same binaries for less GPU time and memory), in the order of first
    appearance."""
    groups: dict[tuple, dict] = {}
    for spec in specs:
        key = binaries(spec, device)
        best = groups.get(key)
        if best is None or spec["n_queries"] * spec["n_keys"] < best["n_queries"] * best["n_keys"]:
            groups[key] = dict(spec, batch=1)
    return list(groups.values())


def slowest_first(spec: dict) -> tuple:
    """Sort key of a shape: float32, wide heads and causal masking compile longest (the H100's flash
    correctness record of 2591fa8: 18-38 s a set of binaries for fp32 at d = 256, 3-5 s for bf16 at
    d = 16), so a pool that starts them first does not end on a long one."""
    return (spec["dtype"] != "fp32", -spec["head_dim"], not spec["causal"])


# a shape's kernels, the longest to compile first
KERNEL_ORDER = ("dkdv", "dq", "fwd")


def kernel_once(spec: dict, kernel: str) -> None:
    """One launch of one of a shape's kernels on the GPU (``fwd``, ``dkdv``, or ``dq`` with the
    backward's preprocessing kernel), on made-up inputs of the shape's sizes and layout, with the tiles
    flash_forward / flash_backward choose for such a launch (lmperf.kernels.flash.tuning.choose) and the dot
    precision they take: what compiles that kernel, and only it, as the shape's first forward and
    backward would. The values are random and nothing is checked."""
    from lmperf.kernels.flash import tuning
    from lmperf.kernels.flash.triton_backward import launch_delta, launch_dkdv, launch_dq
    from lmperf.kernels.flash.triton_common import dot_precision
    from lmperf.kernels.flash.triton_forward import launch_forward

    dtype = DTYPES[spec["dtype"]]
    batch, n_q, n_k, d, causal = (
        spec["batch"],
        spec["n_queries"],
        spec["n_keys"],
        spec["head_dim"],
        bool(spec["causal"]),
    )
    q = torch.randn(batch, n_q, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, n_k, d, device="cuda", dtype=dtype) for _ in range(2))
    precision = dot_precision(dtype)  # as flash_forward / flash_backward: TF32 where allow_tf32 is set

    def choose(name):
        return tuning.choose(name, q, k, causal, precision, lambda config: None, outputs=())

    lse = torch.zeros(batch, n_q, device="cuda", dtype=torch.float32)
    if kernel == "fwd":
        launch_forward(q, k, v, torch.empty_like(q), lse, causal, choose("fwd"), precision)
        return
    do = torch.randn_like(q)
    delta = torch.zeros(batch, n_q, device="cuda", dtype=torch.float32)
    if kernel == "dkdv":
        launch_dkdv(
            q, k, v, do, lse, delta, torch.empty_like(k), torch.empty_like(v), causal, choose("dkdv"), precision
        )
    elif kernel == "dq":
        launch_delta(torch.randn_like(q), do, delta)
        launch_dq(q, k, v, do, lse, delta, torch.empty_like(q), causal, choose("dq"), precision)
    else:
        raise ValueError(f"kernel must be one of {KERNEL_ORDER}, got {kernel!r}")


def run_task(task: tuple[dict, str]) -> dict:
    """A worker's task: one kernel of one shape (`kernel_once`), with the tiles remembered or the
    heuristic's (never tuned) and TF32 as the shape asks."""
    from lmperf.kernels.flash import tuning

    spec, kernel = task
    start = time.perf_counter()
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    try:
        with tuning.tuning_policy("off"):
            torch.backends.cuda.matmul.allow_tf32 = bool(spec.get("tf32"))
            kernel_once(spec, kernel)
        torch.cuda.synchronize()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
    return {"kernel": kernel, "seconds": time.perf_counter() - start, "pid": os.getpid()}


def warm(specs: list[dict], workers: int | None = None) -> dict:
    """Compile the kernels every shape of `specs` needs, in `workers` spawned processes: one task per
    kernel of each distinct set of binaries (`cheapest`, on this process's CUDA device), slowest
    first. Returns the wall time, the number of shapes compiled for and of (head dim, dtype, causal,
    tf32) combinations, and each task's kernel and seconds."""
    from . import tuning

    for spec in specs:
        if spec["dtype"] not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {spec['dtype']!r}")
    if not torch.cuda.is_available():
        raise RuntimeError("warm compiles for the CUDA device: no CUDA device here")
    shapes = sorted(cheapest(specs, tuning.device_slug()), key=slowest_first)
    tasks = sorted(
        ((spec, kernel) for spec in shapes for kernel in KERNEL_ORDER),
        key=lambda task: (slowest_first(task[0]), KERNEL_ORDER.index(task[1])),
    )
    workers = max(1, min(workers or default_workers(), len(tasks)))
    start = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(run_task, tasks))
    wall_s = time.perf_counter() - start
    out = []
    for (spec, _), result in zip(tasks, done):
        c = combination(spec)
        out.append({"head_dim": c[0], "dtype": c[1], "causal": c[2], "tf32": c[3], **result})
    return {
        "workers": workers,
        "shapes": len(shapes),
        "combinations": len({combination(spec) for spec in shapes}),
        "wall_s": wall_s,
        "tasks": out,
    }


def warm_specs(shapes, precision: str, causal: bool, tf32: bool = False) -> list[dict]:
    """lmperf.kernels.flash.warm's shapes for the (batch, n, head dim) `shapes` a cell is about to run
    square, in `precision` (a name of lmperf.core.dtypes; tf32 runs float32 inputs, as does `tf32`)."""
    dtype = {"tf32": "fp32"}.get(precision, precision)
    tf32 = (precision == "tf32" or tf32) and dtype == "fp32"
    return [
        dict(batch=batch, n_queries=n, n_keys=n, head_dim=d, dtype=dtype, causal=bool(causal), tf32=tf32)
        for batch, n, d in shapes
    ]


def warm_kernels(specs: list[dict], workers: int | None = None) -> dict:
    """Compile our Triton kernels for every shape of `specs` at once, in parallel processes
    (lmperf.kernels.flash.warm), before anything is timed; callers run it on CUDA only. Returns the
    record's metrics: ``warm_compile_s``, the wall seconds of it all (process start-up included),
    kept apart from every kernel time; on an error, ``warm_compile_error`` (the kernels then
    compile at their first call, as without warming)."""
    if os.environ.get("TRITON_INTERPRET") == "1" or not specs:
        return {}  # interpreted kernels compile nothing
    start = timeit.default_timer()
    try:
        out = warm(specs, workers)
    except Exception as exc:  # noqa: BLE001 - a failed warm-up costs time, never the measurements
        print(f"[flash] warm-up failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return {
            "warm_compile_s": timeit.default_timer() - start,
            "warm_compile_error": f"{type(exc).__name__}: {exc}"[:300],
        }
    metrics = {
        "warm_compile_s": timeit.default_timer() - start,
        "warm_compile_workers": out["workers"],
        "warm_compile_combinations": out["combinations"],
        "warm_compile_tasks": len(out["tasks"]),
        "warm_compile_shapes": out["shapes"],
    }
    print(f"[flash] warm-up: {metrics}", file=sys.stderr, flush=True)
    return metrics
