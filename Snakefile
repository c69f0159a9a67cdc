# lmperf: `snakemake --cores 1 all` measures every missing or stale cell of this device's grid,
# then writes its tables, figures and report/<device>/answers.md. See README.md.
from snakemake.utils import min_version

min_version("9.19")


configfile: "config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/cells.smk"
include: "workflow/rules/verify.smk"
include: "workflow/rules/report.smk"


# Every record of the grid (unless report-only), every aggregate and the report.
rule all:
    default_target: True
    input:
        [] if REPORT_ONLY else records_of(ALL_KINDS),
        rules.answers.output,


# The scale-out check, outside `all`: `snakemake --cores 4 scaleout --resources gpu=2`.
rule scaleout:
    input:
        records_of(["scaleout"]),
