"""Which import starts the CUDA driver: can the fork server pre-import torch.compile's back end?

A compiled e2e cell spends seconds before its first step importing Inductor (``layer.compile()``
imports ``torch._inductor.compile_fx``: 1.2 s on a 2-core CPU machine; the H100's compiled cells of
2591fa8 took 3.6-5.6 s from process start to first step against 0.8 s for eager ones). The fork
server (lmperf.cells.forkserver) cannot import it for them while that import initialises CUDA (a
forked child could not use it), which it did on an H100. This probe says which module's import does
it, and whether ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (torch.cuda.is_available through NVML, no cuInit)
avoids it: in a fresh interpreter per target and setting, after what the server already imports, it
imports the target with every module's execution watched, and names the first module whose import
left the driver's threads (``cuda…``) running or torch's CUDA initialised, with the seconds taken.

    python bench/preload_probe.py [MODULE ...]     # default: torch._inductor.compile_fx

One JSON line per (target, setting). On a machine without CUDA nothing initialises: it only times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

TARGETS = ("torch._inductor.compile_fx",)
SETTINGS = ({}, {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"})

CHILD = r"""
import importlib.abc, json, os, sys, time
import torch, torch._dynamo, triton  # what the fork server imports before the cells (PRELOAD)

def cuda_threads():
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sorted(n for n in names if n.startswith("cuda"))

def initialised():
    return bool(cuda_threads()) or torch.cuda.is_initialized()

first = {"module": None}

class Watch(importlib.abc.MetaPathFinder):
    # wraps each loader's exec_module: the first module whose execution ends with CUDA up is named
    def find_spec(self, name, path, target=None):
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module
                def exec_module(module, run=run, name=name):
                    run(module)
                    if first["module"] is None and initialised():
                        first["module"] = name
                spec.loader.exec_module = exec_module
                return spec
        return None

before = initialised()
sys.meta_path.insert(0, Watch())
start = time.perf_counter()
importlib.import_module(sys.argv[1])
print(json.dumps({
    "target": sys.argv[1],
    "import_s": round(time.perf_counter() - start, 3),
    "cuda_before": before,
    "cuda_after": initialised(),
    "driver_threads": cuda_threads(),
    "first_module_with_cuda_up": first["module"],
}))
"""


def main(argv: list[str]) -> int:
    for target in argv or TARGETS:
        for extra in SETTINGS:
            env = {**os.environ, **extra}
            done = subprocess.run([sys.executable, "-c", CHILD, target], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                print(json.dumps({"target": target, "env": extra, "error": done.stderr.strip()[-2000:]}))
                continue
            print(json.dumps({**json.loads(done.stdout.strip().splitlines()[-1]), "env": extra}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
