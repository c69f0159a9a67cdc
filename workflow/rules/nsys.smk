# Nsight Systems profiles: nsys_profile (a)-(e). One job per precision profiles every size and context
# length of it in one nsys process (largest size first, one capture) and writes a record per (size,
# context length, mode); the .nsys-rep and .sqlite stay beside the records (git-ignored), their paths
# in the records. One process for all sizes pays the imports, CUDA's start and nsys's start and stop
# once (bench/grid_time_notes.md).

if NSYS:

    if RUN_CELLS:

        # one rule per precision: a job's records (its outputs) are that precision's sizes
        for _precision, _models in nsys_precisions().items():

            rule:
                name:
                    f"nsys_cells_{_precision}"
                input:
                    stale_flags(nsys_outputs("{device}", _precision)),
                output:
                    nsys_outputs("{device}", _precision),
                log:
                    f"logs/{{device}}/nsys/{_precision}.log",
                conda:
                    "../../envs/lmperf.yaml"
                threads: THREADS_PER_CELL
                resources:
                    gpu=GPUS_PER_CELL,
                    # host memory follows the largest size (nsys export of a large profile included),
                    # time the sizes together
                    mem_mb=max(8000 if size_parameters(m) < 0.5e9 else 32000 for m in _models),
                    runtime=sum(10 if size_parameters(m) < 0.5e9 else 20 for m in _models),
                params:
                    template=lambda wc, p=_precision: NSYS_RECORD.format(
                        device=wc.device, model="{model}", precision=p, ctx="{ctx}", mode="{mode}"
                    ),
                    models=" ".join(_models),
                    precision=_precision,
                    flags=cell_flags(NSYS, skip=("main", "tensor_cores")),
                shell:
                    cell_shell(
                        "nsys",
                        "--output '{params.template}' --device {wildcards.device} --models {params.models}"
                        " --precision {params.precision} {params.flags}",
                    )

    NSYS_FIGURES = ["class_shares", "attention"]
    NSYS_SECTIONS = ["nsys_profile"]
    SECTION_FILES.extend(f"results/{DEVICE}/sections/{name}.md" for name in NSYS_SECTIONS)

    rule nsys_report:
        input:
            records=measured(nsys_records()),
            # the same cells' end-to-end records: the profiler's forward time against the timer's
            e2e=measured(nsys_e2e_records()),
            stale=stamp_flag("nsys_report", "lmperf.kinds.nsys.report", measured(nsys_records() + nsys_e2e_records())),
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
            stamp=aggregate_stamp("nsys_report"),
        log:
            "logs/{device}/report/nsys.log",
        localrule: True
        conda:
            "../../envs/lmperf.yaml"
        shell:
            (
                report_shell(
                    "nsys",
                    "python -m lmperf.kinds.nsys.report --device {wildcards.device} --csv {output.csv}"
                    " --kernels-csv {output.kernels_csv} --sections-dir results/{wildcards.device}/sections"
                    " --figures-dir results/{wildcards.device}/figures --records {input.records}"
                    " --e2e-records {input.e2e} > {log} 2>&1",
                )
                + stamp_shell("nsys_report", "lmperf.kinds.nsys.report", inputs="{input.records} {input.e2e}")
            )
