# End-to-end cells: benchmarking_script, benchmarking_mixed_precision (c), torch_compile (b),
# and the whole model with other attention implementations (flash_benchmarking, in the model).

E2E_SHELL = (
    "python -m lmperf.cells.e2e --output {output} --device {wildcards.device}"
    " --model {wildcards.model} --context-length {wildcards.ctx} --precision {wildcards.precision}"
    " --compile {wildcards.compile} --warmup-steps {wildcards.warmup}"
    " --measured-steps {params.measured_steps} --batch-size {params.batch_size}"
    " --vocab-size {params.vocab_size}"
)


# host memory and time limit grow with the model (2.7B: ~14 GB of fp32 weights in host RAM)
def e2e_mem_mb(wc):
    return 8000 if wc.model in ("small", "medium", "tiny", "mini") else 32000


def e2e_runtime(wc):
    return 20 if wc.compile == "compiled" or wc.model in ("xl", "2.7B") else 10


rule e2e_cell:
    output:
        E2E_RECORD,
    conda:
        "../../envs/lmperf.yaml"
    log:
        "logs/{device}/e2e/{model}_ctx{ctx}_{precision}_{compile}_w{warmup}.log",
    params:
        measured_steps=E2E["measured_steps"],
        batch_size=E2E["batch_size"],
        vocab_size=E2E["vocab_size"],
        code=code_version("cells/e2e.py", "model.py", "attention.py", "flops.py", *CELL_CODE_COMMON),
    threads: THREADS_PER_CELL
    resources:
        gpu=GPUS_PER_CELL,
        mem_mb=e2e_mem_mb,
        runtime=e2e_runtime,
    shell:
        E2E_SHELL + " > {log} 2>&1"


# The same cell with `--attention NAME` (grids.<gpu|cpu>.e2e.attention_compare); its code hash
# takes in the flash kernels too.
rule e2e_attention_cell:
    output:
        E2E_ATTENTION_RECORD,
    conda:
        "../../envs/lmperf.yaml"
    log:
        "logs/{device}/e2e/{model}_ctx{ctx}_{precision}_{compile}_w{warmup}_{attention}.log",
    params:
        measured_steps=E2E["measured_steps"],
        batch_size=E2E["batch_size"],
        vocab_size=E2E["vocab_size"],
        code=code_version("cells/e2e.py", "model.py", "attention.py", "flops.py", *CELL_CODE_COMMON,
                          *sorted(str(p.relative_to(SRC)) for p in (SRC / "flash").glob("*.py"))),
    threads: THREADS_PER_CELL
    resources:
        gpu=GPUS_PER_CELL,
        mem_mb=e2e_mem_mb,
        runtime=e2e_runtime,
    shell:
        E2E_SHELL + " --attention {wildcards.attention} > {log} 2>&1"


E2E_FIGURES = ["phase_times", "precision_speedup", "warmup", "compile"]
E2E_SECTIONS = ["benchmarking_script", "benchmarking_mixed_precision_c", "torch_compile_b", "timer_check",
                "flash_benchmarking_model"]
SECTION_FILES.extend(f"results/{DEVICE}/sections/{name}.md" for name in E2E_SECTIONS)


rule e2e_report:
    localrule: True
    input:
        measured(e2e_records()),
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
    conda:
        "../../envs/lmperf.yaml"
    log:
        "logs/{device}/report/e2e.log",
    params:
        code=code_version("report/e2e.py", "report/common.py", "flops.py"),
        warmup_steps=E2E["warmup_steps"],
    shell:
        "python -m lmperf.report.e2e --device {wildcards.device} --default-warmup {params.warmup_steps}"
        " --csv {output.csv} --sections-dir results/{wildcards.device}/sections"
        " --figures-dir results/{wildcards.device}/figures --records {input} > {log} 2>&1"
