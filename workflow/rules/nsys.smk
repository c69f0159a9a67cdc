# Nsight Systems profiles: nsys_profile (a)-(e). One job per (model, precision) profiles every
# context length in one nsys process and writes a record per (context length, mode); the
# .nsys-rep and .sqlite stay beside the records (git-ignored), their paths in the records.

if NSYS:

    rule nsys_cells:
        output:
            nsys_outputs(),
        conda:
            "../../envs/lmperf.yaml"
        log:
            "logs/{device}/nsys/{model}_{precision}.log",
        params:
            template=lambda wc: NSYS_RECORD.format(
                device=wc.device, model=wc.model, precision=wc.precision, ctx="{ctx}", mode="{mode}"
            ),
            context_lengths=" ".join(map(str, sorted(NSYS["context_lengths"]))),
            warmup_steps=NSYS.get("warmup_steps", 2),
            measured_steps=NSYS.get("measured_steps", 2),
            batch_size=NSYS.get("batch_size", 4),
            vocab_size=NSYS.get("vocab_size", 10000),
            top_kernels=NSYS.get("top_kernels", 15),
            nvtx_overhead_steps=NSYS.get("nvtx_overhead_steps", 5),
            profiler=NSYS.get("profiler", "auto"),
            nsys_path=f"--nsys-path '{NSYS['nsys_path']}'" if NSYS.get("nsys_path") else "",
            code=code_version(
                "cells/nsys.py",
                "profiling/__init__.py",
                "profiling/kernels.py",
                "profiling/nsys.py",
                "profiling/phases.py",
                "profiling/torch_fallback.py",
                "model.py",
                "attention.py",
                "nvtx.py",
                "flops.py",
                *CELL_CODE_COMMON,
            ),
        threads: THREADS_PER_CELL
        resources:
            gpu=GPUS_PER_CELL,
            # host memory and time grow with the model (nsys export of a large profile included)
            mem_mb=lambda wc: 8000 if wc.model in ("small", "medium", "tiny", "mini") else 32000,
            runtime=lambda wc: 10 if wc.model in ("small", "medium", "tiny", "mini") else 20,
        shell:
            "python -m lmperf.cells.nsys --output '{params.template}' --device {wildcards.device}"
            " --model {wildcards.model} --precision {wildcards.precision}"
            " --context-lengths {params.context_lengths} --warmup-steps {params.warmup_steps}"
            " --measured-steps {params.measured_steps} --batch-size {params.batch_size}"
            " --vocab-size {params.vocab_size} --top-kernels {params.top_kernels}"
            " --nvtx-overhead-steps {params.nvtx_overhead_steps} --profiler {params.profiler}"
            " {params.nsys_path} > {log} 2>&1"

    NSYS_FIGURES = ["class_shares", "attention"]
    NSYS_SECTIONS = ["nsys_profile"]
    SECTION_FILES.extend(f"results/{DEVICE}/sections/{name}.md" for name in NSYS_SECTIONS)

    rule nsys_report:
        localrule: True
        input:
            records=measured(nsys_records()),
            # the same cells' end-to-end records: the profiler's forward time against the timer's
            e2e=measured(nsys_e2e_records()),
        output:
            csv="results/{device}/tables/nsys.csv",
            kernels_csv="results/{device}/tables/nsys_kernels.csv",
            sections=expand("results/{{device}}/sections/{name}.md", name=NSYS_SECTIONS),
            figures=[
                report(
                    f"results/{{device}}/figures/nsys_{name}.png",
                    caption="../report/nsys.rst",
                    category="Nsight Systems",
                    labels={"figure": name},
                )
                for name in NSYS_FIGURES
            ],
        conda:
            "../../envs/lmperf.yaml"
        log:
            "logs/{device}/report/nsys.log",
        params:
            code=code_version("report/nsys.py", "report/common.py", "profiling/kernels.py"),
        shell:
            "python -m lmperf.report.nsys --device {wildcards.device} --csv {output.csv}"
            " --kernels-csv {output.kernels_csv} --sections-dir results/{wildcards.device}/sections"
            " --figures-dir results/{wildcards.device}/figures --records {input.records}"
            " --e2e-records {input.e2e} > {log} 2>&1"
