# End-to-end cells: benchmarking_script, benchmarking_mixed_precision (c), torch_compile (b),
# and the whole model with other attention implementations (flash_benchmarking, in the model).

if RUN_CELLS:

    def compile_first(wildcards):
        """A compiled cell that is to be measured waits for the compile job when that job is to run
        too (its record missing or stale), so it finds its graphs on disk. A cell whose record is
        current takes no input from the job: the job rerunning (a compiled cell added to the grid)
        re-measures only the cells that need it."""
        if wildcards.compile != "compiled":
            return []
        names = dict(device=wildcards.device, model=wildcards.model, ctx=wildcards.ctx, precision=wildcards.precision)
        record, compiled = E2E_RECORD.format(**dict(wildcards.items())), E2E_COMPILE_RECORD.format(**names)
        measured_anyway = not Path(record).exists() or record in STALE_RECORDS
        compile_runs = not Path(compiled).exists() or compiled in STALE_RECORDS
        return [compiled] if measured_anyway and compile_runs and compiled in e2e_compile_records() else []

    # A measured compiled cell loads the graphs the compile job left in its cache, so it compiles
    # nothing and Inductor's pool of compile workers only costs it: on an H100 host (16 CPUs, 16
    # workers by default) a measured compiled cell took 1.0-6.7 s from writing its record to exiting
    # while the pool shut down, against 0.2 s with one worker; step times alike, no cache miss either
    # way (bench/grid_time_notes.md; bench/compile_exit_probe.py). Inductor's cache keys leave the
    # worker count out, so the job's graphs (compiled with its default) are found all the same.
    MEASURED_COMPILE_THREADS = 1

    rule e2e_cell:
        input:
            stale_flags(E2E_RECORD),
            compile_first,
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
            compile_flags=lambda wc: (
                f"--compile-cache {E2E_COMPILE_CACHE.format(**dict(wc.items()))} --compile-threads {MEASURED_COMPILE_THREADS}"
                if wc.compile == "compiled"
                else ""
            ),
            # attention `flash` runs our kernels: those cells' versions cover them, the others' not
            code_version=cell_version_param,
        shell:
            cell_shell(
                "e2e",
                "--output {output} --device {wildcards.device} --model {wildcards.model}"
                " --context-length {wildcards.ctx} --precision {wildcards.precision} --compile {wildcards.compile}"
                " --warmup-steps {wildcards.warmup} --attention {params.attention} {params.compile_flags} {params.flags}",
                per_record=True,
            )


# torch_compile (b)'s compilation: before the compiled cells (priority, and `compile_first`)
if RUN_CELLS and E2E_COMPILE_CELLS:

    rule e2e_compile:
        input:
            stale_flags(e2e_compile_records()),
        output:
            [E2E_COMPILE_RECORD.format(device="{device}", model=m, ctx=c, precision=p) for m, c, p in E2E_COMPILE_CELLS],
        log:
            "logs/{device}/e2e_compile/job.log",
        priority: 10
        conda:
            "../../envs/lmperf.yaml"
        # the cells' threads, so its processes get the OMP_NUM_THREADS the measured cells get (Inductor's
        # cache keys include the thread count); how many compile at once follows the GPU's memory and the
        # job's CPU affinity (every CPU of this machine locally; on SLURM its --cpus-per-task, which
        # `--set-resources e2e_compile:cpus_per_task=16` raises without changing the thread count)
        threads: THREADS_PER_CELL
        resources:
            gpu=GPUS_PER_CELL,
            mem_mb=64000,
            runtime=60,
        params:
            cells=" ".join(f"{m}:{c}:{p}" for m, c, p in E2E_COMPILE_CELLS),
            # patterns the job fills in per cell (functions: Snakemake formats no braces they return)
            output=lambda wc: E2E_COMPILE_RECORD.replace("{device}", wc.device),
            cache=lambda wc: E2E_COMPILE_CACHE.replace("{device}", wc.device),
            log=lambda wc: f"logs/{wc.device}/e2e_compile/{{model}}_ctx{{ctx}}_{{precision}}.log",
            flags=f"--batch-size {E2E['batch_size']} --vocab-size {E2E['vocab_size']}",
        shell:
            cell_shell(
                "e2e_compile",
                "--output '{params.output}' --cache '{params.cache}' --log '{params.log}' --device {wildcards.device}"
                " --cells {params.cells} {params.flags}",
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
        # the compile job's: torch_compile (b)'s cold compile times
        compile_records=measured(e2e_compile_records()),
        stale=stamp_flag(
            "e2e_report", "lmperf.kinds.e2e.report", measured(e2e_records() + e2e_compile_records()), E2E_REPORT_EXTRA
        ),
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
                "python -m lmperf.kinds.e2e.report --device {wildcards.device} --default-warmup {params.warmup_steps}"
                " --csv {output.csv} --sections-dir results/{wildcards.device}/sections"
                " --figures-dir results/{wildcards.device}/figures --records {input.records}"
                " --compile-records {input.compile_records} > {log} 2>&1",
            )
            + stamp_shell(
                "e2e_report",
                "lmperf.kinds.e2e.report",
                inputs="{input.records} {input.compile_records}",
                extra=E2E_REPORT_EXTRA,
            )
        )
