"""How long a process that ran torch.compile takes to exit, by Inductor's compile_threads.

The H100's compiled e2e cells of 4567678 left 2.8-5.5 s between writing their record and the next
cell's start, against 0.2-0.3 s after an eager cell: the exit, while Inductor's compile workers shut
down (bench/grid_time_notes.md). This runs a small compiled model
(forward and backward) four times, each in a fresh interpreter: twice with Inductor's default
worker count, then twice with one worker, all on one cache (the first run compiles cold, the
others load its graphs, as a measured cell loads the compile job's). Each prints the seconds from
the end of its work to the process being gone.

    python bench/compile_exit_probe.py [DEVICE]      # default: cuda if available, else cpu
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import sys, time
import torch
threads = int(sys.argv[2])
if threads:
    import torch._inductor.config as inductor_config
    inductor_config.compile_threads = threads
device = sys.argv[1]
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.LayerNorm(1024), torch.nn.Linear(1024, 256))
model = torch.compile(model.to(device))
x = torch.randn(64, 256, device=device)
model(x).square().mean().backward()
if device == "cuda":
    torch.cuda.synchronize()
import torch._inductor.config as inductor_config
print(f"{time.time():.6f} {inductor_config.compile_threads}", flush=True)
"""


def main() -> int:
    import torch

    device = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": f"{cache}/triton"}
        # one cache for all four runs: only the first compiles cold; the one-worker runs find the
        # default's graphs, as a measured cell finds the compile job's (threads 0: Inductor's default)
        for index, threads in enumerate((0, 0, 1, 1)):
            start = time.time()
            out = subprocess.run(
                [sys.executable, "-c", CHILD, device, str(threads)], env=env, capture_output=True, text=True, check=True
            )
            gone = time.time()
            work_end, used = out.stdout.split()
            row = {
                "device": device,
                "compile_threads": int(used),
                "cache": "cold" if index == 0 else "warm",
                "process_s": round(gone - start, 2),
                "exit_s": round(gone - float(work_end), 2),
            }
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
