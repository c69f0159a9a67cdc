# Scale-out check: the same e2e cells on one GPU and on several GPUs of one host, in
# one record. Not part of `all` (it runs the pipeline itself, twice, and needs a host with that
# many GPUs): `snakemake --cores 4 scaleout --resources gpu=2`. The report shows it once it exists.
SCALEOUT = GRID.get("scaleout")
SCALEOUT_RECORD = KEPT_RECORDS[0]  # read by `all`, never measured by it (common.smk)

if SCALEOUT and RUN_CELLS:

    rule scaleout:
        input:
            SCALEOUT_RECORD.format(device=DEVICE),

    # A local rule: it runs on the host that runs Snakemake and starts its runs there (never a
    # cluster job: inside one, a scheduler's multi-GPU CUDA_VISIBLE_DEVICES would be kept whole).
    rule scaleout_cell:
        # no stale flag: `all` reads this record where it exists but never runs the check; after a
        # code change, `snakemake --cores 4 scaleout --forcerun scaleout_cell --resources gpu=2`
        output:
            SCALEOUT_RECORD,
        log:
            "logs/{device}/scaleout/e2e.log",
        localrule: True
        conda:
            "../../envs/lmperf.yaml"
        # the runs it starts are Snakemake processes with their own --cores (2 per GPU)
        threads: 1
        resources:
            # every GPU of the comparison: nothing else runs beside it
            gpu=max(SCALEOUT["gpus"]) if GPUS_PER_CELL else 0,
            mem_mb=16000,
            runtime=60,
        params:
            gpus=SCALEOUT["gpus"],
            models=SCALEOUT["e2e"]["models"],
            context_lengths=SCALEOUT["e2e"]["context_lengths"],
            precisions=SCALEOUT["e2e"]["precisions"],
        shell:
            cell_shell(
                "scaleout",
                "--output {output} --device {wildcards.device} --gpus {params.gpus} --models {params.models}"
                " --context-lengths {params.context_lengths} --precisions {params.precisions} --config config.yaml"
                " --log-dir logs/{wildcards.device}/scaleout",
            )


SECTION_FILES.append(f"results/{DEVICE}/sections/scale_out.md")


rule scaleout_report:
    input:
        # only a record that exists: `all` never runs the check itself
        records=inputs(p for p in [SCALEOUT_RECORD.format(device=DEVICE)] if Path(p).exists()),
        stale=stamp_flag(
            "scaleout_report",
            "lmperf.kinds.scaleout.report",
            [p for p in [SCALEOUT_RECORD.format(device=DEVICE)] if Path(p).exists()],
        ),
    output:
        section="results/{device}/sections/scale_out.md",
        stamp=aggregate_stamp("scaleout_report"),
    log:
        "logs/{device}/report/scaleout.log",
    localrule: True
    conda:
        "../../envs/lmperf.yaml"
    shell:
        "python -m lmperf.kinds.scaleout.report --device {wildcards.device}"
        " --sections-dir results/{wildcards.device}/sections --records {input.records} > {log} 2>&1"
        + stamp_shell("scaleout_report", "lmperf.kinds.scaleout.report")
