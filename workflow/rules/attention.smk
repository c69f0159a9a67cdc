# Attention cells: pytorch_attention and torch_compile (a). One job per implementation writes a
# record per (head dim, sequence length): one process, one torch.compile, one CUDA start-up.

if ATTENTION:

    rule attention_cells:
        output:
            attention_outputs(),
        wildcard_constraints:
            impl="|".join(ATTENTION["implementations"]),
        conda:
            "../../envs/lmperf.yaml"
        log:
            "logs/{device}/attention/{impl}_{precision}.log",
        params:
            template=lambda wc: ATTENTION_RECORD.format(
                device=wc.device, impl=wc.impl, precision=wc.precision, d="{head_dim}", n="{seq_len}"
            ),
            head_dims=ATTENTION["head_dims"],
            sequence_lengths=sorted(ATTENTION["sequence_lengths"]),
            batch_size=ATTENTION.get("batch_size", 8),
            warmup_passes=ATTENTION.get("warmup_passes", 5),
            measured_passes=ATTENTION.get("measured_passes", 100),
            min_measured_passes=ATTENTION.get("min_measured_passes", 2),
            max_phase_seconds=ATTENTION.get("max_phase_seconds", 1.5),
            full_passes_up_to=ATTENTION.get("full_passes_up_to", 0),
            max_warmup_seconds=ATTENTION.get("max_warmup_seconds", 0.5),
            compile_flag="--compile-dynamic" if ATTENTION.get("compile_dynamic", True) else "--no-compile-dynamic",
            code=lambda wc: attention_code(wc.impl),
        threads: THREADS_PER_CELL
        resources:
            gpu=GPUS_PER_CELL,
            mem_mb=16000,
            # minutes: every cell of the implementation, plus torch.compile for compiled ones
            runtime=lambda wc: 20 if "compiled" in wc.impl else 15,
        shell:
            "python -m lmperf.cells.attention --output '{params.template}' --device {wildcards.device}"
            " --implementation {wildcards.impl} --precision {wildcards.precision}"
            " --head-dims {params.head_dims} --sequence-lengths {params.sequence_lengths}"
            " --batch-size {params.batch_size} --warmup-passes {params.warmup_passes}"
            " --measured-passes {params.measured_passes} --min-measured-passes {params.min_measured_passes}"
            " --max-phase-seconds {params.max_phase_seconds} --max-warmup-seconds {params.max_warmup_seconds}"
            " --full-passes-up-to {params.full_passes_up_to}"
            " {params.compile_flag} > {log} 2>&1"

    ATTENTION_FIGURES = ["time", "memory", "compile"]
    ATTENTION_SECTIONS = ["pytorch_attention", "torch_compile_a"]
    SECTION_FILES.extend(f"results/{DEVICE}/sections/{name}.md" for name in ATTENTION_SECTIONS)

    rule attention_report:
        localrule: True
        input:
            measured(attention_records()),
        output:
            csv="results/{device}/tables/attention.csv",
            sections=expand("results/{{device}}/sections/{name}.md", name=ATTENTION_SECTIONS),
            figures=[
                report(
                    f"results/{{device}}/figures/attention_{name}.png",
                    caption="../report/attention.rst",
                    category="Attention",
                    labels={"figure": name},
                )
                for name in ATTENTION_FIGURES
            ],
        conda:
            "../../envs/lmperf.yaml"
        log:
            "logs/{device}/report/attention.log",
        params:
            code=code_version("report/attention.py", "report/common.py", "attention_memory.py"),
        shell:
            "python -m lmperf.report.attention --device {wildcards.device} --csv {output.csv}"
            " --sections-dir results/{wildcards.device}/sections --figures-dir results/{wildcards.device}/figures"
            " --records {input} > {log} 2>&1"
