# The written report: report/<device>/answers.md assembled from every kind's section fragments, and
# the front page report/answers.md (the same answers, then Across devices; GPU runs only).
ANSWERS_MISSING = missing_records()
ANSWERS_STALE = stale_records()
# The front page's Across devices reads every other GPU device's records (results/cpu/ is no device
# to compare with).
OTHER_DEVICES = (
    sorted(p.name for p in Path("results").iterdir() if p.is_dir() and p.name not in (DEVICE, "cpu"))
    if FRONT_PATH and Path("results").is_dir()
    else []
)
# It says which compared cells ran different code on two devices, so it needs the other devices'
# records measured with older code, judged by the current code as this device's are (their code
# version labels alone can differ for the same code).
OTHER_STALE = sorted(path for device in OTHER_DEVICES for path in stale_of(read_records(device, check=False)))
ANSWERS_EXTRA = " ".join(["missing:", *ANSWERS_MISSING, "stale:", *ANSWERS_STALE, "other-stale:", *OTHER_STALE])
# When the other devices' records change, the front page is rebuilt too, so the device built last
# shows the others' latest. What tells is the other devices' aggregate stamps (each holds the digests
# of the records it read; not their answers stamps, which would hold this device's in turn, so that
# two front pages would rebuild each other forever), counted by content in this rule's stamp, not by
# time: in a fresh clone the checkout's order of the files says nothing. They are no inputs of the
# rule, only of its stamp: as inputs, this run would take the other devices' report rules into its
# jobs (they are {device} patterns) and rebuild their aggregates with this device's settings.
OTHER_DEVICE_STAMPS = sorted(
    path
    for device in OTHER_DEVICES
    for path in glob.glob(f"results/{device}/stamps/*.stamp")
    if Path(path).name != "answers.stamp"
)


rule answers:
    input:
        records=inputs(SECTION_FILES),
        # the runs' starts (the header's grid time) count when present, as the stamp below does
        stale=stamp_flag(
            "answers", "lmperf.report.answers", SECTION_FILES + OTHER_DEVICE_STAMPS + [RUNS_LOG], ANSWERS_EXTRA
        ),
    output:
        report=report(REPORT_PATH, caption="../report/answers.rst", category="Answers"),
        front=[FRONT_PATH] if FRONT_PATH else [],
        stamp=aggregate_stamp("answers", device=DEVICE),
    log:
        f"logs/{DEVICE}/report/answers.log",
    localrule: True
    conda:
        "../../envs/lmperf.yaml"
    params:
        device=DEVICE,
        # report-only mode: cells of the grid with no record, and records measured with older code
        missing=ANSWERS_MISSING,
        stale=ANSWERS_STALE,
        other_stale=OTHER_STALE,
        front=f"--front {FRONT_PATH}" if FRONT_PATH else "",
    shell:
        "python -m lmperf.report.answers --device {params.device} --results results/{params.device}"
        " --output {output.report} {params.front} --sections {input.records} --missing {params.missing:q}"
        " --stale {params.stale:q} --other-stale {params.other_stale:q} > {log} 2>&1"
        + stamp_shell(
            "answers",
            "lmperf.report.answers",
            inputs=" ".join(["{input.records}", *OTHER_DEVICE_STAMPS, f"$(test -e {RUNS_LOG} && echo {RUNS_LOG})"]),
            extra=ANSWERS_EXTRA,
        )
