# `snakemake --cores 1 verify`, not part of `all`: re-measures a seeded random sample of this
# device's timed records in a scratch folder and writes results/<device>/verify/<UTC date>.json
# (lmperf.core.verify); the next `all` answers "reproduce" from it. A rule without output files runs
# whenever it is asked for.
import lmperf.core.verify

if not REPORT_ONLY:

    rule verify:
        log:
            f"logs/{DEVICE}/verify.log",
        localrule: True
        run:
            lmperf.core.verify.run(JOB_OF, RECORDS, DEVICE, config["verify"], log[0])
