"""The e2e grid: one job per whole-model cell, and the compile job that compiles the compiled
cells' graphs beforehand (no torch here)."""

from __future__ import annotations

import itertools

from lmperf.core.plan import Job, cell_resources, parameters

RECORD = "results/{device}/e2e/{model}_ctx{context_length}_{precision}_{compile}_w{warmup_steps}{suffix}.json"
COMPILE_RECORD = "results/{device}/e2e_compile/{model}_ctx{context_length}_{precision}.json"
# torch.compile's on-disk caches of one compiled cell (git-ignored)
COMPILE_CACHE = ".cache/torch_compile/{device}/{model}_ctx{context_length}_{precision}"
# a measured compiled cell loads its graphs from the cache: Inductor's pool of compile workers only
# costs it (docs/decisions/compile-job.md)
MEASURED_COMPILE_THREADS = 1
SHARED = ("batch_size", "vocab_size", "measured_steps", "seed")


def record_path(device: str, kind: str, cell: dict, settings: dict | None = None) -> str:
    if kind == "e2e_compile":
        return COMPILE_RECORD.format(device=device, **cell)
    attention = (settings or {}).get("attention", "plain")
    return RECORD.format(device=device, suffix="" if attention == "plain" else f"_{attention}", **cell)


def _cells(grid: dict) -> list[tuple]:
    """(model, context, precision, compile, warm-up, attention) of every cell, once each."""
    w, out = grid["warmup_steps"], set()

    def add(sub, compiles=("eager",), warmups=(w,), attentions=("plain",)):
        out.update(
            itertools.product(sub["models"], sub["context_lengths"], sub["precisions"], compiles, warmups, attentions)
        )

    add(grid["main"])
    if "attention_compare" in grid:
        add(grid["attention_compare"], attentions=grid["attention_compare"]["attentions"])
    if "compile" in grid:
        add(grid["compile"], compiles=("eager", "compiled"))
    if "warmup_sweep" in grid:
        add(grid["warmup_sweep"], warmups=sorted(set(grid["warmup_sweep"]["warmup_steps"]) | {w}))
    return sorted(out)


def compile_cells(grid: dict) -> list[tuple]:
    sub = grid.get("compile")
    return sorted(itertools.product(sub["models"], sub["context_lengths"], sub["precisions"])) if sub else []


def jobs(grid: dict, device: str) -> list[Job]:
    gpu, out = device != "cpu", []
    if compiled := [dict(zip(("model", "context_length", "precision"), c)) for c in compile_cells(grid)]:
        records = {COMPILE_RECORD.format(device=device, **cell): cell for cell in compiled}
        settings = {
            "cells": [list(cell.values()) for cell in compiled],
            "cache": COMPILE_CACHE.replace("{device}", device),
        }
        settings |= {k: grid[k] for k in ("batch_size", "vocab_size", "seed")}
        resources = {**cell_resources(gpu=gpu, runtime=60), "mem_mb": 64000 if gpu else 8000}
        out.append(
            Job("e2e_compile", records, settings, COMPILE_RECORD.replace("{device}", device), resources, priority=10)
        )
    for model, ctx, precision, compile_, warmup, attention in _cells(grid):
        cell = dict(model=model, context_length=ctx, precision=precision, compile=compile_, warmup_steps=warmup)
        settings = {**cell, "attention": attention, **{k: grid[k] for k in SHARED}}
        after = ()
        if compile_ == "compiled":
            keys = {"device": device, "model": model, "context_length": ctx, "precision": precision}
            settings.update(compile_cache=COMPILE_CACHE.format(**keys), compile_threads=MEASURED_COMPILE_THREADS)
            after = (COMPILE_RECORD.format(**keys),)
        path = record_path(device, "e2e", cell, settings)
        runtime = 20 if compile_ == "compiled" or parameters(model) > 1.5e9 else 10
        resources = cell_resources(model, gpu=gpu, runtime=runtime)
        out.append(Job("e2e", {path: cell}, settings, path, resources, after, trials=grid.get("trials", 1)))
    return out
