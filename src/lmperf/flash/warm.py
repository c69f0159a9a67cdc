"""Compile the Triton FlashAttention-2 kernels for many shapes at once, in parallel processes.

Compilation dominates the first call of every new (head dim, dtype, causal, tiles) combination:
4.5-33 s each on an H100, while a repeat costs about a millisecond. The combinations are
independent, so a pool of processes can compile them side by side: each worker runs the
forward and backward of the shapes it is given once, and Triton writes the binaries to its
on-disk cache (TRITON_CACHE_DIR, shared by all processes of this user), where the calling
process finds them on its own first call instead of compiling.

    from lmperf.flash.warm import warm
    warm([dict(batch=2, n_queries=1000, n_keys=777, head_dim=80, dtype="bf16", causal=True), ...])

Workers are spawned (CUDA cannot be forked) and see the same environment, so the tile choices
(lmperf.flash.tuning: policy, remembered tables) and hence the compiled binaries match the
caller's. Nothing is timed here; use it before timing.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import defaultdict
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
    """What decides which kernels a shape needs compiled, apart from the length bucket."""
    return spec["head_dim"], spec["dtype"], bool(spec["causal"])


def run_once(specs: list[dict]) -> dict:
    """Forward and backward of each shape once, on this process's GPU (a worker's task)."""
    from lmperf.flash.autograd import FlashAttention2Triton

    start = time.perf_counter()
    for spec in specs:
        dtype = DTYPES[spec["dtype"]]
        q, k, v = (
            torch.randn(spec["batch"], n, spec["head_dim"], device="cuda", dtype=dtype, requires_grad=True)
            for n in (spec["n_queries"], spec["n_keys"], spec["n_keys"])
        )
        FlashAttention2Triton.apply(q, k, v, bool(spec["causal"])).sum().backward()
    torch.cuda.synchronize()
    return {"shapes": len(specs), "seconds": time.perf_counter() - start, "pid": os.getpid()}


def warm(specs: list[dict], workers: int | None = None) -> dict:
    """Compile the kernels every shape of `specs` needs, one (head dim, dtype, causal) combination
    per task, in `workers` spawned processes. Returns the wall time and each task's seconds."""
    for spec in specs:
        if spec["dtype"] not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {spec['dtype']!r}")
    if not torch.cuda.is_available():
        raise RuntimeError("warm compiles for the CUDA device: no CUDA device here")
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for spec in specs:
        groups[combination(spec)].append(spec)
    # slowest first (fp32 and wide heads compile longest), so the pool does not end on a long one
    order = sorted(groups, key=lambda c: (c[1] != "fp32", -c[0]))
    workers = max(1, min(workers or default_workers(), len(order)))
    start = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(run_once, [groups[c] for c in order]))
    tasks = [{"head_dim": c[0], "dtype": c[1], "causal": c[2], **d} for c, d in zip(order, done)]
    return {"workers": workers, "combinations": len(order), "wall_s": time.perf_counter() - start, "tasks": tasks}
