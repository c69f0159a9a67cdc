# The written report: report/answers.md assembled from every kind's section fragments.


rule answers:
    localrule: True
    input:
        SECTION_FILES,
    output:
        report(REPORT_PATH, caption="../report/answers.rst", category="Answers"),
    conda:
        "../../envs/lmperf.yaml"
    log:
        f"logs/{DEVICE}/report/answers.log",
    params:
        device=DEVICE,
        code=code_version("report/answers.py", "report/common.py"),
        missing=missing_records(),
    shell:
        "python -m lmperf.report.answers --device {params.device} --results results/{params.device}"
        " --output {output} --sections {input} --missing {params.missing:q} > {log} 2>&1"
