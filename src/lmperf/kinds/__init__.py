"""The kinds of measurement, one package each: ``grid`` (config slice -> jobs), cells, ``report`` and
``compare``. ``KINDS`` in report order (``scaleout`` only when asked for by name), ``RECORD_FOLDERS``
(folder of ``results/<device>/`` -> kind), ``CELLS`` (cell name -> module, for the runner).
"""

import importlib

KINDS = ("e2e", "nsys", "precision", "memory", "attention", "flash", "ladder", "scaleout")
NOT_IN_ALL = ("scaleout",)
# record kinds that another kind's package writes: gemm_peak and ladder_profile are the ladder's
RECORD_FOLDERS = {kind: kind for kind in KINDS}
RECORD_FOLDERS |= {"e2e_compile": "e2e", "gemm_peak": "ladder", "ladder_profile": "ladder"}
CELLS = {kind: f"lmperf.kinds.{kind}.cell" for kind in ("e2e", "nsys", "memory", "precision", "attention", "ladder")}
CELLS |= {"e2e_compile": "lmperf.kinds.e2e.compile_job", "scaleout": "lmperf.kinds.scaleout.cell"}
CELLS |= {f"flash_{name}": f"lmperf.kinds.flash.{name}" for name in ("correctness", "benchmark", "leaderboard")}
CELLS |= {"ladder_profile": "lmperf.kinds.ladder.profile", "gemm_peak": "lmperf.kinds.ladder.gemm_peak"}


def grid_module(kind: str):
    """The kind's ``grid`` module (``jobs(grid, device)``, ``record_path(device, folder, cell, settings)``)."""
    return importlib.import_module(f"lmperf.kinds.{kind}.grid")
