"""The memory grid: one job per (model, context, precision) records an inference forward and a
training step. No torch here."""

from __future__ import annotations

import itertools

from lmperf.core.plan import Job, cell_resources

RECORD = "results/{device}/memory/{model}_ctx{context_length}_{precision}_{mode}.json"
MODES = ("inference", "training")
SHARED = ("batch_size", "vocab_size", "warmup_steps", "max_entries", "timeline_points", "top_allocations", "seed")


def record_path(device: str, kind: str, cell: dict, settings: dict | None = None) -> str:
    return RECORD.format(device=device, **{k: cell[k] for k in ("model", "context_length", "precision", "mode")})


def jobs(grid: dict, device: str) -> list[Job]:
    out = []
    for model, ctx, precision in itertools.product(grid["models"], grid["context_lengths"], grid["precisions"]):
        keys = {"model": model, "context_length": ctx, "precision": precision}
        records = {
            RECORD.format(device=device, mode=mode, **keys): {**keys, "mode": mode, "batch_size": grid["batch_size"]}
            for mode in MODES
        }
        settings = {**keys, "modes": list(MODES), **{k: grid[k] for k in SHARED}}
        settings["reference_context_length"] = grid["reference_context_length"]
        template = RECORD.format(device=device, mode="{mode}", **keys)
        resources = cell_resources(model, gpu=device != "cpu", runtime=10, small_mb=4000, large_mb=16000)
        out.append(Job("memory", records, settings, template, resources))
    return out
