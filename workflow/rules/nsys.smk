# Nsight Systems profiles: nsys_profile (a)-(e). One job per (model, precision) profiles every
# context length in one nsys process and writes a record per (context length, mode); the
# .nsys-rep and .sqlite stay beside the records (git-ignored), their paths in the records.

if NSYS:

    if RUN_CELLS:

        rule nsys_cells:
            input:
                stale_flags(nsys_outputs()),
            output:
                nsys_outputs(),
            log:
                "logs/{device}/nsys/{model}_{precision}.log",
            conda:
                "../../envs/lmperf.yaml"
            threads: THREADS_PER_CELL
            resources:
                gpu=GPUS_PER_CELL,
                # host memory and time grow with the model (nsys export of a large profile included)
                mem_mb=lambda wc: 8000 if parameters(wc) < 0.5e9 else 32000,
                runtime=lambda wc: 10 if parameters(wc) < 0.5e9 else 20,
            params:
                template=lambda wc: NSYS_RECORD.format(
                    device=wc.device, model=wc.model, precision=wc.precision, ctx="{ctx}", mode="{mode}"
                ),
                flags=cell_flags(NSYS, skip=("main", "tensor_cores")),
            shell:
                cell_shell(
                    "nsys",
                    "--output '{params.template}' --device {wildcards.device} --model {wildcards.model}"
                    " --precision {wildcards.precision} {params.flags}",
                )

    NSYS_FIGURES = ["class_shares", "attention"]
    NSYS_SECTIONS = ["nsys_profile"]
    SECTION_FILES.extend(f"results/{DEVICE}/sections/{name}.md" for name in NSYS_SECTIONS)

    rule nsys_report:
        input:
            records=measured(nsys_records()),
            # the same cells' end-to-end records: the profiler's forward time against the timer's
            e2e=measured(nsys_e2e_records()),
            stale=stamp_flag("nsys_report", "lmperf.report.nsys", measured(nsys_records() + nsys_e2e_records())),
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
                    "python -m lmperf.report.nsys --device {wildcards.device} --csv {output.csv}"
                    " --kernels-csv {output.kernels_csv} --sections-dir results/{wildcards.device}/sections"
                    " --figures-dir results/{wildcards.device}/figures --records {input.records}"
                    " --e2e-records {input.e2e} > {log} 2>&1",
                )
                + stamp_shell("nsys_report", "lmperf.report.nsys", inputs="{input.records} {input.e2e}")
            )
