# FlashAttention-2 cells: flash_forward and flash_backward (correctness against float64),
# flash_benchmarking (one job per precision writes a record per implementation × head dim × length:
# one CUDA start-up, one parallel compilation of the Triton candidates) and the leaderboard.

if FLASH:
    # host memory: the GPU jobs spawn up to 15 processes (each with torch and a CUDA context) to
    # compile Triton kernels or run correctness groups in parallel
    FLASH_MEM_MB = 8000 if DEVICE == "cpu" else 32000

    # seed and workers: flash-wide settings (null ones are left out of the flags)
    FLASH_COMMON = {key: FLASH[key] for key in ("seed", "workers")}

    if "correctness" in FLASH and RUN_CELLS:

        rule flash_correctness:
            input:
                stale_flags(FLASH_CORRECTNESS_RECORD),
            output:
                FLASH_CORRECTNESS_RECORD,
            log:
                "logs/{device}/flash/correctness_{impl}.log",
            wildcard_constraints:
                impl="|".join(FLASH["correctness"]["implementations"]),
            conda:
                "../../envs/lmperf.yaml"
            threads: THREADS_PER_CELL
            resources:
                gpu=GPUS_PER_CELL,
                mem_mb=FLASH_MEM_MB,
                # minutes: the Triton job compiles ~250 small kernels (spread over processes)
                runtime=lambda wc: 20 if wc.impl == "triton" else 10,
            params:
                flags=cell_flags({**FLASH["correctness"], **FLASH_COMMON}, skip=("implementations",)),
            shell:
                # on a CPU the cell itself sets TRITON_INTERPRET=1 before Triton loads
                cell_shell(
                    "flash_correctness",
                    "--output {output} --device {wildcards.device} --implementation {wildcards.impl}"
                    " {params.flags}",
                )

    if "benchmarking" in FLASH and RUN_CELLS:

        rule flash_benchmark:
            input:
                stale_flags(flash_bench_outputs()),
            output:
                flash_bench_outputs(),
            log:
                "logs/{device}/flash/bench_{precision}.log",
            conda:
                "../../envs/lmperf.yaml"
            threads: THREADS_PER_CELL
            resources:
                gpu=GPUS_PER_CELL,
                mem_mb=FLASH_MEM_MB,
                # minutes: every implementation × head dim × length of one precision, plus compilation
                runtime=20,
            params:
                template=lambda wc: FLASH_BENCH_RECORD.format(
                    device=wc.device, impl="{impl}", precision=wc.precision, d="{head_dim}", n="{seq_len}"
                ),
                # `sdpa` is pinned to one backend per precision
                sdpa_backend=lambda wc: FLASH["benchmarking"]["sdpa_backends"][wc.precision],
                flags=cell_flags(
                    {**FLASH["benchmarking"], "workers": FLASH["workers"]}, skip=("precisions", "sdpa_backends")
                ),
            shell:
                cell_shell(
                    "flash_benchmark",
                    "--output '{params.template}' --device {wildcards.device}"
                    " --precision {wildcards.precision} --sdpa-backend {params.sdpa_backend} {params.flags}",
                )

    if "leaderboard" in FLASH and RUN_CELLS:

        rule flash_leaderboard:
            input:
                stale_flags(FLASH_LEADERBOARD_RECORD),
            output:
                FLASH_LEADERBOARD_RECORD,
            log:
                "logs/{device}/flash/leaderboard.log",
            conda:
                "../../envs/lmperf.yaml"
            threads: THREADS_PER_CELL
            resources:
                gpu=GPUS_PER_CELL,
                mem_mb=FLASH_MEM_MB,
                # minutes: three torch.compile'd protocols of 11 s each, compilation, the eager table
                runtime=15,
            params:
                flags=cell_flags({**FLASH["leaderboard"], "workers": FLASH["workers"]}),
            shell:
                cell_shell("flash_leaderboard", "--output {output} --device {wildcards.device} {params.flags}")

    FLASH_FIGURES = ["speedup", "time"]
    FLASH_SECTIONS = ["flash_forward", "flash_backward", "flash_benchmarking", "leaderboard"]
    FLASH_TABLES = ["correctness", "benchmarking", "leaderboard"]
    SECTION_FILES.extend(f"results/{DEVICE}/sections/{name}.md" for name in FLASH_SECTIONS)

    rule flash_report:
        input:
            records=measured(flash_records()),
            stale=stamp_flag("flash_report", "lmperf.kinds.flash.report", measured(flash_records())),
        output:
            tables=expand("results/{{device}}/tables/flash_{name}.csv", name=FLASH_TABLES),
            sections=expand("results/{{device}}/sections/{name}.md", name=FLASH_SECTIONS),
            figures=[
                report(
                    f"results/{{device}}/figures/flash_{name}.png",
                    caption="../report/flash.rst",
                    category="FlashAttention-2",
                    labels={"figure": name},
                )
                for name in FLASH_FIGURES
            ],
            stamp=aggregate_stamp("flash_report"),
        log:
            "logs/{device}/report/flash.log",
        localrule: True
        conda:
            "../../envs/lmperf.yaml"
        shell:
            "python -m lmperf.kinds.flash.report --device {wildcards.device} --tables-dir results/{wildcards.device}/tables"
            " --sections-dir results/{wildcards.device}/sections --figures-dir results/{wildcards.device}/figures"
            " --records {input.records} > {log} 2>&1" + stamp_shell("flash_report", "lmperf.kinds.flash.report")
