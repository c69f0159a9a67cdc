# FlashAttention-2 cells: flash_forward and flash_backward (correctness against float64),
# flash_benchmarking (one job per precision writes a record per implementation × head dim × length:
# one CUDA start-up, one parallel compilation of the Triton candidates) and the leaderboard.

if FLASH:
    # host memory: the GPU jobs spawn up to 15 processes (each with torch and a CUDA context) to
    # compile Triton kernels or run correctness groups in parallel
    FLASH_MEM_MB = 8000 if DEVICE == "cpu" else 32000

    if "correctness" in FLASH:
        FLASH_CORRECTNESS = FLASH["correctness"]

        rule flash_correctness:
            output:
                FLASH_CORRECTNESS_RECORD,
            wildcard_constraints:
                impl="pytorch|triton",
            conda:
                "../../envs/lmperf.yaml"
            log:
                "logs/{device}/flash/correctness_{impl}.log",
            params:
                precisions=FLASH_CORRECTNESS["precisions"],
                head_dims=FLASH_CORRECTNESS["head_dims"],
                causal=["true" if c else "false" for c in FLASH_CORRECTNESS["causal"]],
                shapes=["x".join(map(str, s)) for s in FLASH_CORRECTNESS["shapes"]],
                triton_tiles=FLASH_CORRECTNESS.get("triton_tiles", "pinned"),
                seed="" if FLASH.get("seed") is None else f"--seed {FLASH['seed']}",
                workers="" if FLASH.get("workers") is None else f"--workers {FLASH['workers']}",
                code=flash_code(),
            threads: THREADS_PER_CELL
            resources:
                gpu=GPUS_PER_CELL,
                mem_mb=FLASH_MEM_MB,
                # minutes: the Triton job compiles ~250 small kernels (spread over processes)
                runtime=lambda wc: 20 if wc.impl == "triton" else 10,
            shell:
                # on a CPU the cell itself sets TRITON_INTERPRET=1 before Triton loads
                "python -m lmperf.cells flash_correctness --output {output} --device {wildcards.device}"
                " --implementation {wildcards.impl} --precisions {params.precisions}"
                " --head-dims {params.head_dims} --causal {params.causal} --shapes {params.shapes}"
                " --triton-tiles {params.triton_tiles} {params.seed} {params.workers} > {log} 2>&1"

    if "benchmarking" in FLASH:
        FLASH_BENCH = FLASH["benchmarking"]

        rule flash_benchmark:
            output:
                flash_bench_outputs(),
            conda:
                "../../envs/lmperf.yaml"
            log:
                "logs/{device}/flash/bench_{precision}.log",
            params:
                template=lambda wc: FLASH_BENCH_RECORD.format(
                    device=wc.device, impl="{impl}", precision=wc.precision, d="{head_dim}", n="{seq_len}"
                ),
                implementations=FLASH_BENCH["implementations"],
                sdpa_backend=lambda wc: FLASH_BENCH.get("sdpa_backends", {}).get(
                    wc.precision, "FLASH_ATTENTION" if wc.precision != "fp32" else "EFFICIENT_ATTENTION"
                ),
                head_dims=FLASH_BENCH["head_dims"],
                sequence_lengths=sorted(FLASH_BENCH["sequence_lengths"]),
                batch_size=FLASH_BENCH.get("batch_size", 1),
                causal="--causal" if FLASH_BENCH.get("causal", True) else "--no-causal",
                warmup_ms=FLASH_BENCH.get("warmup_ms", 25),
                rep_ms=FLASH_BENCH.get("rep_ms", 100),
                autotune=" ".join(
                    f"--autotune-{key}-ms {FLASH_BENCH[f'autotune_{key}_ms']}"
                    for key in ("warmup", "rep")
                    if FLASH_BENCH.get(f"autotune_{key}_ms") is not None
                ),
                precompile="--precompile" if FLASH_BENCH.get("precompile", True) else "--no-precompile",
                workers="" if FLASH.get("workers") is None else f"--workers {FLASH['workers']}",
                code=flash_code(),
            threads: THREADS_PER_CELL
            resources:
                gpu=GPUS_PER_CELL,
                mem_mb=FLASH_MEM_MB,
                # minutes: every implementation × head dim × length of one precision, plus compilation
                runtime=20,
            shell:
                "python -m lmperf.cells flash_benchmark --output '{params.template}' --device {wildcards.device}"
                " --precision {wildcards.precision} --implementations {params.implementations}"
                " --sdpa-backend {params.sdpa_backend} --head-dims {params.head_dims}"
                " --sequence-lengths {params.sequence_lengths} --batch-size {params.batch_size} {params.causal}"
                " --warmup-ms {params.warmup_ms} --rep-ms {params.rep_ms} {params.autotune} {params.precompile}"
                " {params.workers} > {log} 2>&1"

    if "leaderboard" in FLASH:
        FLASH_LEADERBOARD = FLASH["leaderboard"]

        rule flash_leaderboard:
            output:
                FLASH_LEADERBOARD_RECORD,
            conda:
                "../../envs/lmperf.yaml"
            log:
                "logs/{device}/flash/leaderboard.log",
            params:
                implementations=FLASH_LEADERBOARD["implementations"],
                compile="--compile" if FLASH_LEADERBOARD.get("compile", True) else "--no-compile",
                warmup_ms=FLASH_LEADERBOARD.get("warmup_ms", 1000),
                rep_ms=FLASH_LEADERBOARD.get("rep_ms", 10000),
                forward_head_dims=FLASH_LEADERBOARD.get("forward_head_dims", [64, 128]),
                forward_sequence_length=FLASH_LEADERBOARD.get("forward_sequence_length", 16384),
                forward_batch=FLASH_LEADERBOARD.get("forward_batch", 16),
                autotune=" ".join(
                    f"--autotune-{key}-ms {FLASH_LEADERBOARD[f'autotune_{key}_ms']}"
                    for key in ("warmup", "rep")
                    if FLASH_LEADERBOARD.get(f"autotune_{key}_ms") is not None
                ),
                precompile="--precompile" if FLASH_LEADERBOARD.get("precompile", True) else "--no-precompile",
                workers="" if FLASH.get("workers") is None else f"--workers {FLASH['workers']}",
                code=flash_code(),
            threads: THREADS_PER_CELL
            resources:
                gpu=GPUS_PER_CELL,
                mem_mb=FLASH_MEM_MB,
                # minutes: three torch.compile'd protocols of 11 s each, compilation, the eager table
                runtime=15,
            shell:
                "python -m lmperf.cells flash_leaderboard --output {output} --device {wildcards.device}"
                " --implementations {params.implementations} {params.compile} --warmup-ms {params.warmup_ms}"
                " --rep-ms {params.rep_ms} --forward-head-dims {params.forward_head_dims}"
                " --forward-sequence-length {params.forward_sequence_length}"
                " --forward-batch {params.forward_batch} {params.autotune} {params.precompile}"
                " {params.workers} > {log} 2>&1"

    FLASH_FIGURES = ["speedup", "time"]
    FLASH_SECTIONS = ["flash_forward", "flash_backward", "flash_benchmarking", "leaderboard"]
    FLASH_TABLES = ["correctness", "benchmarking", "leaderboard"]
    SECTION_FILES.extend(f"results/{DEVICE}/sections/{name}.md" for name in FLASH_SECTIONS)

    rule flash_report:
        localrule: True
        input:
            measured(flash_records()),
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
        conda:
            "../../envs/lmperf.yaml"
        log:
            "logs/{device}/report/flash.log",
        params:
            code=code_version("report/flash.py", "report/common.py", "peaks.py"),
        shell:
            "python -m lmperf.report.flash --device {wildcards.device} --tables-dir results/{wildcards.device}/tables"
            " --sections-dir results/{wildcards.device}/sections --figures-dir results/{wildcards.device}/figures"
            " --records {input} > {log} 2>&1"
