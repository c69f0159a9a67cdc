# The speed ladder (issue 13): how fast each model trains here, one change at a time from the
# course's eager fp32 step, with MFU against the datasheet's and a measured GEMM ceiling.
# gemm_peak: one process, seconds; ladder: one process per (model, context) writes a record per rung.

LADDER = GRID.get("ladder")
GEMM_PEAK = GRID.get("gemm_peak")
LADDER_RECORD = "results/{device}/ladder/{model}_ctx{ctx}_{rung}.json"
GEMM_PEAK_RECORD = "results/{device}/gemm_peak/square_gemm.json"


def ladder_jobs():
    """(model, context) pairs: every size at the main lengths, some at the long ones."""
    if not LADDER:
        return []
    grids = [LADDER] + ([LADDER["long_context"]] if "long_context" in LADDER else [])
    return sorted({(m, c) for g in grids for m in g["models"] for c in g["context_lengths"]})


def ladder_outputs(device="{device}", model="{model}", ctx="{ctx}"):
    return [LADDER_RECORD.format(device=device, model=model, ctx=ctx, rung=r) for r in LADDER["rungs"]]


def gemm_peak_records():
    return [GEMM_PEAK_RECORD.format(device=DEVICE)] if GEMM_PEAK else []


LADDER_PROFILE_RECORD = "results/{device}/ladder_profile/{model}_ctx{ctx}.json"


def ladder_profile_records():
    """Nsight Systems profiles of the best rung of these (model, context) ladders."""
    if not LADDER or "profile" not in LADDER:
        return []
    prof = LADDER["profile"]
    jobs = set(ladder_jobs())
    return sorted(LADDER_PROFILE_RECORD.format(device=DEVICE, model=m, ctx=c)
                  for m in prof["models"] for c in prof["context_lengths"] if (m, c) in jobs)


def ladder_records():
    return (sorted(p for m, c in ladder_jobs() for p in ladder_outputs(DEVICE, m, c)) + gemm_peak_records()
            + ladder_profile_records())


if GEMM_PEAK:

    rule gemm_peak_cell:
        output:
            GEMM_PEAK_RECORD,
        conda:
            "../../envs/lmperf.yaml"
        log:
            "logs/{device}/gemm_peak/square_gemm.log",
        params:
            sizes=GEMM_PEAK["sizes"],
            precisions=GEMM_PEAK["precisions"],
            warmup_calls=GEMM_PEAK.get("warmup_calls", 3),
            measured_calls=GEMM_PEAK.get("measured_calls", 10),
            repeats=GEMM_PEAK.get("repeats", 3),
            code=code_version("cells/gemm_peak.py", *CELL_CODE_COMMON),
        threads: THREADS_PER_CELL
        resources:
            gpu=GPUS_PER_CELL,
            mem_mb=4000,
            runtime=5,
        shell:
            "python -m lmperf.cells gemm_peak --output {output} --device {wildcards.device}"
            " --sizes {params.sizes} --precisions {params.precisions} --warmup-calls {params.warmup_calls}"
            " --measured-calls {params.measured_calls} --repeats {params.repeats} > {log} 2>&1"


if LADDER:

    rule ladder_cell:
        input:
            gemm=gemm_peak_records(),
        output:
            ladder_outputs(),
        conda:
            "../../envs/lmperf.yaml"
        log:
            "logs/{device}/ladder/{model}_ctx{ctx}.log",
        params:
            template=lambda wc: LADDER_RECORD.format(device=wc.device, model=wc.model, ctx=wc.ctx, rung="{rung}"),
            rungs=LADDER["rungs"],
            batch_size=LADDER["batch_size"],
            max_batch_size=LADDER["max_batch_size"],
            accumulation_steps=LADDER["accumulation_steps"],
            vocab_size=LADDER["vocab_size"],
            warmup_steps=LADDER["warmup_steps"],
            measured_steps=LADDER["measured_steps"],
            gemm=lambda wc, input: f"--gemm-peak {input.gemm[0]}" if input.gemm else "",
            code=code_version("cells/ladder.py", "model.py", "attention.py", "flops.py", "dtypes.py", *CELL_CODE_COMMON,
                              *sorted(str(p.relative_to(SRC)) for p in (SRC / "flash").glob("*.py"))),
        threads: THREADS_PER_CELL
        resources:
            gpu=GPUS_PER_CELL,
            mem_mb=lambda wc: 8000 if wc.model in ("small", "medium", "tiny", "mini") else 32000,
            runtime=20,
        shell:
            "python -m lmperf.cells ladder --output '{params.template}' --device {wildcards.device}"
            " --model {wildcards.model} --context-length {wildcards.ctx} --rungs {params.rungs}"
            " --batch-size {params.batch_size} --max-batch-size {params.max_batch_size}"
            " --accumulation-steps {params.accumulation_steps} --vocab-size {params.vocab_size}"
            " --warmup-steps {params.warmup_steps} --measured-steps {params.measured_steps} {params.gemm}"
            " > {log} 2>&1"

    # the best rung of a ladder again, under nsys: top kernels and idle gaps (what limits it)
    rule ladder_profile_cell:
        input:
            ladder_outputs(),
        output:
            LADDER_PROFILE_RECORD,
        conda:
            "../../envs/lmperf.yaml"
        log:
            "logs/{device}/ladder_profile/{model}_ctx{ctx}.log",
        params:
            steps=LADDER.get("profile", {}).get("steps", 3),
            top_kernels=LADDER.get("profile", {}).get("top_kernels", 10),
            code=code_version("cells/ladder_profile.py", "cells/ladder.py", "model.py", "attention.py", "dtypes.py",
                              "profiling/nsys.py", "profiling/kernels.py", "profiling/phases.py", *CELL_CODE_COMMON),
        threads: THREADS_PER_CELL
        resources:
            gpu=GPUS_PER_CELL,
            mem_mb=lambda wc: 8000 if wc.model in ("small", "medium", "tiny", "mini") else 32000,
            runtime=10,
        shell:
            "python -m lmperf.cells ladder_profile --output {output} --device {wildcards.device}"
            " --profile-steps {params.steps} --top-kernels {params.top_kernels} --records {input} > {log} 2>&1"

    LADDER_SECTIONS = ["speed_ladder"]
    SECTION_FILES.extend(f"results/{DEVICE}/sections/{name}.md" for name in LADDER_SECTIONS)

    rule ladder_report:
        localrule: True
        input:
            measured(ladder_records()),
        output:
            csv="results/{device}/tables/ladder.csv",
            sections=expand("results/{{device}}/sections/{name}.md", name=LADDER_SECTIONS),
            figures=[
                report(
                    f"results/{{device}}/figures/ladder_{m}_ctx{c}.png",
                    caption="../report/ladder.rst",
                    category="Speed ladder",
                    labels={"figure": f"{m} ctx {c}"},
                )
                for m, c in ladder_jobs()
            ],
        conda:
            "../../envs/lmperf.yaml"
        log:
            "logs/{device}/report/ladder.log",
        params:
            code=code_version("report/ladder.py", "report/common.py", "flops.py"),
            jobs=[f"{m}:{c}" for m, c in ladder_jobs()],
        shell:
            "python -m lmperf.report.ladder --device {wildcards.device} --csv {output.csv}"
            " --sections-dir results/{wildcards.device}/sections --figures-dir results/{wildcards.device}/figures"
            " --jobs {params.jobs} --records {input} > {log} 2>&1"

    # `snakemake --cores 1 ladder_all_target`: only the ladder, its ceiling and its section
    rule ladder_all_target:
        input:
            ladder_records(),
            f"results/{DEVICE}/sections/speed_ladder.md",
