# The written report: report/<device>/answers.md assembled from every kind's section fragments, and
# the front page report/answers.md (the same answers, then Across devices; GPU runs only).


rule answers:
    localrule: True
    input:
        SECTION_FILES,
    output:
        report=report(REPORT_PATH, caption="../report/answers.rst", category="Answers"),
        front=[FRONT_PATH] if FRONT_PATH else [],
    conda:
        "../../envs/lmperf.yaml"
    log:
        f"logs/{DEVICE}/report/answers.log",
    params:
        device=DEVICE,
        code=code_version("report/answers.py", "report/common.py", "report/devices.py"),
        missing=missing_records(),
        front=f"--front {FRONT_PATH}" if FRONT_PATH else "",
    shell:
        "python -m lmperf.report.answers --device {params.device} --results results/{params.device}"
        " --output {output.report} {params.front} --sections {input} --missing {params.missing:q} > {log} 2>&1"
