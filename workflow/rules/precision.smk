# Precision cells: mixed_precision_accumulation and benchmarking_mixed_precision (a)-(b). One job
# (one process, seconds) writes a record per probe; it runs on CUDA or on the CPU alike.

if PRECISION is not None:

    rule precision_cells:
        output:
            [PRECISION_RECORD.format(device="{device}", probe=probe) for probe in PRECISION_PROBES],
        conda:
            "../../envs/lmperf.yaml"
        log:
            "logs/{device}/precision/probes.log",
        params:
            template=lambda wc: f"results/{wc.device}/precision/{{probe}}.json",
            steps=PRECISION.get("accumulation", {}).get("steps", 1000),
            increment=PRECISION.get("accumulation", {}).get("increment", 0.01),
            toy_in=PRECISION.get("toy_model", {}).get("in_features", 16),
            toy_out=PRECISION.get("toy_model", {}).get("out_features", 4),
            toy_batch=PRECISION.get("toy_model", {}).get("batch_size", 8),
            autocast_dtypes=PRECISION.get("toy_model", {}).get("autocast_dtypes", ["fp16", "bf16"]),
            ln_width=PRECISION.get("layer_norm", {}).get("width", 2560),
            ln_rows=PRECISION.get("layer_norm", {}).get("rows", 16),
            ln_means=PRECISION.get("layer_norm", {}).get("means", [0.0, 10.0, 100.0]),
            ln_std=PRECISION.get("layer_norm", {}).get("std", 1.0),
            ln_dtypes=PRECISION.get("layer_norm", {}).get("dtypes", ["fp16", "bf16", "fp32"]),
            code=code_version("cells/precision.py", "precision.py", *CELL_CODE_COMMON),
        threads: THREADS_PER_CELL
        resources:
            gpu=GPUS_PER_CELL,
            mem_mb=2000,
            runtime=5,
        shell:
            "python -m lmperf.cells.precision --output '{params.template}' --device {wildcards.device}"
            " --accumulation-steps {params.steps} --increment {params.increment}"
            " --toy-in-features {params.toy_in} --toy-out-features {params.toy_out} --toy-batch-size {params.toy_batch}"
            " --autocast-dtypes {params.autocast_dtypes} --ln-width {params.ln_width} --ln-rows {params.ln_rows}"
            " --ln-means {params.ln_means} --ln-std {params.ln_std} --ln-dtypes {params.ln_dtypes} > {log} 2>&1"

    PRECISION_SECTIONS = ["mixed_precision_accumulation", "benchmarking_mixed_precision_ab"]
    SECTION_FILES.extend(f"results/{DEVICE}/sections/{name}.md" for name in PRECISION_SECTIONS)

    rule precision_report:
        localrule: True
        input:
            measured(precision_records()),
        output:
            tables=expand("results/{{device}}/tables/precision_{name}.csv", name=PRECISION_PROBES),
            sections=expand("results/{{device}}/sections/{name}.md", name=PRECISION_SECTIONS),
            figure=report(
                "results/{device}/figures/precision_layer_norm.png",
                caption="../report/precision.rst",
                category="Mixed precision",
                labels={"figure": "layer_norm"},
            ),
        conda:
            "../../envs/lmperf.yaml"
        log:
            "logs/{device}/report/precision.log",
        params:
            code=code_version("report/precision.py", "report/common.py"),
        shell:
            "python -m lmperf.report.precision --device {wildcards.device}"
            " --tables-dir results/{wildcards.device}/tables --sections-dir results/{wildcards.device}/sections"
            " --figures-dir results/{wildcards.device}/figures --records {input} > {log} 2>&1"
