"""The speed-ladder grid: one job per (model, context) runs every rung, the measured GEMM ceiling
(one job), and an Nsight Systems profile of the best rung of some ladders. No torch here."""

from __future__ import annotations

from lmperf.core.plan import Job, cell_resources

RECORD = "results/{device}/ladder/{model}_ctx{context_length}_{rung}.json"
GEMM_PEAK = "results/{device}/gemm_peak/square_gemm.json"
PROFILE = "results/{device}/ladder_profile/{model}_ctx{context_length}.json"
SHARED = ("rungs", "batch_size", "max_batch_size", "accumulation_steps", "vocab_size", "loss_chunk_tokens")
SHARED += ("warmup_steps", "measured_steps", "seed")
PATHS = {"ladder": RECORD, "gemm_peak": GEMM_PEAK, "ladder_profile": PROFILE}


def record_path(device: str, kind: str, cell: dict, settings: dict | None = None) -> str:
    return PATHS[kind].format(device=device, **cell)


def ladders(grid: dict) -> list[tuple[str, int]]:
    """(model, context) pairs: every size at the main lengths, some at the long ones."""
    subs = [grid, *([grid["long_context"]] if "long_context" in grid else [])]
    return sorted({(m, c) for sub in subs for m in sub["models"] for c in sub["context_lengths"]})


def jobs(grid: dict, device: str) -> list[Job]:
    gpu, out, profile = device != "cpu", [], grid.get("profile") or {"models": [], "context_lengths": []}
    gemm = GEMM_PEAK.format(device=device) if grid.get("gemm_peak") else None
    if gemm:
        resources = cell_resources(gpu=gpu, runtime=5, small_mb=4000)
        # the ladders wait for it: it starts before them
        out.append(
            Job("gemm_peak", {gemm: {"probe": "square_gemm"}}, dict(grid["gemm_peak"]), gemm, resources, priority=100)
        )
    sizes = list(dict.fromkeys([*grid["models"], *(grid.get("long_context") or {}).get("models", [])]))
    for model, ctx in ladders(grid):
        cells = [{"model": model, "context_length": ctx, "rung": r} for r in grid["rungs"]]
        records = {RECORD.format(device=device, **cell): cell for cell in cells}
        settings = {"model": model, "context_length": ctx, "gemm_peak": gemm, **{k: grid[k] for k in SHARED}}
        template = RECORD.format(device=device, model=model, context_length=ctx, rung="{rung}")
        resources = cell_resources(model, gpu=gpu, runtime=90 if gpu else 10)
        after, trials = (gemm,) if gemm else (), grid.get("trials", 1)
        # the largest models first: the longest jobs start early
        priority = sizes.index(model)
        out.append(Job("ladder", records, settings, template, resources, after=after, trials=trials, priority=priority))
        if model in profile["models"] and ctx in profile["context_lengths"]:
            path = PROFILE.format(device=device, model=model, context_length=ctx)
            settings = {"records": sorted(records), "profile_steps": profile["steps"]}
            settings["top_kernels"] = profile["top_kernels"]
            cell, resources = {"model": model, "context_length": ctx}, cell_resources(model, gpu=gpu, runtime=10)
            out.append(Job("ladder_profile", {path: cell}, settings, path, resources, after=tuple(sorted(records))))
    return out
