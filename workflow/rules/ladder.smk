# The speed ladder: how fast each model trains here, one change at a time from the
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
    return sorted(
        LADDER_PROFILE_RECORD.format(device=DEVICE, model=m, ctx=c)
        for m in prof["models"]
        for c in prof["context_lengths"]
        if (m, c) in jobs
    )


def ladder_records():
    return (
        sorted(p for m, c in ladder_jobs() for p in ladder_outputs(DEVICE, m, c))
        + gemm_peak_records()
        + ladder_profile_records()
    )


if GEMM_PEAK and RUN_CELLS:

    rule gemm_peak_cell:
        input:
            stale_flags(GEMM_PEAK_RECORD),
        output:
            GEMM_PEAK_RECORD,
        log:
            "logs/{device}/gemm_peak/square_gemm.log",
        conda:
            "../../envs/lmperf.yaml"
        threads: THREADS_PER_CELL
        resources:
            gpu=GPUS_PER_CELL,
            mem_mb=4000,
            runtime=5,
        params:
            flags=cell_flags(GEMM_PEAK),
        shell:
            cell_shell("gemm_peak", "--output {output} --device {wildcards.device} {params.flags}")


if LADDER and RUN_CELLS:

    rule ladder_cell:
        input:
            gemm=gemm_peak_records(),
            stale=stale_flags(ladder_outputs()),
        output:
            ladder_outputs(),
        log:
            "logs/{device}/ladder/{model}_ctx{ctx}.log",
        conda:
            "../../envs/lmperf.yaml"
        threads: THREADS_PER_CELL
        resources:
            gpu=GPUS_PER_CELL,
            mem_mb=lambda wc: 8000 if parameters(wc) < 0.5e9 else 32000,
            runtime=20,
        params:
            template=lambda wc: LADDER_RECORD.format(device=wc.device, model=wc.model, ctx=wc.ctx, rung="{rung}"),
            # the grid axes are wildcards; profile is ladder_profile_cell's
            flags=cell_flags(LADDER, skip=("models", "context_lengths", "long_context", "profile")),
            gemm=lambda wc, input: f"--gemm-peak {input.gemm[0]}" if input.gemm else "",
        shell:
            cell_shell(
                "ladder",
                "--output '{params.template}' --device {wildcards.device} --model {wildcards.model}"
                " --context-length {wildcards.ctx} {params.flags} {params.gemm}",
            )

    # the best rung of a ladder again, under nsys: top kernels and idle gaps (what limits it)
    rule ladder_profile_cell:
        input:
            records=ladder_outputs(),
            stale=stale_flags(LADDER_PROFILE_RECORD),
        output:
            LADDER_PROFILE_RECORD,
        log:
            "logs/{device}/ladder_profile/{model}_ctx{ctx}.log",
        conda:
            "../../envs/lmperf.yaml"
        threads: THREADS_PER_CELL
        resources:
            gpu=GPUS_PER_CELL,
            mem_mb=lambda wc: 8000 if parameters(wc) < 0.5e9 else 32000,
            runtime=10,
        params:
            steps=LADDER["profile"]["steps"] if "profile" in LADDER else None,
            top_kernels=LADDER["profile"]["top_kernels"] if "profile" in LADDER else None,
        shell:
            cell_shell(
                "ladder_profile",
                "--output {output} --device {wildcards.device} --profile-steps {params.steps}"
                " --top-kernels {params.top_kernels} --records {input.records}",
            )


if LADDER:

    LADDER_SECTIONS = ["speed_ladder"]
    SECTION_FILES.extend(f"results/{DEVICE}/sections/{name}.md" for name in LADDER_SECTIONS)

    rule ladder_report:
        input:
            records=measured(ladder_records()),
            stale=stamp_flag(
                "ladder_report",
                "lmperf.kinds.ladder.report",
                measured(ladder_records()),
                " ".join(f"{m}:{c}" for m, c in ladder_jobs()),
            ),
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
            stamp=aggregate_stamp("ladder_report"),
        log:
            "logs/{device}/report/ladder.log",
        localrule: True
        conda:
            "../../envs/lmperf.yaml"
        params:
            jobs=[f"{m}:{c}" for m, c in ladder_jobs()],
        shell:
            "python -m lmperf.kinds.ladder.report --device {wildcards.device} --csv {output.csv}"
            " --sections-dir results/{wildcards.device}/sections --figures-dir results/{wildcards.device}/figures"
            " --jobs {params.jobs} --records {input.records} > {log} 2>&1"
            + stamp_shell(
                "ladder_report", "lmperf.kinds.ladder.report", extra=" ".join(f"{m}:{c}" for m, c in ladder_jobs())
            )

    # `snakemake --cores 1 ladder_all_target`: only the ladder, its ceiling and its section
    rule ladder_all_target:
        input:
            ladder_records(),
            f"results/{DEVICE}/sections/speed_ladder.md",
