"""The scale-out check (not part of `all`): the e2e cells of its grid once on 1 GPU and once on K,
in fresh copies of the workflow, compared in one record. No torch here."""

from __future__ import annotations

from lmperf.core.plan import Job

RECORD = "results/{device}/scaleout/e2e.json"


def record_path(device: str, kind: str, cell: dict, settings: dict | None = None) -> str:
    return RECORD.format(device=device)


def jobs(grid: dict, device: str) -> list[Job]:
    path = RECORD.format(device=device)
    settings = {"gpus": grid["gpus"], **grid["e2e"]}
    cell = {"grid": "e2e", "gpus": grid["gpus"], **grid["e2e"]}
    resources = {"threads": 1, "gpu": max(grid["gpus"]) if device != "cpu" else 0, "mem_mb": 16000, "runtime": 60}
    return [Job("scaleout", {path: cell}, settings, path, resources)]
