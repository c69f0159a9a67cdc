"""Scale-out check: the same end-to-end cells on one GPU and on several GPUs of one host.

Not a course question: it checks the pipeline's claim that ``snakemake --resources gpu=K`` runs
K cells at once, each on its own GPU, without changing what they measure. For every K in
``--gpus`` (e.g. 1 2) it copies the workflow (Snakefile, workflow/, src/, envs/) into a fresh
directory with a config whose grid holds only the given e2e cells, runs

    python -m snakemake all --omit-from e2e_report --cores 2K --resources gpu=K

there (only the cells, no report), and times the run's wall clock. One record then compares
the runs: wall time and speed-up against the first K, and per cell the median training-step
and inference-forward times of each run with their relative difference (the timing agreement),
and the GPU each cell ran on (its record's ``CUDA_VISIBLE_DEVICES``). Each run's Snakemake
output is kept in ``--log-dir``; a failing run stops this with its log's tail.

A host with fewer GPUs than the largest K gets an ``unsupported`` record (how many GPUs it has
is counted as the cells would count them: ``lmperf.core.gpu_claim.candidate_gpus``). The cells run
on the machine that runs this process: their timings share the host with each other, which is
the point.

    python -m lmperf.kinds.scaleout.cell --device h200 --gpus 1 2 --models small medium \
        --context-lengths 256 --precisions fp32 bf16 --config config.yaml \
        --output results/h200/scaleout/e2e.json --log-dir logs/h200/scaleout
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import timeit
import types
from pathlib import Path

import yaml

from lmperf.core import gpu_claim
from lmperf.core.record import Unsupported, load_record, run_cell

KIND = "scaleout"
WORKFLOW_PARTS = ("Snakefile", "workflow", "src", "envs")
# e2e settings shared by every cell, taken from the config's e2e grid of this device
E2E_SETTINGS = ("batch_size", "vocab_size", "warmup_steps", "measured_steps")
COMPARED = ("training_step_ms_median", "inference_forward_ms_median")


def run_config(config: dict, device: str, grid: dict) -> dict:
    """The config of one run: this device, and an e2e grid of exactly the given cells (its other
    settings this device's)."""
    from lmperf.core.config import overlay

    e2e = config["grids"]["gpu"]["e2e"]
    if device == "cpu":
        e2e = overlay(e2e, config["grids"].get("cpu", {}).get("e2e", {}))
    sub = {key: e2e[key] for key in E2E_SETTINGS if key in e2e}
    sub["main"] = {
        "models": list(grid["models"]),
        "context_lengths": list(grid["context_lengths"]),
        "precisions": list(grid["precisions"]),
    }
    return {**config, "device": device, "report_only": False, "grids": {"gpu": {"e2e": sub}, "cpu": {}}}


def prepare(workdir: Path, config: dict, workflow_dir: Path) -> None:
    """A fresh copy of the workflow in ``workdir`` with ``config`` as its config.yaml."""
    workdir.mkdir(parents=True)
    for name in WORKFLOW_PARTS:
        src = workflow_dir / name
        if src.is_dir():
            shutil.copytree(src, workdir / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(src, workdir / name)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def run_pipeline(workdir: Path, gpus: int, log_path: Path, lock_dir: Path) -> float:
    """Run the cells with ``gpus`` GPUs at once; returns the wall-clock seconds. Fails loudly."""
    cores = 2 * gpus  # a GPU cell holds 2 threads (THREADS_PER_CELL in common.smk)
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "all",
        "--omit-from",
        "e2e_report",
        "--cores",
        str(cores),
        "--resources",
        f"gpu={gpus}",
        "--printshellcmds",
    ]
    env = {**os.environ, gpu_claim.ENV_LOCK_DIR: str(lock_dir)}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"[scaleout] {gpus} GPU(s): {' '.join(command[2:])} (log: {log_path})", file=sys.stderr, flush=True)
    start = timeit.default_timer()
    with open(log_path, "w") as log:
        result = subprocess.run(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall_s = timeit.default_timer() - start
    if result.returncode != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-40:])
        raise RuntimeError(f"the {gpus}-GPU run failed (rc {result.returncode}); end of {log_path}:\n{tail}")
    print(f"[scaleout] {gpus} GPU(s): {wall_s:.1f} s", file=sys.stderr, flush=True)
    return wall_s


def cell_rows(workdir: Path, device: str) -> dict[str, dict]:
    """Per e2e record of a run: status, compared medians, the GPU it ran on, when it started."""
    rows = {}
    for path in sorted((workdir / "results" / device / "e2e").glob("*.json")):
        record = load_record(path)
        rows[path.stem] = {
            "status": record["status"],
            **{key: record["metrics"].get(key) for key in COMPARED},
            "cuda_visible_devices": record["provenance"].get("cuda_visible_devices"),
            "start_time": record["provenance"].get("start_time"),
        }
    return rows


def compare(walls: dict[int, float], runs: dict[int, dict[str, dict]]) -> dict:
    """Speed-up and per-cell timing agreement of every run against the first (fewest GPUs)."""
    base = min(runs)
    cells = sorted(runs[base])
    for k, rows in runs.items():
        if sorted(rows) != cells:
            raise RuntimeError(
                f"the {k}-GPU run wrote other cells than the {base}-GPU run: {sorted(set(rows) ^ set(cells))}"
            )
    metrics: dict = {"baseline_gpus": base, "cells": len(cells), "wall_s": {str(k): w for k, w in walls.items()}}
    per_cell = {name: {"cell": name} for name in cells}
    for k, rows in runs.items():
        for name in cells:
            per_cell[name].update({f"{key}_gpus{k}": value for key, value in rows[name].items()})
    comparisons = {}
    for k in sorted(runs):
        if k == base:
            continue
        entry = {
            "speedup": walls[base] / walls[k],
            "efficiency": walls[base] / walls[k] / (k / base),
            "gpus_used": sorted({str(r["cuda_visible_devices"]) for r in runs[k].values()}),
        }
        for key in COMPARED:
            diffs = []
            for name in cells:
                a, b = runs[base][name].get(key), runs[k][name].get(key)
                rel = (b - a) / a if a and b is not None else None
                per_cell[name][f"{key}_rel_diff_gpus{k}"] = rel
                if rel is not None:
                    diffs.append(rel)
            label = key.removesuffix("_ms_median")
            entry[f"{label}_rel_diff_median"] = statistics.median(diffs) if diffs else None
            entry[f"{label}_abs_rel_diff_median"] = statistics.median(abs(d) for d in diffs) if diffs else None
            entry[f"{label}_abs_rel_diff_max"] = max((abs(d) for d in diffs), default=None)
            entry[f"{label}_cells_compared"] = len(diffs)
        comparisons[str(k)] = entry
    metrics["against_baseline"] = comparisons
    metrics["per_cell"] = list(per_cell.values())
    return metrics


def measure(args, config: dict) -> dict:
    needed = max(args.gpus)
    available = gpu_claim.candidate_gpus()
    if len(available) < needed:
        raise Unsupported(
            f"this host has {len(available)} GPU(s) ({','.join(available) or 'none'}); "
            f"the scale-out check needs {needed}"
        )
    grid = {"models": args.models, "context_lengths": args.context_lengths, "precisions": args.precisions}
    work_root = Path(args.work_dir or tempfile.mkdtemp(prefix="lmperf-scaleout-"))
    walls, runs = {}, {}
    for k in sorted(set(args.gpus)):
        workdir = work_root / f"gpus{k}"
        if workdir.exists():
            shutil.rmtree(workdir)
        prepare(workdir, run_config(config, args.device, grid), Path(args.workflow_dir))
        walls[k] = run_pipeline(workdir, k, Path(args.log_dir) / f"gpus{k}.log", work_root / f"locks{k}")
        runs[k] = cell_rows(workdir, args.device)
    metrics = compare(walls, runs)
    metrics["host_gpus"] = available
    metrics["work_dir"] = str(work_root)
    if not args.keep_work_dir and not args.work_dir:
        shutil.rmtree(work_root, ignore_errors=True)
    return metrics


def main(argv=None) -> int:
    """``--device SLUG --job JSON`` (settings ``gpus``, ``models``, ``context_lengths``, ``precisions``),
    and, for tests, ``--work-dir DIR`` to keep the runs' copies there."""
    argv = list(sys.argv[1:] if argv is None else argv)
    work_dir = None
    if "--work-dir" in argv:
        at = argv.index("--work-dir")
        work_dir, argv = argv[at + 1], argv[:at] + argv[at + 2 :]
    job = json.loads(argv[argv.index("--job") + 1])
    device = argv[argv.index("--device") + 1]
    settings = job["settings"]
    args = types.SimpleNamespace(
        **settings,
        device=device,
        workflow_dir=".",
        log_dir=f"logs/{device}/scaleout",
        work_dir=work_dir,
        keep_work_dir=work_dir is not None,
    )
    config = yaml.safe_load(Path("config.yaml").read_text())
    cell = {"grid": "e2e", **settings}

    def provenance() -> dict:
        from lmperf.core import device as devices  # imports torch: only once the runs are over

        return devices.provenance(device, settings, "scaleout")

    run_cell(KIND, cell, job["output"], provenance, lambda: measure(args, config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
