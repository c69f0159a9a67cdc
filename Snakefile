# lmperf: `snakemake --cores 1 all` measures every cell of this device's grid, then writes the
# tables, figures and report/answers.md. See README.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


include: "workflow/rules/common.smk"


# Wildcards match only values the grids can hold.
wildcard_constraints:
    device="[a-z0-9][a-z0-9-]*",
    model="|".join(map(lambda name: name.replace(".", r"\."), lmperf.model.SIZES)),
    ctx=r"\d+",
    precision="fp32|tf32|bf16",  # tf32: flash_benchmarking (float32 inputs, TF32 products)
    compile="eager|compiled",
    warmup=r"\d+",
    # e2e cells with another attention than plain (plain's records carry no suffix)
    attention="|".join(name for name in lmperf.attention.IMPLEMENTATIONS if name != "plain"),


include: "workflow/rules/e2e.smk"
include: "workflow/rules/memory.smk"
include: "workflow/rules/precision.smk"
include: "workflow/rules/nsys.smk"
include: "workflow/rules/attention.smk"
include: "workflow/rules/flash.smk"
include: "workflow/rules/scaleout.smk"
include: "workflow/rules/ladder.smk"
# one rules file per kind of measurement
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        REPORT_PATH,
