# Aggregates: each kind's tables, figures and answer sections (lmperf.kinds.<kind>.report), then
# the device's report (lmperf.report.answers). They rerun as plain Snakemake jobs: when a record they
# read is (re)measured, or when their own code changes (its source files are inputs); a fresh clone
# may rebuild them once, byte for byte the same.
import importlib

import lmperf.core.fingerprint


def code_files(module):
    """The source files of ``module``'s import closure inside lmperf: an edit reruns the aggregate."""
    fp = lmperf.core.fingerprint
    return [str(fp.module_file(name)) for name in fp.closure(module)]


def report_records(kinds):
    """The records an aggregate reads: its kinds' records of the grid (measured first when missing),
    or in report-only mode those present; records of kinds outside `all` wherever they exist."""
    paths = set()
    for kind in kinds:
        folders = [f for f, k in RECORD_FOLDERS.items() if k == kind]
        present = [str(p) for f in folders for p in sorted(Path("results", DEVICE, f).glob("*.json"))]
        if REPORT_ONLY or kind in NOT_IN_ALL:
            paths.update(present)
        else:
            paths.update(records_of([kind]))
    return sorted(paths)


REPORTS = {kind: importlib.import_module(f"lmperf.kinds.{kind}.report") for kind in KINDS if kind in GRID}
SECTION_FILES = sorted(
    f"results/{DEVICE}/sections/{section}.md" for module in REPORTS.values() for section in module.SECTIONS
)

for _kind, _module in REPORTS.items():

    rule:
        name:
            f"{_kind}_report"
        input:
            records=report_records([_kind, *_module.ALSO_READS]),
            code=code_files(_module.__name__),
        output:
            [
                (
                    report(
                        f"results/{DEVICE}/{path}",
                        caption=f"../report/{_kind}.rst",
                        category=_kind,
                        subcategory="figures",
                    )
                    if path.endswith(".png")
                    else f"results/{DEVICE}/{path}"
                )
                for path in _module.outputs(GRID.get(_kind, {}))
            ],
            [
                report(
                    f"results/{DEVICE}/sections/{section}.md",
                    caption="../report/section.rst",
                    category=_kind,
                    subcategory="answer sections",
                )
                for section in _module.SECTIONS
            ],
        log:
            f"logs/{DEVICE}/report/{_kind}.log",
        localrule: True
        conda:
            "../../envs/lmperf.yaml"
        params:
            module=_module.__name__,
            device=DEVICE,
            grid=lambda wildcards, kind=_kind: json.dumps(GRID.get(kind, {}), sort_keys=True),
        shell:
            "python -m {params.module} --device {params.device} --out results/{params.device} --grid {params.grid:q}"
            " --records {input.records:q} > {log:q} 2>&1"


# The device's report; the front page (report/answers.md) only from the front page's device, whose
# Across devices reads every other device's records as they are. The device's latest verify run is read
# when there is one (`snakemake verify` writes it; `all` never runs verify).
OTHER_DEVICES = (
    sorted(
        p.name
        for p in Path("results").glob("*")
        if p.is_dir() and p.name not in (DEVICE, "cpu") and lmperf.core.config.is_slug(p.name)
    )
    if DEVICE == FRONT_DEVICE
    else []
)
MISSING = [p for p in records_of(ALL_KINDS) if p not in RECORDS] if REPORT_ONLY else []


VERIFY_RUNS = sorted(str(p) for p in Path("results", DEVICE, "verify").glob("*.json"))[-1:]


rule answers:
    input:
        sections=SECTION_FILES,
        verify=VERIFY_RUNS,
        code=code_files("lmperf.report.answers"),
        others=sorted(
            str(p) for d in OTHER_DEVICES for f in RECORD_FOLDERS for p in Path("results", d, f).glob("*.json")
        ),
    output:
        report=report(f"report/{DEVICE}/answers.md", caption="../report/answers.rst", category="answers"),
        front=(
            [report("report/answers.md", caption="../report/front.rst", category="answers")]
            if DEVICE == FRONT_DEVICE
            else []
        ),
    log:
        f"logs/{DEVICE}/report/answers.log",
    localrule: True
    conda:
        "../../envs/lmperf.yaml"
    params:
        device=DEVICE,
        front=["--front", "report/answers.md"] if DEVICE == FRONT_DEVICE else [],
        verify=["--verify", *VERIFY_RUNS] if VERIFY_RUNS else [],
        missing=lambda wildcards: json.dumps(MISSING),
        stale=lambda wildcards: json.dumps(sorted(STALE) if REPORT_ONLY else []),
    shell:
        "python -m lmperf.report.answers --device {params.device} --results results/{params.device}"
        " --output {output.report:q} {params.front:q} {params.verify:q} --sections {input.sections:q}"
        " --missing-json {params.missing:q} --stale-json {params.stale:q} > {log:q} 2>&1"
