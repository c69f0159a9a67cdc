# Attention cells: pytorch_attention and torch_compile (a). One job per implementation writes a
# record per (head dim, sequence length): one process, one torch.compile, one CUDA start-up.

if ATTENTION:

    if RUN_CELLS:

        rule attention_cells:
            input:
                stale_flags(attention_outputs()),
            output:
                attention_outputs(),
            log:
                "logs/{device}/attention/{impl}_{precision}.log",
            wildcard_constraints:
                impl="|".join(ATTENTION["implementations"]),
            conda:
                "../../envs/lmperf.yaml"
            threads: THREADS_PER_CELL
            resources:
                gpu=GPUS_PER_CELL,
                mem_mb=16000,
                # minutes: every cell of the implementation, plus torch.compile for compiled ones
                runtime=lambda wc: 20 if "compiled" in wc.impl else 15,
            params:
                template=lambda wc: ATTENTION_RECORD.format(
                    device=wc.device, impl=wc.impl, precision=wc.precision, d="{head_dim}", n="{seq_len}"
                ),
                flags=cell_flags(ATTENTION, skip=("implementations", "precision")),
                # `flash` runs our kernels: its version covers them, the other implementations' not
                code_version=cell_version_param,
            shell:
                cell_shell(
                    "attention",
                    "--output '{params.template}' --device {wildcards.device} --implementation {wildcards.impl}"
                    " --precision {wildcards.precision} {params.flags}",
                    per_record=True,
                )

    ATTENTION_FIGURES = ["time", "memory", "compile"]
    ATTENTION_SECTIONS = ["pytorch_attention", "torch_compile_a"]
    SECTION_FILES.extend(f"results/{DEVICE}/sections/{name}.md" for name in ATTENTION_SECTIONS)

    rule attention_report:
        input:
            records=measured(attention_records()),
            stale=stamp_flag("attention_report", "lmperf.kinds.attention.report", measured(attention_records())),
        output:
            csv="results/{device}/tables/attention.csv",
            sections=expand("results/{{device}}/sections/{name}.md", name=ATTENTION_SECTIONS),
            figures=[
                report(
                    f"results/{{device}}/figures/attention_{name}.png",
                    caption="../report/attention.rst",
                    category="Attention",
                    labels={"figure": name},
                )
                for name in ATTENTION_FIGURES
            ],
            stamp=aggregate_stamp("attention_report"),
        log:
            "logs/{device}/report/attention.log",
        localrule: True
        conda:
            "../../envs/lmperf.yaml"
        shell:
            (
                report_shell(
                    "attention",
                    "python -m lmperf.kinds.attention.report --device {wildcards.device} --csv {output.csv}"
                    " --sections-dir results/{wildcards.device}/sections --figures-dir results/{wildcards.device}/figures"
                    " --records {input.records} > {log} 2>&1",
                )
                + stamp_shell("attention_report", "lmperf.kinds.attention.report")
            )
