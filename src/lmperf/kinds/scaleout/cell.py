"""Scale-out check: the same e2e cells on one GPU and on several GPUs of one host, in fresh copies of the
workflow (``snakemake all --omit-from e2e_report --cores 2K --resources gpu=K`` for every K of ``gpus``).
One record: wall times and speed-ups against the first K, and per cell each run's medians, their
relative difference and its GPU. A host with fewer GPUs than the largest K: ``unsupported``.
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
from pathlib import Path

import yaml

from lmperf.core import gpu_claim
from lmperf.core.config import overlay
from lmperf.core.record import Unsupported, load_record, run_cell

KIND = "scaleout"
WORKFLOW_PARTS = ("Snakefile", "workflow", "src", "envs")
E2E_SETTINGS = ("batch_size", "vocab_size", "warmup_steps", "measured_steps")  # from this device's e2e grid
COMPARED = ("training_step_ms_median", "inference_forward_ms_median")


def run_config(config: dict, device: str, grid: dict) -> dict:
    """The config of one run: this device, and an e2e grid of exactly the given cells."""
    e2e = config["grids"]["gpu"]["e2e"]
    if device == "cpu":
        e2e = overlay(e2e, config["grids"].get("cpu", {}).get("e2e", {}))
    sub = {key: e2e[key] for key in E2E_SETTINGS if key in e2e}
    sub["main"] = {key: list(grid[key]) for key in ("models", "context_lengths", "precisions")}
    return {**config, "device": device, "report_only": False, "grids": {"gpu": {"e2e": sub}, "cpu": {}}}


def prepare(workdir: Path, config: dict, workflow_dir: Path) -> None:
    """A fresh copy of the workflow in ``workdir`` with ``config`` as its config.yaml."""
    workdir.mkdir(parents=True)
    for name in WORKFLOW_PARTS:
        if (workflow_dir / name).is_dir():
            shutil.copytree(workflow_dir / name, workdir / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(workflow_dir / name, workdir / name)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def run_pipeline(workdir: Path, gpus: int, log_path: Path, lock_dir: Path) -> float:
    """Run the cells with ``gpus`` GPUs at once (2 threads each); the wall-clock seconds. Fails loudly."""
    command = [sys.executable, "-m", "snakemake", "all", "--omit-from", "e2e_report", "--cores", str(2 * gpus)]
    command += ["--resources", f"gpu={gpus}", "--printshellcmds"]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"[scaleout] {gpus} GPU(s): {' '.join(command[2:])} (log: {log_path})", file=sys.stderr, flush=True)
    start = timeit.default_timer()
    with open(log_path, "w") as log:
        env = {**os.environ, gpu_claim.ENV_LOCK_DIR: str(lock_dir)}
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
    per_cell = {name: {"cell": name} for name in cells}
    for k, rows in runs.items():
        for name in cells:
            per_cell[name].update({f"{key}_gpus{k}": value for key, value in rows[name].items()})
    comparisons = {}
    for k in sorted(runs)[1:]:
        entry = {
            "speedup": walls[base] / walls[k],
            "efficiency": walls[base] / walls[k] / (k / base),
            "gpus_used": sorted({str(r["cuda_visible_devices"]) for r in runs[k].values()}),
        }
        for key in COMPARED:
            diffs = []
            for name in cells:
                a, b = runs[base][name].get(key), runs[k][name].get(key)
                per_cell[name][f"{key}_rel_diff_gpus{k}"] = rel = (b - a) / a if a and b is not None else None
                diffs += [] if rel is None else [rel]
            label = key.removesuffix("_ms_median")
            entry[f"{label}_rel_diff_median"] = statistics.median(diffs) if diffs else None
            entry[f"{label}_abs_rel_diff_median"] = statistics.median(map(abs, diffs)) if diffs else None
            entry[f"{label}_abs_rel_diff_max"] = max(map(abs, diffs), default=None)
            entry[f"{label}_cells_compared"] = len(diffs)
        comparisons[str(k)] = entry
    out = {"baseline_gpus": base, "cells": len(cells), "wall_s": {str(k): w for k, w in walls.items()}}
    return out | {"against_baseline": comparisons, "per_cell": list(per_cell.values())}


def measure(settings: dict, device: str, config: dict, work_dir: str | None) -> dict:
    available = gpu_claim.candidate_gpus()
    if len(available) < max(settings["gpus"]):
        raise Unsupported(
            f"this host has {len(available)} GPU(s) ({','.join(available) or 'none'}); "
            f"the scale-out check needs {max(settings['gpus'])}"
        )
    work_root = Path(work_dir or tempfile.mkdtemp(prefix="lmperf-scaleout-"))
    walls, runs = {}, {}
    for k in sorted(set(settings["gpus"])):
        workdir = work_root / f"gpus{k}"
        shutil.rmtree(workdir, ignore_errors=True)
        prepare(workdir, run_config(config, device, settings), Path("."))
        walls[k] = run_pipeline(workdir, k, Path(f"logs/{device}/scaleout/gpus{k}.log"), work_root / f"locks{k}")
        runs[k] = cell_rows(workdir, device)
    metrics = compare(walls, runs) | {"host_gpus": available, "work_dir": str(work_root)}
    if not work_dir:
        shutil.rmtree(work_root, ignore_errors=True)
    return metrics


def main(argv=None) -> int:
    """``--device SLUG --job JSON`` (settings ``gpus``, ``models``, ``context_lengths``, ``precisions``),
    and, for tests, ``--work-dir DIR`` to keep the runs' copies there."""
    argv = list(sys.argv[1:] if argv is None else argv)
    option = lambda name: argv[argv.index(name) + 1] if name in argv else None  # noqa: E731
    job, device = json.loads(option("--job")), option("--device")
    settings, config = job["settings"], yaml.safe_load(Path("config.yaml").read_text())

    def provenance() -> dict:
        from lmperf.core import device as devices  # imports torch: only once the runs are over

        return devices.provenance(device, settings, "scaleout")

    measure_runs = lambda: measure(settings, device, config, option("--work-dir"))  # noqa: E731
    run_cell(KIND, {"grid": "e2e", **settings}, job["output"], provenance, measure_runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
