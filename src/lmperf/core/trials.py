"""Independent trials of a timed cell, and their merge into one record (issue 50). No torch here.

A timed job runs as k trials, each its own process and Snakemake job (``trials/<folder>/<name>.t<i>.json``),
pass i of the grid before pass i+1. One merge job per timed job writes its records, first running more
trials, up to ``MAX_TRIALS``, of the cells whose primary times spread beyond ``MARGIN`` of their median.
A cell that measures its GPU's busy share (``EARLY_STOP``) runs two passes; the merge runs its k-th trial
unless both were GPU-bound (``GPU_BOUND_BUSY``) and their interval is stable, or both had the same outcome
without a time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from lmperf.core.record import load_record, make_record, write_record
from lmperf.core.stats import BOOTSTRAP_MIN_TRIALS, estimate, summary

TIMED_CELLS = ("e2e", "attention", "flash_benchmark", "flash_leaderboard", "ladder")
MARGIN = 0.05  # trials disagree when their primary time's spread (max - min) exceeds this share of its median
MAX_TRIALS = 6
# the time whose spread asks for more trials and whose median picks the median trial (else any *_ms_median)
PRIMARY = ("training_step_ms_median", "step_ms_median", "forward_backward_ms_median", "forward_ms_median")
TIME_SUFFIXES = ("_ms", "_ms_mean", "_ms_median", "_ms_min", "_ms_max", "_s", "tokens_per_s", "_tflops")
# settings lists a run can be narrowed by to some cells (list -> cell key); rungs keep the ladder up to the last
NARROWS = {"head_dims": "head_dim", "sequence_lengths": "sequence_length", "rungs": "rung"}
# cells whose later trials time again what their first trial chose (the ladder's parents and batches: a
# search is a decision, not a measurement); those trials read the first trial's records
FROM_FIRST_TRIAL = ("ladder",)
# cells that measure their GPU's busy share of a step: two agreeing trials suffice where it is at least
# GPU_BOUND_BUSY in each (the time then depends on the GPU, not on the host that launches the kernels)
EARLY_STOP, EARLY_STOP_AT, GPU_BOUND_BUSY = ("e2e",), 2, 0.9
LATER_TRIAL = re.compile(r"\.t([1-9][0-9]*)\.json$")


def trial_path(path: str, i: int) -> str:
    """``results/<device>/<folder>/<name>.json`` (or a template) -> ``…/trials/<folder>/<name>.t<i>.json``."""
    p = Path(path)
    return str(p.parent.parent / "trials" / p.parent.name / f"{p.name.removesuffix('.json')}.t{i}.json")


def first_trial_of(output: str) -> str | None:
    """The first trial's path (or template) when ``output`` is a later trial's, else None."""
    return LATER_TRIAL.sub(".t0.json", output) if LATER_TRIAL.search(output) else None


def trial_argument(settings: dict, output: str, i: int) -> str:
    """The runner's ``--job`` for trial i: the job's settings, its records' trial paths."""
    return json.dumps({"settings": settings, "output": trial_path(output, i)}, sort_keys=True)


def max_trials(trials: int, device: str) -> int:
    """The cap of a job's trials: on a CPU the config's (its tiny cells only exercise the pipeline)."""
    return trials if device == "cpu" else max(trials, MAX_TRIALS)


def passes(cell: str, trials: int) -> int:
    """The trials the workflow runs as passes over the grid; the merge job decides on the rest."""
    return min(trials, EARLY_STOP_AT) if cell in EARLY_STOP else trials


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_time(name: str) -> bool:
    """A time or throughput metric: merged as the median over trials with an interval."""
    return name.endswith(TIME_SUFFIXES) or "mfu" in name or "tflops" in name or name.endswith("gpu_busy_fraction")


def primary(metrics: dict) -> str | None:
    names = [n for n in PRIMARY if _number(metrics.get(n))]
    names += [n for n, v in metrics.items() if n.endswith("_ms_median") and _number(v)]
    return names[0] if names else None


def disagree(trial_records: list[dict]) -> bool:
    """Whether the ok trials' primary times spread (max - min) beyond ``MARGIN`` of their median."""
    ok = [r["metrics"] for r in trial_records if r["status"] == "ok"]
    name = primary(ok[0]) if ok else None
    values = [m[name] for m in ok if _number(m.get(name))]
    return len(values) >= 2 and max(values) - min(values) > MARGIN * statistics.median(values)


def settled(trial_records: list[dict]) -> str | None:
    """Why no further trial is needed below the config's k, None where one is: ``gpu_bound`` (GPU busy at
    least ``GPU_BOUND_BUSY`` of the step in every trial, all within ``MARGIN``, their interval stable) or
    ``same_outcome`` (every trial the same status, with no time: out of memory, unsupported)."""
    statuses = {r["status"] for r in trial_records}
    if "ok" not in statuses:
        return "same_outcome" if len(statuses) == 1 else None
    busy = [r["metrics"].get("gpu_busy_fraction") for r in trial_records]
    if statuses == {"ok"} and all(_number(b) and b >= GPU_BOUND_BUSY for b in busy) and not disagree(trial_records):
        name = primary(trial_records[0]["metrics"])
        values = [r["metrics"][name] for r in trial_records if _number(r["metrics"].get(name))]
        # two trials' interval is wide (t with one degree of freedom): stop only where it is still stable
        return "gpu_bound" if len(values) >= 2 and not estimate(values).unstable else None
    return None


def _entry(record: dict) -> dict:
    """One trial as ``metrics.trials`` keeps it: status, start, host, its times and samples."""
    host = dict(record["provenance"].get("host") or {})
    entry = {"status": record["status"], "reason": record["reason"], "start_time": record["provenance"]["start_time"]}
    entry.update(gpu_state_end=host.pop("gpu_state_end", None), host=host)
    metrics = record["metrics"]
    entry.update({n: v for n, v in metrics.items() if (is_time(n) and _number(v)) or n.endswith("_samples")})
    return entry


def merge(trial_records: list[dict]) -> dict:
    """One record from a cell's trials: each time the median over the ok trials with ``<name>_interval``,
    the rest from the median trial (by primary time; the lower of an even count); ``ok`` if any trial
    is, else the first trial's status. Provenance: the first trial's, with ``trials: k``."""
    first = trial_records[0]
    provenance = {**first["provenance"], "trials": len(trial_records)}
    ok = [r for r in trial_records if r["status"] == "ok"]
    entries = [_entry(r) for r in trial_records]
    # the GPU's state when the last trial wrote its record
    end = {"trials": entries, "gpu_state_end": entries[-1]["gpu_state_end"]}
    if not ok:
        metrics = {**first["metrics"], **end}
        return make_record(first["kind"], first["cell"], first["status"], metrics, provenance, first["reason"])
    name = primary(ok[0]["metrics"])
    timed = [r for r in ok if name and _number(r["metrics"].get(name))]
    median_trial = sorted(timed, key=lambda r: r["metrics"][name])[(len(timed) - 1) // 2] if timed else ok[0]
    metrics = dict(median_trial["metrics"])
    names = dict.fromkeys(n for r in ok for n, v in r["metrics"].items() if is_time(n) and _number(v))
    for n in names:
        stat = summary([r["metrics"][n] for r in ok if _number(r["metrics"].get(n))])
        metrics[n] = stat["median"]
        if stat["interval"] is not None:
            metrics[f"{n}_interval"] = stat["interval"]
    method = "single" if len(ok) == 1 else "t" if len(ok) < BOOTSTRAP_MIN_TRIALS else "bootstrap"
    metrics.update(primary_metric=name, interval_method=method, **end)
    return make_record(first["kind"], first["cell"], "ok", metrics, provenance)


def narrow(settings: dict, cells: list[dict], exact: bool = False) -> dict:
    """``settings`` run for these cells only (``NARROWS``): e.g. one head dim and length; rungs up to
    the last wanted one, unless ``exact`` (a later trial, which chooses nothing)."""
    out = dict(settings)
    for key, cell_key in NARROWS.items():
        wanted = {c[cell_key] for c in cells if cell_key in c}
        if not isinstance(settings.get(key), list) or not wanted:
            continue
        if key == "rungs" and not exact:
            out[key] = settings[key][: max(settings[key].index(w) for w in wanted) + 1]
        else:
            out[key] = [v for v in settings[key] if v in wanted]
    return out


def run_trial(cell, device, settings, output, budget_s=None, log=None, threads=None) -> int:
    """One trial through the runner, on ``threads`` CPU threads (default: this process's OMP_NUM_THREADS)."""
    budget = ["--budget-s", str(budget_s)] if budget_s else []
    job = json.dumps({"settings": settings, "output": output}, sort_keys=True)
    command = [sys.executable, "-m", "lmperf", *budget, cell, "--device", device, "--job", job]
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT if log else None, env=env).returncode


def merge_job(cell, device, settings, output, records, trials, cap, budget_s=None, run=run_trial, required=None) -> int:
    """Merge a job's ``trials`` trials into its records, first running more (narrowed to the cells that
    need them) up to ``cap``: for cells whose trials disagree, and up to ``required`` (default: none
    beyond ``trials``) for cells not ``settled``; returns the trials run."""
    found = {path: [load_record(trial_path(path, i)) for i in range(trials)] for path in records}
    required, n = required or trials, trials
    while n < cap:
        more = [p for p in records if disagree(found[p]) or (len(found[p]) < required and not settled(found[p]))]
        if not more:
            break
        for path in records:  # a trial file left by a merge that was stopped
            Path(trial_path(path, n)).unlink(missing_ok=True)
        print(
            f"lmperf: {len(more)} record(s) disagree beyond {MARGIN:.0%} or need trial {n}", file=sys.stderr, flush=True
        )
        narrowed = narrow(settings, [found[path][0]["cell"] for path in more], exact=cell in FROM_FIRST_TRIAL)
        if run(cell, device, narrowed, trial_path(output, n), budget_s) != 0:
            print(f"lmperf: trial {n} failed; merging the trials before it", file=sys.stderr)
            break
        for path in more:
            if Path(trial_path(path, n)).is_file():
                found[path].append(load_record(trial_path(path, n)))
        n += 1
    for path in records:
        record = merge(found[path])
        if len(found[path]) < required:  # the record says why it has fewer trials than the config's k
            record["metrics"]["fewer_trials_because"] = settled(found[path]) or "trial_failed"
        write_record(path, record)
    for path in records:
        for i in range(trials, n + 1):
            Path(trial_path(path, i)).unlink(missing_ok=True)
    return n


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmperf.core.trials", description=__doc__.splitlines()[0])
    parser.add_argument("--cell", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--job", required=True, help='{"settings": {...}, "output": path or template}')
    parser.add_argument("--trials", type=int, required=True, help="the trials the workflow ran (t0 … t<k-1>)")
    parser.add_argument("--min-trials", type=int, default=None, help="the config's k: trials below it are run here")
    parser.add_argument("--max-trials", type=int, required=True)
    parser.add_argument("--budget-s", type=float, default=None, help="each extra trial's time budget")
    parser.add_argument("records", nargs="+")
    o = parser.parse_args(argv)
    job = json.loads(o.job)
    merge_job(
        o.cell,
        o.device,
        job["settings"],
        job["output"],
        o.records,
        o.trials,
        o.max_trials,
        o.budget_s,
        required=o.min_trials,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
