# lmperf: `snakemake --cores 1 all` measures every missing or stale cell of this device's grid,
# then writes the tables, figures and report/<device>/answers.md. See README.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


include: "workflow/rules/common.smk"


# Wildcards match only values the grids can hold (from lmperf.core.sizes and config.yaml: no torch).
wildcard_constraints:
    device="[a-z0-9][a-z0-9-]*",
    model="|".join(name.replace(".", r"\.") for name in lmperf.core.sizes.SIZES),
    ctx=r"\d+",
    precision="fp32|tf32|bf16",  # tf32: flash_benchmarking (float32 inputs, TF32 products)
    compile="eager|compiled",
    warmup=r"\d+",
    # e2e cells: empty for plain attention, _<name> for another implementation of attention_compare
    attention="(?:{})".format("|".join(["", *(f"_{name}" for name in E2E_ATTENTIONS if name != "plain")])),


# one rules file per kind of measurement
include: "workflow/rules/e2e.smk"
include: "workflow/rules/memory.smk"
include: "workflow/rules/precision.smk"
include: "workflow/rules/nsys.smk"
include: "workflow/rules/attention.smk"
include: "workflow/rules/flash.smk"
include: "workflow/rules/scaleout.smk"
include: "workflow/rules/ladder.smk"
include: "workflow/rules/report.smk"


# Every record of the grid (unless report-only), every aggregate (through its stamp: a job with
# any output missing reruns), the report, and the flags of what is stale: a missing or stale file
# reruns exactly the job that makes it, then the aggregates that read it.
rule all:
    default_target: True
    input:
        [] if REPORT_ONLY else grid_records(),
        STAMP_FILES,
        REPORT_PATH,
        all_flags,
