"""When each Snakemake run of a device's grid began: ``results/<device>/runs.jsonl``, a line per run.

The workflow notes a run's start before its first job (``onstart`` in workflow/rules/common.smk: not
in dry runs, nor in report-only mode, which measures nothing). The report header
(``lmperf.report.devices.grid_timing``) leaves out of the grid's time every gap between cell
processes in which a run began: the time from one run's last cell to the next run's first (a device
call ending and the next one starting, Snakemake's start) is no part of what one ``snakemake
--cores 1 all`` takes, and the 30 s pause rule alone cannot tell it from a run's own gaps. The file
is committed with the records, so report-only rebuilds read the same; records measured before it
existed are timed as before.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from pathlib import Path

RUNS_FILE = "runs.jsonl"


def note_start(results_dir: str | os.PathLike, when: dt.datetime | None = None) -> Path:
    """Append this run's start (now, UTC, unless ``when``) to ``results_dir``/runs.jsonl."""
    when = when or dt.datetime.now(dt.timezone.utc)
    if when.tzinfo is None:
        raise ValueError("a run's start needs its time zone (records' process times carry theirs)")
    path = Path(results_dir) / RUNS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"started": when.isoformat(timespec="milliseconds"), "host": socket.gethostname()})
    with open(path, "a") as f:
        f.write(line + "\n")
    return path


def run_starts(results_dir: str | os.PathLike) -> list[dt.datetime]:
    """The runs' starts noted under ``results_dir``, in order; none where no run was noted. A line
    that is not a run's start stops with its file and line number."""
    path = Path(results_dir) / RUNS_FILE
    if not path.exists():
        return []
    starts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            started = dt.datetime.fromisoformat(json.loads(line)["started"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{path}:{number}: not a run's start ({type(exc).__name__}: {exc}): {line[:200]!r}"
            ) from None
        if started.tzinfo is None:
            raise ValueError(f"{path}:{number}: a run's start without its time zone: {line[:200]!r}")
        starts.append(started)
    return sorted(starts)
