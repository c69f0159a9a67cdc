"""The kinds of measurement, one package each: ``grid`` (config slice -> jobs, no torch), its
cells (measuring), ``report`` (tables, figures, answer sections; no torch) and ``compare``
(across devices).

``KINDS`` lists them in report order (``scaleout`` needs several GPUs and runs only when asked
for by name). ``RECORD_FOLDERS`` maps each folder of ``results/<device>/`` to the kind that owns it.
``CELLS`` names every cell the runner can start (``python -m lmperf <cell> …``) and its module.
"""

import importlib

KINDS = ("e2e", "nsys", "precision", "memory", "attention", "flash", "ladder", "scaleout")
NOT_IN_ALL = ("scaleout",)
RECORD_FOLDERS = {
    "e2e": "e2e",
    "e2e_compile": "e2e",
    "nsys": "nsys",
    "precision": "precision",
    "memory": "memory",
    "attention": "attention",
    "flash": "flash",
    "ladder": "ladder",
    "gemm_peak": "ladder",
    "ladder_profile": "ladder",
    "scaleout": "scaleout",
}
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


def grid_module(kind: str):
    """The kind's ``grid`` module (``jobs(grid, device)``, ``record_path(device, folder, cell, settings)``)."""
    return importlib.import_module(f"lmperf.kinds.{kind}.grid")
