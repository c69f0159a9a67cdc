# One rule per job of this device's grid (lmperf.kinds.<kind>.grid), all alike: the runner starts
# the cell with its settings (`--job`, JSON, quoted), kills it past its time budget, and the cell
# writes its records. Snakemake's benchmark: file keeps each job's wall time and memory.
if not REPORT_ONLY:
    for _job in [job for jobs in JOBS.values() for job in jobs]:

        rule:
            name:
                _job.name
            input:
                cell_inputs(_job),
            output:
                sorted(_job.records),
            log:
                f"logs/{DEVICE}/{_job.name}.log",
            benchmark:
                f"logs/{DEVICE}/benchmarks/{_job.name}.tsv"
            conda:
                "../../envs/lmperf.yaml"
            priority: _job.priority
            threads: _job.resources.get("threads", 1)
            resources:
                gpu=int(os.environ.get("LMPERF_GPUS_PER_CELL", _job.resources.get("gpu", 0))),
                mem_mb=_job.resources.get("mem_mb", 4000),
                runtime=_job.resources.get("runtime", 10),
            params:
                cell=_job.cell,
                device=DEVICE,
                # a function: Snakemake would read the template's braces as wildcards
                job=lambda wildcards, job=_job: job.argument(),
            shell:
                "exec python -m lmperf --budget-s $(( {resources.runtime} * 60 )) {params.cell}"
                " --device {params.device} --job {params.job:q} > {log:q} 2>&1"
