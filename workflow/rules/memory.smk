# Memory cells: memory_profiling (a)-(e). One job per (model, context, precision) records an
# inference forward and a training step with the CUDA allocator's history (two records; the
# snapshot pickles beside them are git-ignored and not declared: the records hold what the report
# needs). Without CUDA the records say `unsupported`.

if MEMORY:

    rule memory_cell:
        output:
            inference="results/{device}/memory/{model}_ctx{ctx}_{precision}_inference.json",
            training="results/{device}/memory/{model}_ctx{ctx}_{precision}_training.json",
        conda:
            "../../envs/lmperf.yaml"
        log:
            "logs/{device}/memory/{model}_ctx{ctx}_{precision}.log",
        params:
            batch_size=MEMORY.get("batch_size", 4),
            vocab_size=MEMORY.get("vocab_size", 10000),
            warmup_steps=MEMORY.get("warmup_steps", 1),
            reference_context_length=MEMORY.get("reference_context_length", 512),
            max_entries=MEMORY.get("max_entries", 1000000),
            timeline_points=MEMORY.get("timeline_points", 2000),
            top_allocations=MEMORY.get("top_allocations", 10),
            code=code_version("cells/memory.py", "memory.py", "memory_account.py", "model.py", "attention.py", *CELL_CODE_COMMON),
        threads: THREADS_PER_CELL
        resources:
            gpu=GPUS_PER_CELL,
            # host memory: the snapshot's Python objects and its pickle, not the model (built on the GPU)
            mem_mb=lambda wc: 4000 if wc.model in ("tiny", "mini") else 16000,
            runtime=10,
        shell:
            "python -m lmperf.cells.memory"
            " --output 'results/{wildcards.device}/memory/{wildcards.model}_ctx{wildcards.ctx}_{wildcards.precision}_{{mode}}.json'"
            " --device {wildcards.device} --model {wildcards.model} --context-length {wildcards.ctx}"
            " --precision {wildcards.precision} --modes inference training"
            " --warmup-steps {params.warmup_steps} --batch-size {params.batch_size} --vocab-size {params.vocab_size}"
            " --reference-context-length {params.reference_context_length} --max-entries {params.max_entries}"
            " --timeline-points {params.timeline_points} --top-allocations {params.top_allocations} > {log} 2>&1"

    MEMORY_TIMELINES = sorted(
        f"results/{{device}}/figures/memory_timeline_{m}_ctx{c}_{p}_{mode}.png"
        for m in MEMORY["models"]
        for c in MEMORY["context_lengths"]
        for p in MEMORY["precisions"]
        for mode in MEMORY_MODES
    )
    SECTION_FILES.append(f"results/{DEVICE}/sections/memory_profiling.md")

    rule memory_report:
        localrule: True
        input:
            measured(memory_records()),
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
        conda:
            "../../envs/lmperf.yaml"
        log:
            "logs/{device}/report/memory.log",
        params:
            code=code_version("report/memory.py", "report/common.py", "memory_account.py"),
            reference_model=MEMORY.get("reference_model", "2.7B"),
            batch_size=MEMORY.get("batch_size", 4),
            reference_context_length=MEMORY.get("reference_context_length", 512),
        shell:
            "python -m lmperf.report.memory --device {wildcards.device} --csv {output.csv} --top-csv {output.top_csv}"
            " --sections-dir results/{wildcards.device}/sections --figures-dir results/{wildcards.device}/figures"
            " --reference-model {params.reference_model} --batch-size {params.batch_size}"
            " --reference-context-length {params.reference_context_length} --records {input} > {log} 2>&1"
