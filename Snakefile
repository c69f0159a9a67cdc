# lmperf: `snakemake --cores 1 all` measures every cell of this device's grid, then writes the
# tables, figures and report/answers.md. See README.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/e2e.smk"
include: "workflow/rules/memory.smk"
include: "workflow/rules/precision.smk"
include: "workflow/rules/nsys.smk"
include: "workflow/rules/attention.smk"
# (later kinds: nsys, precision, memory, attention, flash — one rules file each)
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        REPORT_PATH,
