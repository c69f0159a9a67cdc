"""The flash grid: the correctness check per implementation, the benchmark per precision (every
implementation, head dim and length in one process) and the leaderboard. No torch here."""

from __future__ import annotations

import itertools

from lmperf.core.plan import Job, cell_resources

CORRECTNESS = "results/{device}/flash/correctness_{implementation}.json"
BENCH = "results/{device}/flash/bench_{implementation}_{precision}_d{head_dim}_n{sequence_length}.json"
LEADERBOARD = "results/{device}/flash/leaderboard.json"


def record_path(device: str, kind: str, cell: dict, settings: dict | None = None) -> str:
    pattern = {"benchmark": BENCH, "leaderboard": LEADERBOARD}.get(cell["test"], CORRECTNESS)
    return pattern.format(device=device, **cell)


def jobs(grid: dict, device: str) -> list[Job]:
    gpu, out = device != "cpu", []

    def job(cell: str, records: dict, settings: dict, output: str, runtime: int, trials: int = 1) -> None:
        resources = cell_resources(gpu=gpu, runtime=runtime, small_mb=32000 if gpu else 8000)
        out.append(Job(cell, records, settings | {"workers": grid["workers"]}, output, resources, trials=trials))

    sub = grid.get("correctness") or {"implementations": []}
    for implementation in sub["implementations"]:
        cell = {"test": "correctness", "implementation": implementation}
        path, settings = record_path(device, "flash", cell), {k: v for k, v in sub.items() if k != "implementations"}
        settings |= {"implementation": implementation, "seed": grid["seed"]}
        job("flash_correctness", {path: cell}, settings, path, 20 if implementation == "triton" else 10)
    sub = grid.get("benchmarking") or {"precisions": []}
    for precision in sub["precisions"]:
        settings = {k: v for k, v in sub.items() if k not in ("precisions", "sdpa_backends")}
        settings |= {"precision": precision, "sdpa_backend": sub["sdpa_backends"][precision]}
        shapes = itertools.product(sub["implementations"], sub["head_dims"], sorted(sub["sequence_lengths"]))
        cells = [
            {"test": "benchmark", "implementation": i, "precision": precision, "head_dim": d, "sequence_length": n}
            | {"batch_size": sub["batch_size"], "causal": sub["causal"]}
            for i, d, n in shapes
        ]
        template = BENCH.replace("{device}", device).replace("{precision}", precision)
        records = {record_path(device, "flash", cell): cell for cell in cells}
        job("flash_benchmark", records, settings, template, 20, grid.get("trials", 1))
    if "leaderboard" in grid:
        path = LEADERBOARD.format(device=device)
        job("flash_leaderboard", {path: {"test": "leaderboard"}}, grid["leaderboard"], path, 15, grid.get("trials", 1))
    return out
