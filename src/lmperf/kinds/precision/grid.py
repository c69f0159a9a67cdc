"""The precision grid: one job runs the three probes (accumulation, the toy model's dtypes,
layer norm in low precision). No torch here."""

from __future__ import annotations

from lmperf.core.plan import Job, cell_resources

RECORD = "results/{device}/precision/{probe}.json"
PROBES = ("accumulation", "toy_model", "layer_norm")


def record_path(device: str, kind: str, cell: dict, settings: dict | None = None) -> str:
    return RECORD.format(device=device, **cell)


def jobs(grid: dict, device: str) -> list[Job]:
    records = {RECORD.format(device=device, probe=p): {"probe": p} for p in PROBES}
    settings = {"probes": list(PROBES), **grid}
    resources = cell_resources(gpu=device != "cpu", runtime=5, small_mb=2000)
    return [Job("precision", records, settings, RECORD.replace("{device}", device), resources)]
