"""Does it reproduce? ``snakemake --cores 1 verify``: a seeded random sample of this device's timed records
(spread over cells and their host- and GPU-bound halves) re-measured, narrowed to its cell, with as many
trials, in a scratch folder: ``results/<device>/verify/<date>.json``, which the report answers from
(lmperf.report.answers). A ladder rung is timed as its record chose it (parent, batch), as the ladder's
later trials are.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import tempfile
from pathlib import Path

from lmperf.core import trials as T
from lmperf.core.device import git_state
from lmperf.core.record import load_record, write_atomic


def candidates(job_of: dict, records: dict) -> dict:
    """{path: (cell, primary time, GPU busy fraction or None)} of the ok records of timed jobs."""
    out = {}
    for path, record in sorted(records.items()):
        job, metrics = job_of.get(path), record["metrics"]
        name = T.primary(metrics)
        if job is None or job.cell not in T.TIMED_CELLS or record["status"] != "ok" or name is None:
            continue
        busy = next((v for n, v in metrics.items() if n.endswith("gpu_busy_fraction") and T._number(v)), None)
        out[path] = (job.cell, metrics[name], busy)
    return out


def sample(found: dict, count: int, seed: int) -> list[tuple[str, str]]:
    """``count`` (path, half) picked with ``seed``: cells in turn, each alternating between its
    host-bound half (``host``: least GPU-busy, else shortest) and its GPU-bound half (``gpu``)."""
    rng = random.Random(seed)
    queues = []
    for cell in sorted({c for c, _, _ in found.values()}):
        paths = sorted(p for p, (c, _, _) in found.items() if c == cell)
        by_busy = all(found[p][2] is not None for p in paths)
        paths.sort(key=lambda p: found[p][2] if by_busy else found[p][1])
        halves = [[(p, "host") for p in paths[: len(paths) // 2]], [(p, "gpu") for p in paths[len(paths) // 2 :]]]
        for half in halves:
            rng.shuffle(half)
        first, second = rng.sample(halves, 2)
        queues.append([x for i in range(len(second) + 1) for x in first[i : i + 1] + second[i : i + 1]])
    rng.shuffle(queues)
    picked = []
    while len(picked) < count and any(queues):
        picked += [queue.pop(0) for queue in queues if queue][: count - len(picked)]
    return picked


def remeasure(path: str, job, committed: dict, device: str, scratch: Path, log=None) -> dict:
    """The picked record's cell measured again, its trials in ``scratch``; the entry of the report."""
    name = T.primary(committed["metrics"])
    k = len(committed["metrics"].get("trials") or []) or committed["provenance"].get("trials", 1)
    # a cell whose later trials time what its first chose (the ladder) times the committed choice
    again = job.cell in T.FROM_FIRST_TRIAL
    settings = T.narrow(job.settings, [committed["cell"]], exact=again)
    trial = (lambda file: file.removesuffix(".json") + ".t1.json") if again else (lambda file: file)
    news = []
    budget_s, threads = job.resources.get("runtime", 10) * 60, job.resources.get("threads", 1)
    for i in range(k):
        root = scratch / Path(path).stem / f"t{i}" / Path(path).parent.name
        if again:
            write_atomic(root / (Path(path).stem + ".t0.json"), json.dumps(committed))
        T.run_trial(job.cell, device, settings, str(root / trial(Path(job.output).name)), budget_s, log, threads)
        if (root / trial(Path(path).name)).is_file():
            news.append(load_record(root / trial(Path(path).name)))
    new = T.merge(news) if news else None
    new_median = new["metrics"].get(name) if new and new["status"] == "ok" else None
    interval = committed["metrics"].get(f"{name}_interval")
    inside = None if not interval else new_median is not None and interval[0] <= new_median <= interval[1]
    return {
        "record": path,
        "cell": job.cell,
        "metric": name,
        "committed": {"median": committed["metrics"][name], "interval": interval, "trials": k},
        "new": {
            "status": new and new["status"],
            "median": new_median,
            "interval": new and new["metrics"].get(f"{name}_interval"),
        },
        "inside": inside,
        "narrowed_to": {key: v for key, v in settings.items() if v != job.settings.get(key)} or None,
    }


def run(job_of: dict, records: dict, device: str, options: dict, log_path: str, results: str = "results") -> dict:
    """Pick, re-measure and write the verify result; returns it."""
    now = dt.datetime.now(dt.timezone.utc)
    picked = sample(candidates(job_of, records), options["count"], options["seed"])
    cells = []
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log, tempfile.TemporaryDirectory(prefix="lmperf-verify-") as scratch:
        for path, half in picked:
            print(f"lmperf verify: {path} ({half}-bound half)", file=log, flush=True)
            entry = remeasure(path, job_of[path], records[path], device, Path(scratch), log)
            cells.append({**entry, "half": half})
    judged = [c["inside"] for c in cells if c["inside"] is not None]
    result = {
        "device": device,
        "date": now.date().isoformat(),
        "time": now.isoformat(timespec="seconds"),
        **git_state(),
        "seed": options["seed"],
        "count": options["count"],
        "fraction_inside": sum(judged) / len(judged) if judged else None,
        "cells": cells,
    }
    write_atomic(Path(results, device, "verify", f"{result['date']}.json"), json.dumps(result, indent=1) + "\n")
    return result
