"""Probe (issue 12): does the leaderboard protocol leave the GPU idle between our kernels?

The committed H100 leaderboard record has our eager forward (1.166 ms) and backward (3.333 ms)
summing to 4.50 ms at d = 64, while the course's protocol (torch.compile'd f, then
``f(q, k, v, True).sum().backward()``) takes 4.91 ms; cuDNN's protocol costs only 0.03 ms more
than its eager parts. If the 0.4 ms is host time that the GPU waits for (Python launch paths,
a hidden synchronisation), it is not kernel time and can be cut without touching a kernel.

For each implementation and head dim, at the leaderboard's inputs (16 x 16384 x d, causal bf16):
- ``gpu_ms``: do_bench median of the protocol step (as lmperf.benchmarks.flash.time_leaderboard,
  shorter rep), and of the step without torch.compile (``eager``);
- ``enqueue_ms``: host time per step with the GPU left to run behind (no synchronisation), and
  ``wall_ms``: per step including the final synchronisation. enqueue close to wall means the host
  is the bottleneck;
- ``profile``: kernels of 10 steps under torch.profiler: GPU busy time per step, the idle gaps
  between consecutive kernels (sum per step, the largest ones and what follows them), and each
  kernel name's time per step;
- for ours, the host path's hottest functions under cProfile;
- ``clock_rounds``: the compiled protocol of every implementation again, interleaved over rounds,
  with the GPU's SM clock and power draw sampled by nvidia-smi while do_bench runs (a power-capped
  GPU lowers its clock under sustained tensor-core load, and more so for more work per step).

Writes $OUT/flash_host_probe.json (or ./flash_host_probe.json).

    python bench/flash_host_probe.py [--impls flash_triton,sdpa_cudnn] [--head-dims 64,128]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import tempfile
import time


def kernel_gaps(kernels: list[dict], steps: int, top: int = 5) -> dict:
    """Busy and idle time of a kernel trace, per step.

    `kernels`: dicts with "name", "ts" and "dur" (microseconds, Chrome-trace style), any order.
    Busy is the union of kernel intervals; a gap is the idle time between one kernel's end and the
    next kernel's start (overlapping kernels leave none). Returns ms per step and the `top` largest
    gaps with the kernel that ends the gap.
    """
    ks = sorted(kernels, key=lambda k: k["ts"])
    if not ks:
        return {"busy_ms_per_step": 0.0, "idle_ms_per_step": 0.0, "span_ms_per_step": 0.0, "largest_gaps": []}
    busy = 0.0
    gaps = []
    cur_start, cur_end = ks[0]["ts"], ks[0]["ts"] + ks[0]["dur"]
    for k in ks[1:]:
        start, end = k["ts"], k["ts"] + k["dur"]
        if start > cur_end:
            busy += cur_end - cur_start
            gaps.append((start - cur_end, k["name"]))
            cur_start = start
        cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    span = ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"]
    by_name: dict[str, float] = {}
    for k in ks:
        by_name[k["name"]] = by_name.get(k["name"], 0.0) + k["dur"]
    gaps.sort(reverse=True)
    return {
        "busy_ms_per_step": busy / 1000 / steps,
        "idle_ms_per_step": sum(g for g, _ in gaps) / 1000 / steps,
        "span_ms_per_step": span / 1000 / steps,
        "largest_gaps": [{"us": g, "before": name[:120]} for g, name in gaps[:top]],
        "kernel_ms_per_step": {
            name[:120]: t / 1000 / steps for name, t in sorted(by_name.items(), key=lambda kv: -kv[1])
        },
    }


def make_step(impl: str, head_dim: int, compiled: bool):
    """The protocol's step on fresh leaderboard inputs (grads accumulate, as in the course's script)."""
    import torch

    from lmperf.benchmarks.flash import IMPLEMENTATIONS, LEADERBOARD_SHAPE, make_inputs

    shape = LEADERBOARD_SHAPE
    q, k, v, _ = make_inputs(shape["batch"], shape["seq"], head_dim, shape["dtype"])
    f = torch.compile(IMPLEMENTATIONS[impl]) if compiled else IMPLEMENTATIONS[impl]

    def step():
        f(q, k, v, True).sum().backward()

    return step


def host_times(step, n: int = 50) -> dict:
    import torch

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return {"enqueue_ms": (t1 - t0) * 1000 / n, "wall_ms": (t2 - t0) * 1000 / n, "steps": n}


def profile_kernels(step, steps: int = 10) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as fh:
            trace = json.load(fh)
    kernels = [
        {"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"])}
        for e in trace.get("traceEvents", [])
        if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy") and "dur" in e
    ]
    return kernel_gaps(kernels, steps)


def host_profile(step, steps: int = 20, top: int = 25) -> str:
    import torch

    step()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(steps):
        step()
    pr.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def sampled(fn, interval_ms: int = 50):
    """fn()'s result and nvidia-smi's samples while it runs: median SM clock (MHz) and power (W)."""
    import statistics

    smi = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", f"-lms={interval_ms}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        value = fn()
    finally:
        smi.terminate()
        out, _ = smi.communicate()
    clocks, watts = [], []
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        try:
            clocks.append(float(parts[0]))
            watts.append(float(parts[1]))
        except (ValueError, IndexError):
            continue
    return value, {
        "sm_clock_mhz_median": statistics.median(clocks) if clocks else None,
        "power_w_median": statistics.median(watts) if watts else None,
        "samples": len(clocks),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impls", default="flash_triton,sdpa_cudnn")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--rep-ms", type=int, default=1500)
    parser.add_argument("--clock-rounds", type=int, default=3)
    parser.add_argument("--skip-profile", action="store_true", help="only the clock rounds")
    args = parser.parse_args(argv)

    import torch
    from triton.testing import do_bench

    out_path = os.path.join(os.environ.get("OUT", "."), "flash_host_probe.json")
    results = {"device": torch.cuda.get_device_name(), "rows": []}
    head_dims = [int(d) for d in args.head_dims.split(",")]
    impls = args.impls.split(",")
    for head_dim in [] if args.skip_profile else head_dims:
        for impl in impls:
            row = {"impl": impl, "head_dim": head_dim}
            for compiled in (True, False):
                step = make_step(impl, head_dim, compiled)
                tag = "compiled" if compiled else "eager"
                row[f"gpu_ms_{tag}"] = do_bench(step, warmup=200, rep=args.rep_ms, return_mode="median")
                row[f"host_{tag}"] = host_times(step)
                row[f"profile_{tag}"] = profile_kernels(step)
                if impl == "flash_triton" and compiled:
                    row["host_profile_compiled"] = host_profile(step)
                del step
                torch.cuda.empty_cache()
                p = row[f"profile_{tag}"]
                print(
                    f"{impl:13s} d={head_dim:3d} {tag:8s} do_bench {row[f'gpu_ms_{tag}']:.3f} ms  "
                    f"enqueue {row[f'host_{tag}']['enqueue_ms']:.3f}  wall {row[f'host_{tag}']['wall_ms']:.3f}  "
                    f"busy {p['busy_ms_per_step']:.3f}  idle {p['idle_ms_per_step']:.3f}  "
                    f"span {p['span_ms_per_step']:.3f}",
                    flush=True,
                )
                for g in p["largest_gaps"]:
                    print(f"    gap {g['us']:8.1f} us before {g['before']}")
                for name, ms in list(p["kernel_ms_per_step"].items())[:8]:
                    print(f"    {ms:8.4f} ms/step  {name}")
            results["rows"].append(row)
            with open(out_path, "w") as fh:
                json.dump(results, fh, indent=1)
            if "host_profile_compiled" in row:
                print(row["host_profile_compiled"])
    results["clock_rounds"] = []
    steps = {(impl, d): make_step(impl, d, True) for d in head_dims for impl in impls}
    for rnd in range(args.clock_rounds):
        for (impl, d), step in steps.items():
            ms, clock = sampled(lambda step=step: do_bench(step, warmup=200, rep=args.rep_ms, return_mode="median"))
            results["clock_rounds"].append({"round": rnd, "impl": impl, "head_dim": d, "gpu_ms": ms, **clock})
            print(
                f"round {rnd} {impl:13s} d={d:3d} {ms:.3f} ms  SM {clock['sm_clock_mhz_median']} MHz  "
                f"{clock['power_w_median']} W ({clock['samples']} samples)",
                flush=True,
            )
            with open(out_path, "w") as fh:
                json.dump(results, fh, indent=1)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
