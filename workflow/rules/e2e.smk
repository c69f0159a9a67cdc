# End-to-end cells: benchmarking_script, benchmarking_mixed_precision (c), torch_compile (b),
# and the whole model with other attention implementations (flash_benchmarking, in the model).

if RUN_CELLS:

    rule e2e_cell:
        input:
            stale_flags(E2E_RECORD),
        output:
            E2E_RECORD,
        log:
            "logs/{device}/e2e/{model}_ctx{ctx}_{precision}_{compile}_w{warmup}{attention}.log",
        conda:
            "../../envs/lmperf.yaml"
        threads: THREADS_PER_CELL
        resources:
            gpu=GPUS_PER_CELL,
            # host memory and time grow with the model (2.7B: ~14 GB of fp32 weights in host RAM)
            mem_mb=lambda wc: 8000 if parameters(wc) < 0.5e9 else 32000,
            runtime=lambda wc: 20 if wc.compile == "compiled" or parameters(wc) > 1.5e9 else 10,
        params:
            # the grid axes are wildcards; the rest of e2e's slice becomes flags
            flags=cell_flags(E2E, skip=("warmup_steps", "main", "compile", "warmup_sweep", "attention_compare")),
            attention=lambda wc: wc.attention.removeprefix("_") or "plain",
        shell:
            cell_shell(
                "e2e",
                "--output {output} --device {wildcards.device} --model {wildcards.model}"
                " --context-length {wildcards.ctx} --precision {wildcards.precision} --compile {wildcards.compile}"
                " --warmup-steps {wildcards.warmup} --attention {params.attention} {params.flags}",
            )


E2E_FIGURES = ["phase_times", "precision_speedup", "warmup", "compile"]
E2E_SECTIONS = [
    "benchmarking_script",
    "benchmarking_mixed_precision_c",
    "torch_compile_b",
    "timer_check",
    "flash_benchmarking_model",
]
SECTION_FILES.extend(f"results/{DEVICE}/sections/{name}.md" for name in E2E_SECTIONS)
E2E_REPORT_EXTRA = f"default_warmup={E2E['warmup_steps']}"


rule e2e_report:
    input:
        records=measured(e2e_records()),
        stale=stamp_flag("e2e_report", "lmperf.report.e2e", measured(e2e_records()), E2E_REPORT_EXTRA),
    output:
        csv="results/{device}/tables/e2e.csv",
        sections=expand("results/{{device}}/sections/{name}.md", name=E2E_SECTIONS),
        figures=[
            report(
                f"results/{{device}}/figures/e2e_{name}.png",
                caption="../report/e2e.rst",
                category="End-to-end",
                labels={"figure": name},
            )
            for name in E2E_FIGURES
        ],
        stamp=aggregate_stamp("e2e_report"),
    log:
        "logs/{device}/report/e2e.log",
    localrule: True
    conda:
        "../../envs/lmperf.yaml"
    params:
        warmup_steps=E2E["warmup_steps"],
    shell:
        (
            report_shell(
                "e2e",
                "python -m lmperf.report.e2e --device {wildcards.device} --default-warmup {params.warmup_steps}"
                " --csv {output.csv} --sections-dir results/{wildcards.device}/sections"
                " --figures-dir results/{wildcards.device}/figures --records {input.records} > {log} 2>&1",
            )
            + stamp_shell("e2e_report", "lmperf.report.e2e", extra=E2E_REPORT_EXTRA)
        )
