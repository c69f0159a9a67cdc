"""The compile job: compile every compiled e2e cell's graphs cold, several at once, before the cells.

Compiling takes most of a compiled e2e cell's time while the GPU idles, nearly all of it in the
first training step and the first no-grad forward: 1-3 minutes on an H100 with the whole model as
one graph, 15-20 s block by block (``lmperf.kinds.e2e.cell.compile_blocks``). This job compiles the cells
side by side instead: for each cell it empties the cell's cache directory and runs
the e2e cell in compile-only mode in a process of its own (the same model, inputs and calls as
the measured cell; see ``lmperf.kinds.e2e.cell.compile_only``), ``--workers`` of
half as many as CPUs at most at once, each with its share of the CPUs for Inductor's compile workers and, on a GPU,
a share of the GPU's memory sized to its model (``gpu_share_bytes``): a compile starts only when
its share fits beside the running ones', so every model can be built beside the others. Each writes an
``e2e_compile`` record: the cold first training forward+backward and first no-grad forward (under
the contention of the compiles beside it: setting ``concurrent_compiles``) and the cache's hit and miss
counts. The measured cell then loads its graphs from that directory.

A compile process that runs out of GPU memory while executing (several large models at once) has
compiled all the same: its record says ``oom`` for the part that did not run, the graphs are on disk.
Any other failure of a compile process fails the job, after the others finish, with its log's tail.

Its job (lmperf.kinds.e2e.grid): settings ``cells`` ([model, context, precision] each), ``cache``
(each cell's cache directory, a pattern), ``batch_size``, ``vocab_size``, ``seed``, and the record
path pattern as its output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import types
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from lmperf.core import gpu_claim
from lmperf.core.cell import parse_job
from lmperf.core.sizes import config_from_name, parameter_count
from lmperf.kinds.e2e import cell as measured_cell  # noqa: F401 - its code is this job's code (fingerprint)

LOG_TAIL_LINES = 40
# GPU memory a compile process is given: its fp32 weights and some room per parameter, plus its CUDA
# context and a margin. It may allocate only that (torch.cuda.set_per_process_memory_fraction); a
# compile starts when its share fits beside the running ones' in USABLE_SHARE of the GPU's memory.
# Executing the step then mostly runs out of memory, after compiling: the record says so, the graphs
# are on disk.
MEMORY_PER_PARAMETER_BYTES = 5
PROCESS_OVERHEAD_BYTES = 2**30
USABLE_SHARE = 0.95


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def gpu_memory_bytes() -> int | None:
    """Total memory of this process's GPU (the one CUDA_VISIBLE_DEVICES names) from nvidia-smi, which
    does not start CUDA here; None without one."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", visible],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = out.stdout.strip().splitlines()[:1]
    return int(first[0]) * 2**20 if out.returncode == 0 and first and first[0].strip().isdigit() else None


def parameters(cell: dict) -> int:
    return parameter_count(config_from_name(cell["model"], context_length=cell["context_length"]))


def plan(cells: list[dict], workers: int | None, cpus: int) -> tuple[int, int, list[dict]]:
    """(at most this many compiles at once, Inductor compile threads each, the cells largest model
    first). A compile is mostly one Python thread plus Inductor's pool compiling kernels,
    so by default half as many compiles as CPUs run at once and each gets an equal share of the CPUs
    for its pool. Largest first: the longest compiles start first and the job does not end on one."""
    at_once = max(1, min(len(cells), workers or cpus // 2))
    threads = max(1, cpus // at_once)
    order = sorted(cells, key=lambda c: (-parameters(c), -c["context_length"]))
    return at_once, threads, order


def gpu_share_bytes(cell: dict) -> int:
    """The GPU memory a cell's compile process may allocate (its weights and room) and needs beside."""
    return MEMORY_PER_PARAMETER_BYTES * parameters(cell)


def next_to_start(pending: list[dict], running: list[dict], at_once: int, gpu_bytes: int | None) -> dict | None:
    """The first pending cell (in plan order) that may start now: fewer than ``at_once`` running and,
    on a GPU, its share and overhead fitting beside the running ones' in USABLE_SHARE of the memory.
    With nothing running the first pending one starts whatever it needs (alone, it gets what there is)."""
    if not pending or len(running) >= at_once:
        return None
    if not running or gpu_bytes is None:
        return pending[0]
    used = sum(gpu_share_bytes(c) + PROCESS_OVERHEAD_BYTES for c in running)
    for cell in pending:
        if used + gpu_share_bytes(cell) + PROCESS_OVERHEAD_BYTES <= USABLE_SHARE * gpu_bytes:
            return cell
    return None


def command(cell: dict, args, threads: int, at_once: int, memory_fraction: float | None = None) -> list[str]:
    """The cell's compile-only process (the e2e cell in compile-only mode): ``at_once`` compiles running
    with it counted in, its share of the GPU's memory as a fraction. Its record keeps this job's settings."""
    part = {
        **cell,
        "compile_cache": args.cache.format(**cell),
        "compile_threads": threads,
        "concurrent_compiles": at_once,
        "memory_fraction": round(memory_fraction, 4) if memory_fraction else None,
    }
    job = {"settings": {"compile_only": part, "job": args.settings}, "output": args.output.format(**cell)}
    return [sys.executable, "-m", "lmperf", "e2e", "--device", args.device, "--job", json.dumps(job)]


def log_path(cell: dict, args) -> Path:
    """Each cell's log, beside the job's: logs/<device>/e2e_compile/<record name>.log."""
    return Path("logs", args.device, "e2e_compile", Path(args.output.format(**cell)).stem + ".log")


def compile_cell(
    cell: dict, args, threads: int, at_once: int, memory_fraction: float | None
) -> tuple[dict, int, float]:
    """Empty the cell's cache (the compile must be cold), run its compile-only process; (cell, exit
    code, seconds)."""
    cache = Path(args.cache.format(**cell))
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    log = log_path(cell, args)
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run(
            command(cell, args, threads, at_once, memory_fraction), stdout=out, stderr=subprocess.STDOUT
        ).returncode
    return cell, code, time.perf_counter() - start


def main(argv=None) -> int:
    job = parse_job("e2e_compile", argv, __doc__.splitlines()[0])
    args = types.SimpleNamespace(**job.settings, device=job.device, output=job.output, settings=job.settings)
    args.cells = [{"model": m, "context_length": c, "precision": p} for m, c, p in job.settings["cells"]]
    if args.device != "cpu":
        # this job's GPU, before any CUDA call; its processes inherit CUDA_VISIBLE_DEVICES naming it
        gpu_claim.claim_gpu()
    gpu_bytes = gpu_memory_bytes() if args.device != "cpu" else None
    at_once, threads, order = plan(args.cells, None, available_cpus())
    print(
        f"compiling {len(order)} cells, at most {at_once} at once, {threads} Inductor compile threads each"
        + (f", as many as fit in {USABLE_SHARE:.0%} of the GPU's {gpu_bytes / 2**30:.0f} GiB" if gpu_bytes else ""),
        flush=True,
    )
    start = time.perf_counter()
    failed, pending, running, finished = [], list(order), {}, 0
    with ThreadPoolExecutor(at_once) as pool:
        while pending or running:
            while (cell := next_to_start(pending, list(running.values()), at_once, gpu_bytes)) is not None:
                pending.remove(cell)
                fraction = min(1.0, gpu_share_bytes(cell) / gpu_bytes) if gpu_bytes else None
                running[pool.submit(compile_cell, cell, args, threads, len(running) + 1, fraction)] = cell
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                del running[future]
                cell, code, seconds = future.result()
                finished += 1
                name = f"{cell['model']} ctx {cell['context_length']} {cell['precision']}"
                print(
                    f"[{finished}/{len(order)}] {name}: {'done' if code == 0 else f'FAILED (exit {code})'} in "
                    f"{seconds:.1f} s ({time.perf_counter() - start:.0f} s since the job began, {len(running)} running)",
                    flush=True,
                )
                if code != 0:
                    failed.append((name, log_path(cell, args)))
    for name, log in failed:
        lines = log.read_text(errors="replace").splitlines() if log.exists() else ["(no log)"]
        print(f"\n--- {name}: last {LOG_TAIL_LINES} lines of {log} ---", file=sys.stderr)
        print("\n".join(lines[-LOG_TAIL_LINES:]), file=sys.stderr)
    print(f"{len(order) - len(failed)} of {len(order)} compiled in {time.perf_counter() - start:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
