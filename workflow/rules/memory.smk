# Memory cells: memory_profiling (a)-(e). One job per (model, context, precision) records an
# inference forward and a training step with the CUDA allocator's history (two records; the
# snapshot pickles beside them are git-ignored and not declared: the records hold what the report
# needs). Without CUDA the records say `unsupported`.

if MEMORY:

    if RUN_CELLS:

        rule memory_cell:
            input:
                stale_flags([MEMORY_RECORD.replace("{mode}", mode) for mode in MEMORY_MODES]),
            output:
                inference="results/{device}/memory/{model}_ctx{ctx}_{precision}_inference.json",
                training="results/{device}/memory/{model}_ctx{ctx}_{precision}_training.json",
            log:
                "logs/{device}/memory/{model}_ctx{ctx}_{precision}.log",
            conda:
                "../../envs/lmperf.yaml"
            threads: THREADS_PER_CELL
            resources:
                gpu=GPUS_PER_CELL,
                # host memory: the snapshot's Python objects and its pickle, not the model (built on the GPU)
                mem_mb=lambda wc: 4000 if parameters(wc) < 0.1e9 else 16000,
                runtime=10,
            params:
                # reference_model is the report's (its question (d)), not the cell's
                flags=cell_flags(MEMORY, skip=("models", "context_lengths", "precisions", "reference_model")),
            shell:
                cell_shell(
                    "memory",
                    "--output 'results/{wildcards.device}/memory/{wildcards.model}_ctx{wildcards.ctx}"
                    "_{wildcards.precision}_{{mode}}.json' --device {wildcards.device} --model {wildcards.model}"
                    " --context-length {wildcards.ctx} --precision {wildcards.precision} --modes inference training"
                    " {params.flags}",
                )

    MEMORY_TIMELINES = sorted(
        f"results/{{device}}/figures/memory_timeline_{m}_ctx{c}_{p}_{mode}.png"
        for m in MEMORY["models"]
        for c in MEMORY["context_lengths"]
        for p in MEMORY["precisions"]
        for mode in MEMORY_MODES
    )
    SECTION_FILES.append(f"results/{DEVICE}/sections/memory_profiling.md")

    rule memory_report:
        input:
            records=measured(memory_records()),
            stale=stamp_flag("memory_report", "lmperf.kinds.memory.report", measured(memory_records()), str(MEMORY)),
        output:
            csv="results/{device}/tables/memory.csv",
            top_csv="results/{device}/tables/memory_top_allocations.csv",
            section="results/{device}/sections/memory_profiling.md",
            peaks=report(
                "results/{device}/figures/memory_peaks.png",
                caption="../report/memory.rst",
                category="Memory",
                labels={"figure": "peaks"},
            ),
            timelines=report(
                MEMORY_TIMELINES,
                caption="../report/memory.rst",
                category="Memory",
                subcategory="Timelines",
            ),
            stamp=aggregate_stamp("memory_report"),
        log:
            "logs/{device}/report/memory.log",
        localrule: True
        conda:
            "../../envs/lmperf.yaml"
        params:
            reference_model=MEMORY["reference_model"],
            batch_size=MEMORY["batch_size"],
            reference_context_length=MEMORY["reference_context_length"],
        shell:
            (
                report_shell(
                    "memory",
                    "python -m lmperf.kinds.memory.report --device {wildcards.device} --csv {output.csv} --top-csv {output.top_csv}"
                    " --sections-dir results/{wildcards.device}/sections --figures-dir results/{wildcards.device}/figures"
                    " --reference-model {params.reference_model} --batch-size {params.batch_size}"
                    " --reference-context-length {params.reference_context_length} --records {input.records} > {log} 2>&1",
                )
                + stamp_shell("memory_report", "lmperf.kinds.memory.report", extra=str(MEMORY))
            )
