"""Compile the Triton FlashAttention-2 kernels for many shapes at once, in spawned processes, before
timing: Triton keeps the binaries in its on-disk cache. ``warm`` reduces the shapes to the cheapest that
compile the same binaries (``cheapest``) and launches each kernel of each as its own task, slowest first.
Workers never tune: candidates timed side by side would be timed wrong.
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
    """Processes for parallel Triton compilation: the CPUs this process may use, less one, at most MAX_WORKERS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 2
    return max(1, min(MAX_WORKERS, cpus - 1))


def combination(spec: dict) -> tuple:
    """(head dim, dtype, causal, TF32 products): what decides a shape's kernels, but for tiles and specialisations."""
    return spec["head_dim"], spec["dtype"], bool(spec["causal"]), bool(spec.get("tf32")) and spec["dtype"] == "fp32"


def tiles(spec: dict, device: str) -> tuple:
    """The tiles of the shape's forward, dK/dV and dQ launches on `device` with nothing tuned."""
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
    """What decides every binary a shape runs on `device`: its combination, its `tiles` and what Triton
    specialises integers on (lengths of 1 or a multiple of 16; batch strides a multiple of 16, 32-bit)."""
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
    """One shape per distinct `binaries` of `specs`: batch 1 and the fewest query x key pairs of its group."""
    groups: dict[tuple, dict] = {}
    for spec in specs:
        key = binaries(spec, device)
        best = groups.get(key)
        if best is None or spec["n_queries"] * spec["n_keys"] < best["n_queries"] * best["n_keys"]:
            groups[key] = dict(spec, batch=1)
    return list(groups.values())


def slowest_first(spec: dict) -> tuple:
    """Float32, wide heads and causal masking compile longest (18-38 s a set for fp32 at d = 256, 3-5 s
    for bf16 at d = 16 on an H100): a pool that starts them first does not end on a long one."""
    return (spec["dtype"] != "fp32", -spec["head_dim"], not spec["causal"])


# a shape's kernels, the longest to compile first
KERNEL_ORDER = ("dkdv", "dq", "fwd")


def kernel_once(spec: dict, kernel: str) -> None:
    """One launch of one of a shape's kernels (``fwd``, ``dkdv``, or ``dq`` with the backward's
    preprocessing kernel) on random inputs, with the tiles and dot precision flash_forward /
    flash_backward would choose: it compiles that kernel, and only it."""
    from lmperf.kernels.flash import tuning
    from lmperf.kernels.flash.triton_backward import launch_delta, launch_dkdv, launch_dq
    from lmperf.kernels.flash.triton_common import dot_precision
    from lmperf.kernels.flash.triton_forward import launch_forward

    dtype = DTYPES[spec["dtype"]]
    batch, n_q, n_k, d = (spec[key] for key in ("batch", "n_queries", "n_keys", "head_dim"))
    causal = bool(spec["causal"])
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
    """A worker's task: one kernel of one shape, never tuned, with TF32 as the shape asks."""
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
    """Compile the kernels every shape of `specs` needs in `workers` spawned processes; the wall time,
    the shapes and combinations compiled for, and each task's kernel and seconds."""
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
    """The specs of square (batch, n, head dim) `shapes` in `precision` (tf32: float32 inputs, TF32 products)."""
    dtype = {"tf32": "fp32"}.get(precision, precision)
    tf32 = (precision == "tf32" or tf32) and dtype == "fp32"
    return [
        dict(batch=batch, n_queries=n, n_keys=n, head_dim=d, dtype=dtype, causal=bool(causal), tf32=tf32)
        for batch, n, d in shapes
    ]


def warm_kernels(specs: list[dict], workers: int | None = None) -> dict:
    """``warm`` before anything is timed; the record's metrics: ``warm_compile_s`` (wall seconds, kept
    apart from every kernel time) or, on an error, ``warm_compile_error`` (the kernels then compile at
    their first call)."""
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
