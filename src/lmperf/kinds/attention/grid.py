"""The attention grid: one job per implementation times every head dimension and length
(batch 8, no head dimension; ``compiled`` = torch.compile of ``plain``). No torch here."""

from __future__ import annotations

from lmperf.core.plan import Job, cell_resources

RECORD = "results/{device}/attention/{implementation}_{precision}_d{head_dim}_n{sequence_length}.json"


def record_path(device: str, kind: str, cell: dict, settings: dict | None = None) -> str:
    return RECORD.format(device=device, **cell)


def jobs(grid: dict, device: str) -> list[Job]:
    out = []
    shared = {k: v for k, v in grid.items() if k not in ("implementations", "trials")}
    for implementation in grid["implementations"]:
        cells = [
            dict(implementation=implementation, head_dim=d, sequence_length=n, batch_size=grid["batch_size"])
            | {"precision": grid["precision"]}
            for d in grid["head_dims"]
            for n in sorted(grid["sequence_lengths"])
        ]
        records = {record_path(device, "attention", cell): cell for cell in cells}
        keys = dict(implementation=implementation, precision=grid["precision"])
        template = RECORD.format(device=device, head_dim="{head_dim}", sequence_length="{seq_len}", **keys)
        runtime = 20 if "compiled" in implementation else 15
        resources = cell_resources(gpu=device != "cpu", runtime=runtime, small_mb=16000)
        settings = {"implementation": implementation, **shared}
        out.append(Job("attention", records, settings, template, resources, trials=grid.get("trials", 1)))
    return out
