"""The kinds of measurement, one package each: its cells, its grid -> jobs expansion, its report.

``CELLS`` names every cell the runner can start (``python -m lmperf <cell> …``) and the module
whose ``main(argv)`` runs it.
"""

CELLS = {
    "e2e": "lmperf.kinds.e2e.cell",
    "e2e_compile": "lmperf.kinds.e2e.compile_job",
    "nsys": "lmperf.kinds.nsys.cell",
    "memory": "lmperf.kinds.memory.cell",
    "precision": "lmperf.kinds.precision.cell",
    "attention": "lmperf.kinds.attention.cell",
    "flash_correctness": "lmperf.kinds.flash.correctness",
    "flash_benchmark": "lmperf.kinds.flash.benchmark",
    "flash_leaderboard": "lmperf.kinds.flash.leaderboard",
    "ladder": "lmperf.kinds.ladder.cell",
    "ladder_profile": "lmperf.kinds.ladder.profile",
    "gemm_peak": "lmperf.kinds.ladder.gemm_peak",
    "scaleout": "lmperf.kinds.scaleout.cell",
}
