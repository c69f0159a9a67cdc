# Precision cells: mixed_precision_accumulation and benchmarking_mixed_precision (a)-(b). One job
# (one process, seconds) writes a record per probe; it runs on CUDA or on the CPU alike.

if PRECISION is not None:

    if RUN_CELLS:

        rule precision_cells:
            input:
                stale_flags([PRECISION_RECORD.format(device="{device}", probe=probe) for probe in PRECISION_PROBES]),
            output:
                [PRECISION_RECORD.format(device="{device}", probe=probe) for probe in PRECISION_PROBES],
            log:
                "logs/{device}/precision/probes.log",
            conda:
                "../../envs/lmperf.yaml"
            threads: THREADS_PER_CELL
            resources:
                gpu=GPUS_PER_CELL,
                mem_mb=2000,
                runtime=5,
            params:
                template=lambda wc: f"results/{wc.device}/precision/{{probe}}.json",
                flags=cell_flags(PRECISION),
            shell:
                cell_shell("precision", "--output '{params.template}' --device {wildcards.device} {params.flags}")

    PRECISION_SECTIONS = ["mixed_precision_accumulation", "benchmarking_mixed_precision_ab"]
    SECTION_FILES.extend(f"results/{DEVICE}/sections/{name}.md" for name in PRECISION_SECTIONS)

    rule precision_report:
        input:
            records=measured(precision_records()),
            stale=stamp_flag("precision_report", "lmperf.kinds.precision.report", measured(precision_records())),
        output:
            tables=expand("results/{{device}}/tables/precision_{name}.csv", name=PRECISION_PROBES),
            sections=expand("results/{{device}}/sections/{name}.md", name=PRECISION_SECTIONS),
            figure=report(
                "results/{device}/figures/precision_layer_norm.png",
                caption="../report/precision.rst",
                category="Mixed precision",
                labels={"figure": "layer_norm"},
            ),
            stamp=aggregate_stamp("precision_report"),
        log:
            "logs/{device}/report/precision.log",
        localrule: True
        conda:
            "../../envs/lmperf.yaml"
        shell:
            (
                report_shell(
                    "precision",
                    "python -m lmperf.kinds.precision.report --device {wildcards.device}"
                    " --tables-dir results/{wildcards.device}/tables --sections-dir results/{wildcards.device}/sections"
                    " --figures-dir results/{wildcards.device}/figures --records {input.records} > {log} 2>&1",
                )
                + stamp_shell("precision_report", "lmperf.kinds.precision.report")
            )
