# One rule per job of this device's grid (lmperf.kinds.<kind>.grid), all alike: the runner starts
# the cell with its settings (`--job`, JSON, quoted), kills it past its time budget, and the cell
# writes its records. Snakemake's benchmark: file keeps each job's wall time and memory.
#
# A timed job (lmperf.core.trials.TIMED_CELLS) runs as k independent trials (Job.trials): trial i
# is a job of its own writing trial records (temp(): gone once merged, kept by a run stopped
# midway), pass i of the whole grid before pass i+1 (priority); then its merge job writes the
# records, running more trials itself where a cell's trials disagree, and the k-th of a cell that
# may stop at two (lmperf.core.trials.passes) where its two do not settle it.
import lmperf.core.trials

PASSES = max(
    [
        lmperf.core.trials.passes(j.cell, j.trials)
        for js in JOBS.values()
        for j in js
        if j.cell in lmperf.core.trials.TIMED_CELLS
    ],
    default=1,
)


def pass_priority(job, i):
    """Pass i of every timed job before pass i+1, untimed jobs with pass 0, merges after every pass;
    within a pass the longest time budgets first (a run stopped midway loses the short jobs)."""
    return job.priority + 100 * (PASSES - i) + min(job.resources.get("runtime", 10), 99)


def stale_trial(path, job):
    """Whether a trial record on disk is unreadable, or from other code or settings than ``job``'s."""
    if not os.path.exists(path):
        return False
    try:
        return lmperf.core.plan.why_stale(lmperf.core.record.load_record(path), job) is not None
    except lmperf.core.record.RecordError:
        return True


def trial_inputs(job, i):
    """``cell_inputs`` of trial i, and the first trial's records where later trials time what it chose
    (lmperf.core.trials.FROM_FIRST_TRIAL); its trial records left from other code or settings are
    measured again."""
    first = cell_inputs(job)
    chosen = job.cell in lmperf.core.trials.FROM_FIRST_TRIAL and i > 0

    def inputs(wildcards):
        paths = [lmperf.core.trials.trial_path(p, i) for p in job.records]
        if not REPORT_ONLY and any(stale_trial(p, job) for p in paths):
            workflow._dag.forcefiles.update(paths)
        return first(wildcards) + ([lmperf.core.trials.trial_path(p, 0) for p in sorted(job.records)] if chosen else [])

    return inputs


def merge_inputs(job):
    """The trial records of a job whose records are measured in this run (stale ones forced)."""

    def inputs(wildcards):
        stale = [path for path in job.records if path in STALE]
        if stale and not REPORT_ONLY:
            workflow._dag.forcefiles.update(stale)
        if all(p in RECORDS and p not in STALE for p in job.records):
            return []
        passes = lmperf.core.trials.passes(job.cell, job.trials)
        return [lmperf.core.trials.trial_path(p, i) for i in range(passes) for p in sorted(job.records)]

    return inputs


if not REPORT_ONLY:
    for _job in [job for jobs in JOBS.values() for job in jobs]:
        _timed = _job.cell in lmperf.core.trials.TIMED_CELLS
        _passes = lmperf.core.trials.passes(_job.cell, _job.trials)
        for _i in range(_passes) if _timed else [None]:
            _name = _job.name if _i is None else f"{_job.name}__t{_i}"

            rule:
                name:
                    _name
                input:
                    cell_inputs(_job) if _i is None else trial_inputs(_job, _i),
                output:
                    (
                        sorted(_job.records)
                        if _i is None
                        else [temp(lmperf.core.trials.trial_path(p, _i)) for p in sorted(_job.records)]
                    ),
                log:
                    f"logs/{DEVICE}/{_name}.log",
                benchmark:
                    f"logs/{DEVICE}/benchmarks/{_name}.tsv"
                priority: pass_priority(_job, _i or 0)
                conda:
                    "../../envs/lmperf.yaml"
                threads: _job.resources.get("threads", 1)
                resources:
                    gpu=int(os.environ.get("LMPERF_GPUS_PER_CELL", _job.resources.get("gpu", 0))),
                    mem_mb=_job.resources.get("mem_mb", 4000),
                    runtime=_job.resources.get("runtime", 10),
                params:
                    cell=_job.cell,
                    device=DEVICE,
                    # a function: Snakemake would read the template's braces as wildcards
                    job=lambda wildcards, job=_job, i=_i: (
                        job.argument() if i is None else lmperf.core.trials.trial_argument(job.settings, job.output, i)
                    ),
                shell:
                    "exec python -m lmperf --budget-s $(( {resources.runtime} * 60 )) {params.cell}"
                    " --device {params.device} --job {params.job:q} > {log:q} 2>&1"

        if _timed:
            _cap = lmperf.core.trials.max_trials(_job.trials, DEVICE)

            # the merge holds the cell's resources: it may run more trials, each within the cell's budget
            rule:
                name:
                    _job.name
                input:
                    merge_inputs(_job),
                output:
                    sorted(_job.records),
                log:
                    f"logs/{DEVICE}/{_job.name}.log",
                benchmark:
                    f"logs/{DEVICE}/benchmarks/{_job.name}.tsv"
                priority: _job.priority
                conda:
                    "../../envs/lmperf.yaml"
                threads: _job.resources.get("threads", 1)
                resources:
                    gpu=int(os.environ.get("LMPERF_GPUS_PER_CELL", _job.resources.get("gpu", 0))),
                    mem_mb=_job.resources.get("mem_mb", 4000),
                    runtime=_job.resources.get("runtime", 10) * (_cap - _passes) + 1,
                params:
                    cell=_job.cell,
                    device=DEVICE,
                    job=lambda wildcards, job=_job: job.argument(),
                    trials=_passes,
                    k=_job.trials,
                    cap=_cap,
                    trial_budget_s=_job.resources.get("runtime", 10) * 60,
                shell:
                    "exec python -m lmperf.core.trials --cell {params.cell} --device {params.device}"
                    " --job {params.job:q} --trials {params.trials} --min-trials {params.k} --max-trials {params.cap}"
                    " --budget-s {params.trial_budget_s} {output:q} > {log:q} 2>&1"
