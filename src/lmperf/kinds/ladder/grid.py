"""The speed-ladder grid: one job per (model, context) runs every rung, the measured GEMM ceiling
(one job), and an Nsight Systems profile of the best rung of some ladders. No torch here."""

from __future__ import annotations

from lmperf.core.plan import Job, cell_resources

RECORD = "results/{device}/ladder/{model}_ctx{context_length}_{rung}.json"
GEMM_PEAK = "results/{device}/gemm_peak/square_gemm.json"
PROFILE = "results/{device}/ladder_profile/{model}_ctx{context_length}.json"
SHARED = (
    "rungs",
    "batch_size",
    "max_batch_size",
    "accumulation_steps",
    "vocab_size",
    "warmup_steps",
    "measured_steps",
    "seed",
)


def record_path(device: str, kind: str, cell: dict, settings: dict | None = None) -> str:
    if kind == "gemm_peak":
        return GEMM_PEAK.format(device=device)
    if kind == "ladder_profile":
        return PROFILE.format(device=device, **cell)
    return RECORD.format(device=device, **cell)


def ladders(grid: dict) -> list[tuple[str, int]]:
    """(model, context) pairs: every size at the main lengths, some at the long ones."""
    subs = [grid, *([grid["long_context"]] if "long_context" in grid else [])]
    return sorted({(m, c) for sub in subs for m in sub["models"] for c in sub["context_lengths"]})


def jobs(grid: dict, device: str) -> list[Job]:
    gpu = device != "cpu"
    out = []
    gemm_grid = grid.get("gemm_peak")
    gemm = GEMM_PEAK.format(device=device) if gemm_grid else None
    if gemm_grid:
        cell = {"probe": "square_gemm"}
        out.append(
            Job("gemm_peak", {gemm: cell}, dict(gemm_grid), gemm, cell_resources(gpu=gpu, runtime=5, small_mb=4000))
        )
    for model, ctx in ladders(grid):
        records = {
            RECORD.format(device=device, model=model, context_length=ctx, rung=r): {
                "model": model,
                "context_length": ctx,
                "rung": r,
            }
            for r in grid["rungs"]
        }
        settings = {"model": model, "context_length": ctx, "gemm_peak": gemm, **{k: grid[k] for k in SHARED}}
        template = RECORD.format(device=device, model=model, context_length=ctx, rung="{rung}")
        resources = cell_resources(model, gpu=gpu, runtime=20)
        out.append(Job("ladder", records, settings, template, resources, after=(gemm,) if gemm else ()))
    profile = grid.get("profile")
    for model, ctx in ladders(grid) if profile else []:
        if model not in profile["models"] or ctx not in profile["context_lengths"]:
            continue
        ladder = sorted(RECORD.format(device=device, model=model, context_length=ctx, rung=r) for r in grid["rungs"])
        path = PROFILE.format(device=device, model=model, context_length=ctx)
        settings = {"records": ladder, "profile_steps": profile["steps"], "top_kernels": profile["top_kernels"]}
        cell = {"model": model, "context_length": ctx}
        out.append(
            Job(
                "ladder_profile",
                {path: cell},
                settings,
                path,
                cell_resources(model, gpu=gpu, runtime=10),
                after=tuple(ladder),
            )
        )
    return out
