"""What a process pays to start under ``nsys profile`` before its capture begins.

The nsys cells of the H200's `cc976f5` grid reach their capture 8.3-10.2 s after the profiled
worker starts for the small model (18.9 s for 2.7B), while an e2e cell of the same model is at its
first step 0.6 s after its start (bench/grid_time_notes.md). This runs one child, several times each
way: plain ``python``, then under ``nsys profile`` with the cells' own options
(``lmperf.profiling.nsys.PROFILE_OPTIONS``, capture range = the child's cudaProfilerStart/Stop).
The child prints its age (seconds since its process started, ``lmperf.device.process_age_s``) at
each stage: torch imported, CUDA's first kernel done, the model built on the GPU, ``torch._dynamo``
imported (making a torch.optim optimizer imports it), the first training step's forward,
backward and AdamW step done, and the capture (one more step) stopped. The summary gives each
stage's median per mode and what nsys adds; the parent times each run from launch to exit (nsys
writing its report included).

    python bench/nsys_start_probe.py [REPEATS] [MODEL]     # needs CUDA and nsys on PATH
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = (
    "torch_imported",
    "cuda_ready",
    "model_built",
    "dynamo_imported",
    "forward_done",
    "backward_done",
    "step_done",
    "capture_stopped",
)

CHILD = r"""
import sys
from lmperf.device import process_age_s
ages = {}
import torch
ages["torch_imported"] = process_age_s()
torch.ones(1, device="cuda").sum().item()
ages["cuda_ready"] = process_age_s()
from lmperf.model import TransformerLM
from lmperf.sizes import config_from_name
config = config_from_name(sys.argv[1], vocab_size=10000, context_length=128)
with torch.device("cuda"):
    model = TransformerLM(config)
torch.cuda.synchronize()
ages["model_built"] = process_age_s()
import torch._dynamo  # making an optimizer imports it
ages["dynamo_imported"] = process_age_s()
optimizer = torch.optim.AdamW(model.parameters())
batch = torch.randint(0, 10000, (4, 128), device="cuda")
def step(stages=False):
    loss = model(batch).float().logsumexp(-1).mean()
    torch.cuda.synchronize()
    if stages:
        ages["forward_done"] = process_age_s()
    loss.backward()
    torch.cuda.synchronize()
    if stages:
        ages["backward_done"] = process_age_s()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
step(stages=True)
ages["step_done"] = process_age_s()
torch.cuda.cudart().cudaProfilerStart()
step()
torch.cuda.cudart().cudaProfilerStop()
ages["capture_stopped"] = process_age_s()
print("AGES " + " ".join(f"{k}={v:.4f}" for k, v in ages.items()), flush=True)
"""


def parse_ages(stdout: str) -> dict[str, float]:
    """The child's stage ages from its ``AGES k=v ...`` line; a run without one raises, naming it."""
    for line in stdout.splitlines():
        if line.startswith("AGES "):
            ages = dict(item.split("=", 1) for item in line[5:].split())
            return {k: float(v) for k, v in ages.items()}
    raise RuntimeError(f"the child printed no AGES line:\n{stdout[-2000:]}")


def summarize(runs: list[dict]) -> dict:
    """Per mode, the median of each stage's age and of the wall time, and nsys's extra over plain.

    ``runs``: [{"mode": "plain" | "nsys", "wall_s": float, "ages": {stage: s}}, ...].
    """
    by_mode: dict[str, dict] = {}
    for mode in ("plain", "nsys"):
        rows = [r for r in runs if r["mode"] == mode]
        if not rows:
            continue
        medians = {stage: statistics.median(r["ages"][stage] for r in rows) for stage in STAGES}
        medians["wall_s"] = statistics.median(r["wall_s"] for r in rows)
        by_mode[mode] = {"runs": len(rows), "median_s": {k: round(v, 3) for k, v in medians.items()}}
    if "plain" in by_mode and "nsys" in by_mode:
        plain, nsys = by_mode["plain"]["median_s"], by_mode["nsys"]["median_s"]
        by_mode["nsys_extra_s"] = {k: round(nsys[k] - plain[k], 3) for k in plain}
    return by_mode


def main(argv: list[str]) -> int:
    repeats = int(argv[1]) if len(argv) > 1 else 3
    model = argv[2] if len(argv) > 2 else "small"
    from lmperf.profiling.nsys import find_nsys, profile_command

    nsys = find_nsys()
    if nsys is None:
        print("nsys is not on PATH: nothing to compare", file=sys.stderr)
        return 2
    child = [sys.executable, "-c", CHILD, model]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("plain", "nsys"):
            for i in range(repeats):
                # under nsys, the command the nsys cells run (their options, the report's path)
                cmd = child if mode == "plain" else profile_command(nsys, Path(tmp) / f"r{i}", child)
                t0 = time.perf_counter()
                done = subprocess.run(cmd, capture_output=True, text=True)
                wall = time.perf_counter() - t0
                if done.returncode != 0:
                    raise RuntimeError(
                        f"{mode} run {i} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
                    )
                runs.append({"mode": mode, "i": i, "wall_s": round(wall, 3), "ages": parse_ages(done.stdout)})
                print(json.dumps(runs[-1]), flush=True)
    print(json.dumps({"model": model, "repeats": repeats, "runs": runs, "summary": summarize(runs)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
