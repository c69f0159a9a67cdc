# Scale-out check (issue 7): the same e2e cells on one GPU and on several GPUs of one host, in
# one record. Not part of `all` (it runs the pipeline itself, twice, and needs a host with that
# many GPUs): `snakemake --cores 4 --resources gpu=2 scaleout`. The report shows it once it exists.
SCALEOUT = GRID.get("scaleout")
SCALEOUT_RECORD = "results/{device}/scaleout/e2e.json"

if SCALEOUT:

    rule scaleout:
        input:
            SCALEOUT_RECORD.format(device=DEVICE),

    # A local rule: it runs on the host that runs Snakemake and starts its runs there (never a
    # cluster job: inside one, a scheduler's multi-GPU CUDA_VISIBLE_DEVICES would be kept whole).
    rule scaleout_cell:
        localrule: True
        output:
            SCALEOUT_RECORD,
        conda:
            "../../envs/lmperf.yaml"
        log:
            "logs/{device}/scaleout/e2e.log",
        params:
            gpus=SCALEOUT["gpus"],
            models=SCALEOUT["e2e"]["models"],
            context_lengths=SCALEOUT["e2e"]["context_lengths"],
            precisions=SCALEOUT["e2e"]["precisions"],
            e2e=E2E,
            code=code_version("cells/scaleout.py", "cells/e2e.py", "model.py", "gpu_claim.py", *CELL_CODE_COMMON),
        # the runs it starts are Snakemake processes with their own --cores (2 per GPU)
        threads: 1
        resources:
            # every GPU of the comparison: nothing else runs beside it
            gpu=max(SCALEOUT["gpus"]) if GPUS_PER_CELL else 0,
            mem_mb=16000,
            runtime=60,
        shell:
            "python -m lmperf.cells.scaleout --output {output} --device {wildcards.device}"
            " --gpus {params.gpus} --models {params.models} --context-lengths {params.context_lengths}"
            " --precisions {params.precisions} --config config.yaml --log-dir logs/{wildcards.device}/scaleout"
            " > {log} 2>&1"


SECTION_FILES.append(f"results/{DEVICE}/sections/scale_out.md")


rule scaleout_report:
    localrule: True
    input:
        # only a record that exists: `all` never runs the check itself
        lambda wc: [p for p in [SCALEOUT_RECORD.format(device=wc.device)] if Path(p).exists()],
    output:
        "results/{device}/sections/scale_out.md",
    conda:
        "../../envs/lmperf.yaml"
    log:
        "logs/{device}/report/scaleout.log",
    params:
        code=code_version("report/scaleout.py", "report/common.py"),
    shell:
        "python -m lmperf.report.scaleout --device {wildcards.device}"
        " --sections-dir results/{wildcards.device}/sections --records {input} > {log} 2>&1"
