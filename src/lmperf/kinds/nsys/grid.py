"""The nsys grid: one job per precision profiles every size of it, largest first, at every
context length (the size nearest the memory limit runs in a fresh process). No torch here."""

from __future__ import annotations

from lmperf.core.plan import Job, cell_resources, parameters

RECORD = "results/{device}/nsys/{model}_ctx{context_length}_{precision}_{mode}.json"
MODES = ("inference", "training")
SHARED = ("batch_size", "vocab_size", "warmup_steps", "measured_steps", "context_lengths", "top_kernels", "profiler")
SHARED += ("nsys_path", "seed")


def record_path(device: str, kind: str, cell: dict, settings: dict | None = None) -> str:
    return RECORD.format(device=device, **cell)


def precisions(grid: dict) -> dict[str, list[str]]:
    """{precision: its sizes, largest first} over the nsys grids (main and tensor_cores)."""
    models: dict[str, set] = {}
    for sub in [grid["main"], *([grid["tensor_cores"]] if "tensor_cores" in grid else [])]:
        for precision in sub["precisions"]:
            models.setdefault(precision, set()).update(sub["models"])
    return {p: sorted(ms, key=lambda m: (-parameters(m), m)) for p, ms in sorted(models.items())}


def jobs(grid: dict, device: str) -> list[Job]:
    out = []
    for precision, models in precisions(grid).items():
        cells = [
            {"model": m, "context_length": c, "precision": precision, "mode": mode}
            for m in models
            for c in sorted(grid["context_lengths"])
            for mode in MODES
        ]
        records = {record_path(device, "nsys", cell): cell for cell in cells}
        settings = {"models": models, "precision": precision, "attention": "plain", **{k: grid[k] for k in SHARED}}
        runtime = sum(10 if parameters(m) < 0.5e9 else 20 for m in models)
        resources = cell_resources(max(models, key=parameters), gpu=device != "cpu", runtime=runtime)
        template = RECORD.format(
            device=device, model="{model}", context_length="{ctx}", precision=precision, mode="{mode}"
        )
        out.append(Job("nsys", records, settings, template, resources))
    return out
