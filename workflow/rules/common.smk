# What every rule needs, worked out before any job runs: the config (validated), the device, its
# jobs (each kind's lmperf.kinds.<kind>.grid) and which records on disk are stale. No torch here
# unless the device is `auto`.
import fcntl
import json
import os
import secrets
import select
import subprocess
import sys
from pathlib import Path

import lmperf.core.config
import lmperf.core.plan
import lmperf.core.record
from lmperf.kinds import KINDS, NOT_IN_ALL, RECORD_FOLDERS, grid_module


class LmperfInputError(Exception):
    """A bad config or record: the message names the file or key and the fix."""


# 1. The config, checked against workflow/schemas/config.schema.yaml (defaults filled in there and
#    nowhere else; a misspelt key at any level is an error with a suggestion).
try:
    lmperf.core.config.validate(config)
except lmperf.core.config.ConfigError as error:
    raise LmperfInputError(str(error)) from None
REPORT_ONLY = config["report_only"]


# 2. The device: `auto` is this machine's accelerator (resolved once; cluster jobs inherit the
#    answer through the environment), a named slug must be this machine's unless the run only
#    builds reports (then it must have records).
def _this_machine():
    slug = os.environ.get("LMPERF_AUTO_DEVICE")
    if slug is None:
        import lmperf.core.device

        slug = lmperf.core.device.device_slug()
        os.environ["LMPERF_AUTO_DEVICE"] = slug
    return slug


def _resolve_device(setting):
    if setting == "auto":
        return _this_machine()
    if REPORT_ONLY:
        if not any(Path("results", setting, folder).is_dir() for folder in RECORD_FOLDERS):
            raise LmperfInputError(
                f"device {setting!r}: report-only mode needs records, and results/{setting}/ has none"
            )
        return setting
    if workflow.is_main_process and workflow.local_exec and setting != _this_machine():
        raise LmperfInputError(
            f"device {setting!r} is not this machine ({_this_machine()!r}): run on that device, "
            "set `device: auto`, or build its reports only with `--config report_only=true`"
        )
    return setting


DEVICE = _resolve_device(config["device"])
GRID = lmperf.core.config.grid(config, DEVICE)
# The front page (report/answers.md) is one device's, the same whichever device ran last.
FRONT_DEVICE = config["front_page_device"]


# 3. The jobs of this device's grid: what each cell runs with and the records it writes.
JOBS = {kind: grid_module(kind).jobs(GRID[kind], DEVICE) for kind in KINDS if kind in GRID}
JOB_OF = {path: job for jobs in JOBS.values() for job in jobs for path in job.records}


def records_of(kinds=KINDS):
    """Every record path of these kinds' jobs."""
    return sorted(path for kind in kinds for job in JOBS.get(kind, []) for path in job.records)


ALL_KINDS = [kind for kind in KINDS if kind not in NOT_IN_ALL]


# 4. The records on disk: each readable, valid, unique and where it belongs, or the run stops here
#    naming the file and the fix. Those whose fingerprint or settings differ from their job's now
#    are stale: `all` measures them again (forced, see `cell_inputs`), in any clone.
def read_records(device):
    records = {}
    for folder, kind in RECORD_FOLDERS.items():
        for path in sorted(Path("results", device, folder).glob("*.json")):
            try:
                record = lmperf.core.record.load_record(path)
            except lmperf.core.record.RecordError as error:
                raise LmperfInputError(str(error)) from None
            cell, settings = record["cell"], record["provenance"].get("settings") or {}
            try:
                expected = grid_module(kind).record_path(device, folder, cell, settings)
            except (KeyError, TypeError, ValueError):
                expected = None
            problem = lmperf.core.plan.misplaced(str(path), record, expected)
            if problem:
                raise LmperfInputError(
                    f"{path}: {problem}; a record belongs where its kind, device and cell say: "
                    "move it there or delete it"
                )
            records[str(path)] = record
    try:
        lmperf.core.record.check_unique(records)
    except lmperf.core.record.RecordError as error:
        raise LmperfInputError(str(error)) from None
    return records


RECORDS = read_records(DEVICE)
STALE = {}
for _path, _job in JOB_OF.items():
    if _path in RECORDS:
        _why = lmperf.core.plan.why_stale(RECORDS[_path], _job)
        if _why:
            STALE[_path] = _why
if STALE and workflow.is_main_process:
    print(f"lmperf: {len(STALE)} record(s) of {DEVICE} are stale:", file=sys.stderr)
    for _path in sorted(STALE)[:10]:
        print(f"  {_path}: {STALE[_path]}", file=sys.stderr)
    if len(STALE) > 10:
        print(f"  … and {len(STALE) - 10} more", file=sys.stderr)


def cell_inputs(job):
    """Input function of a job's rule: marks its stale records to be measured again (Snakemake's
    own --forcerun, set from here: the DAG asks for a job's inputs while it is being built), and
    returns the records to measure first (job.after) when they are measured in this run too."""

    def inputs(wildcards):
        stale = [path for path in job.records if path in STALE]
        if stale and not REPORT_ONLY:
            workflow._dag.forcefiles.update(stale)
        reruns = lambda paths: any(p not in RECORDS or p in STALE for p in paths)
        if not reruns(job.records):
            return []
        return [ancient(p) for p in job.after if reruns([p])]

    return inputs


# 5. Runs: the same command resumes after any stop. A lock left by a Snakemake that died (kill -9,
#    a closed terminal) is cleared when no other run of this checkout is alive (each run holds an
#    flock on .snakemake/lmperf.run for its life; the kernel drops it however the run ends).
_RUN_LOCK = None
if workflow.is_main_process:
    Path(".snakemake").mkdir(exist_ok=True)
    _RUN_LOCK = open(".snakemake/lmperf.run", "a")
    try:
        fcntl.flock(_RUN_LOCK, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass  # another run is alive: Snakemake's own lock refuses this one
    else:
        for lock in Path(".snakemake/locks").glob("*.lock"):
            lock.unlink()


# 6. Cells start from the run's warm parent (lmperf.core.warm): a child of this Snakemake process
#    that has imported torch, lives as long as the run, and forks each cell. Local runs only.
WARM_LOG = f"logs/{DEVICE}/warm.log"


def start_warm_parent():
    if REPORT_ONLY or not workflow.local_exec or os.environ.get("LMPERF_WARM", "1") == "0":
        return
    name = f"lmperf-{secrets.token_hex(16)}"
    Path(WARM_LOG).parent.mkdir(parents=True, exist_ok=True)
    with open(WARM_LOG, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "lmperf.core.warm", name],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
    ready, _, _ = select.select([process.stdout], [], [], 120)
    if ready and process.stdout.readline().strip() == b"ready":
        os.environ["LMPERF_WARM_SOCKET"] = name
    else:
        print(f"lmperf: the warm parent did not start (see {WARM_LOG}); cells import everything themselves")


onstart:
    start_warm_parent()
