"""The compile job: every compiled e2e cell's graphs compiled cold, several at once, before the cells
(docs/decisions/compile-job.md). Each cell's cache directory is emptied and the e2e cell runs in
compile-only mode in a process of its own (half as many at once as CPUs, each with a share of the
CPUs and, on a GPU, of its memory), writing an ``e2e_compile`` record; the measured cell then loads
its graphs. Out of GPU memory after compiling is done work; any other failure fails the job.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import torch

from lmperf.core import device as devices
from lmperf.core.cell import parse_job
from lmperf.core.sizes import config_from_name, parameter_count
from lmperf.kinds.e2e import cell as measured_cell  # noqa: F401 - its code is this job's code (fingerprint)

LOG_TAIL_LINES = 40
# GPU memory a compile process may allocate (set_per_process_memory_fraction): its fp32 weights and
# some room per parameter; beside it, its CUDA context. Compiles start while their shares fit in
# USABLE_SHARE of the GPU; executing the step then mostly runs out of memory, after compiling.
MEMORY_PER_PARAMETER_BYTES = 5
PROCESS_OVERHEAD_BYTES = 2**30
USABLE_SHARE = 0.95


def gpu_share_bytes(cell: dict) -> int:
    return MEMORY_PER_PARAMETER_BYTES * parameter_count(config_from_name(cell["model"]))


def plan(cells: list[dict], cpus: int) -> tuple[int, int, list[dict]]:
    """(compiles at once: half the CPUs, Inductor compile threads each: an equal share of them, the
    cells largest model first, so the longest compiles start first and the job does not end on one)."""
    at_once = max(1, min(len(cells), cpus // 2))
    order = sorted(cells, key=lambda c: (-gpu_share_bytes(c), -c["context_length"]))
    return at_once, max(1, cpus // at_once), order


def next_to_start(pending: list[dict], running: list[dict], at_once: int, gpu_bytes: int | None) -> dict | None:
    """The first pending cell that may start now: fewer than ``at_once`` running and, on a GPU, its
    share fitting beside the running ones' (alone, a compile gets whatever there is)."""
    if not pending or len(running) >= at_once:
        return None
    if not running or gpu_bytes is None:
        return pending[0]
    used = sum(gpu_share_bytes(c) + PROCESS_OVERHEAD_BYTES for c in running)
    fits = [c for c in pending if used + gpu_share_bytes(c) + PROCESS_OVERHEAD_BYTES <= USABLE_SHARE * gpu_bytes]
    return fits[0] if fits else None


def command(cell: dict, job, threads: int, at_once: int, fraction: float | None) -> list[str]:
    """The cell's compile-only process, with ``at_once`` compiles running (it counted in) and its share
    of the GPU's memory as a fraction; its record keeps this job's settings."""
    part = {**cell, "compile_cache": job.settings["cache"].format(**cell), "compile_threads": threads}
    part.update(concurrent_compiles=at_once, memory_fraction=round(fraction, 4) if fraction else None)
    argument = {"settings": {"compile_only": part, "job": job.settings}, "output": job.output.format(**cell)}
    return [sys.executable, "-m", "lmperf", "e2e", "--device", job.device, "--job", json.dumps(argument)]


def log_path(cell: dict, job) -> Path:
    return Path("logs", job.device, "e2e_compile", Path(job.output.format(**cell)).stem + ".log")


def compile_cell(cell: dict, job, threads: int, at_once: int, fraction: float | None) -> tuple[dict, int, float]:
    """Empty the cell's cache (the compile must be cold), run its process: (cell, exit code, seconds)."""
    cache = Path(job.settings["cache"].format(**cell))
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    log_path(cell, job).parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log_path(cell, job), "w") as log:
        code = subprocess.run(command(cell, job, threads, at_once, fraction), stdout=log, stderr=subprocess.STDOUT)
    return cell, code.returncode, time.perf_counter() - start


def main(argv=None) -> int:
    job = parse_job("e2e_compile", argv, __doc__.splitlines()[0])
    cells = [{"model": m, "context_length": c, "precision": p} for m, c, p in job.settings["cells"]]
    device = devices.check_device(job.device)  # on a GPU, claims it: the processes inherit CUDA_VISIBLE_DEVICES
    gpu_bytes = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    at_once, threads, pending = plan(cells, len(os.sched_getaffinity(0)))
    print(f"compiling {len(cells)} cells, at most {at_once} at once, {threads} compile threads each", flush=True)
    start, failed, running = time.perf_counter(), [], {}
    with ThreadPoolExecutor(at_once) as pool:
        while pending or running:
            while (cell := next_to_start(pending, list(running.values()), at_once, gpu_bytes)) is not None:
                pending.remove(cell)
                fraction = min(1.0, gpu_share_bytes(cell) / gpu_bytes) if gpu_bytes else None
                running[pool.submit(compile_cell, cell, job, threads, len(running) + 1, fraction)] = cell
            for future in wait(running, return_when=FIRST_COMPLETED)[0]:
                del running[future]
                cell, code, seconds = future.result()
                outcome = "done" if code == 0 else f"FAILED (exit {code})"
                print(f"{cell}: {outcome} in {seconds:.1f} s ({len(running)} running)", flush=True)
                if code:
                    failed.append(cell)
    for cell in failed:
        log = log_path(cell, job)
        lines = log.read_text(errors="replace").splitlines() if log.exists() else ["(no log)"]
        head = f"\n--- {cell}: last {LOG_TAIL_LINES} lines of {log} ---"
        print(head, *lines[-LOG_TAIL_LINES:], sep="\n", file=sys.stderr)
    print(f"{len(cells) - len(failed)} of {len(cells)} compiled in {time.perf_counter() - start:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
