"""The flash grid: the correctness check per implementation, the benchmark per precision (every
implementation, head dim and length) and the leaderboard. No torch here."""

from __future__ import annotations

from lmperf.core.plan import Job, cell_resources

CORRECTNESS = "results/{device}/flash/correctness_{implementation}.json"
BENCH = "results/{device}/flash/bench_{implementation}_{precision}_d{head_dim}_n{sequence_length}.json"
LEADERBOARD = "results/{device}/flash/leaderboard.json"


def record_path(device: str, kind: str, cell: dict, settings: dict | None = None) -> str:
    test = cell.get("test")
    if test == "benchmark":
        return BENCH.format(
            device=device, **{k: cell[k] for k in ("implementation", "precision", "head_dim", "sequence_length")}
        )
    if test == "leaderboard":
        return LEADERBOARD.format(device=device)
    return CORRECTNESS.format(device=device, implementation=cell.get("implementation"))


def jobs(grid: dict, device: str) -> list[Job]:
    gpu = device != "cpu"
    memory = 32000 if gpu else 8000
    common = {"seed": grid["seed"], "workers": grid["workers"]}
    out = []
    if "correctness" in grid:
        sub = grid["correctness"]
        for implementation in sub["implementations"]:
            path = CORRECTNESS.format(device=device, implementation=implementation)
            settings = {
                "implementation": implementation,
                **{k: v for k, v in sub.items() if k != "implementations"},
                **common,
            }
            cell = {"test": "correctness", "implementation": implementation}
            runtime = 20 if implementation == "triton" else 10
            out.append(
                Job(
                    "flash_correctness",
                    {path: cell},
                    settings,
                    path,
                    cell_resources(gpu=gpu, runtime=runtime, small_mb=memory),
                )
            )
    if "benchmarking" in grid:
        sub = grid["benchmarking"]
        for precision in sub["precisions"]:
            records = {}
            for implementation in sub["implementations"]:
                for d in sub["head_dims"]:
                    for n in sorted(sub["sequence_lengths"]):
                        cell = {
                            "test": "benchmark",
                            "implementation": implementation,
                            "precision": precision,
                            "head_dim": d,
                            "sequence_length": n,
                            "batch_size": sub["batch_size"],
                            "causal": sub["causal"],
                        }
                        records[record_path(device, "flash", cell)] = cell
            settings = {
                "precision": precision,
                "sdpa_backend": sub["sdpa_backends"][precision],
                **{k: v for k, v in sub.items() if k not in ("precisions", "sdpa_backends")},
                "workers": grid["workers"],
            }
            template = BENCH.format(
                device=device,
                implementation="{impl}",
                precision=precision,
                head_dim="{head_dim}",
                sequence_length="{seq_len}",
            )
            out.append(
                Job(
                    "flash_benchmark", records, settings, template, cell_resources(gpu=gpu, runtime=20, small_mb=memory)
                )
            )
    if "leaderboard" in grid:
        path = LEADERBOARD.format(device=device)
        settings = {**grid["leaderboard"], "workers": grid["workers"]}
        cell = {"test": "leaderboard"}
        out.append(
            Job("flash_leaderboard", {path: cell}, settings, path, cell_resources(gpu=gpu, runtime=15, small_mb=memory))
        )
    return out
