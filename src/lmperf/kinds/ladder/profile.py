"""Ladder profile cell: an Nsight Systems profile of a ladder's best rung (the ok rung with the most
tokens/s), run again under ``nsys profile -c cudaProfilerApi`` (``ladder.cell --replay``): GPU busy and
idle time over the captured steps, the top kernels and the time per kernel class. Without CUDA or nsys
``unsupported``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from lmperf.core import device as devices
from lmperf.core.cell import parse_job
from lmperf.core.record import Unsupported, load_record
from lmperf.kinds.ladder import cell as ladder_cell  # the code it replays: in its fingerprint
from lmperf.profiling import kernels as kernel_names
from lmperf.profiling import nsys


def best_rung(records: list[dict]) -> dict:
    ok = [r for r in records if r["kind"] == "ladder" and r["status"] == "ok"]
    if not ok:
        raise Unsupported("no ladder rung of this size ran (every one out of memory or unsupported)")
    return max(ok, key=lambda r: r["metrics"]["tokens_per_s"])


def analyse(trace, window: tuple[int, int], top_n: int) -> dict:
    """Busy time, idle time, top kernels and time per class of the kernels that start inside ``window``."""
    lo, hi = window
    ks = sorted((k for k in trace.kernels if lo <= k.start_ns <= hi), key=lambda k: k.start_ns)
    if not ks:
        raise RuntimeError("the profiled window holds no kernel")
    busy_ns, end = 0, lo  # the union of the kernels' intervals, clipped to the window
    for k in ks:
        start, stop = max(k.start_ns, end), min(k.end_ns, hi)
        busy_ns += max(0, stop - start)
        end = max(end, stop)
    per_kernel: dict[str, dict] = {}
    per_class: dict[str, float] = {}
    for k in ks:
        name, cls = kernel_names.label(k.name, k.short_name or None), kernel_names.classify(k.name)
        entry = per_kernel.setdefault(name, {"name": name, "class": cls, "ns": 0, "count": 0})
        entry["ns"] += k.end_ns - k.start_ns
        entry["count"] += 1
        per_class[cls] = per_class.get(cls, 0) + (k.end_ns - k.start_ns)
    kernel_ns = sum(per_class.values())
    top = sorted(per_kernel.values(), key=lambda e: -e["ns"])[:top_n]
    classes = sorted(per_class.items(), key=lambda x: -x[1])
    return {
        "window_ms": (hi - lo) / 1e6,
        "kernels": len(ks),
        "busy_ms": busy_ns / 1e6,
        "busy_fraction": busy_ns / (hi - lo),
        "idle_ms": (hi - lo - busy_ns) / 1e6,
        "top_kernels": [{**e, "ms": e["ns"] / 1e6, "share": e["ns"] / kernel_ns} for e in top],
        "class_ms": {c: v / 1e6 for c, v in classes},
        "class_share": {c: v / kernel_ns for c, v in classes},
    }


def replay_command(
    cell: dict, settings: dict, config: dict, device: str, profile_steps: int, output: Path
) -> list[str]:
    """The command nsys profiles: the best rung's configuration, run again by the ladder module in
    a process nsys starts itself (``python -m lmperf.kinds.ladder.cell --replay``; through the runner
    the warm parent would fork it outside nsys's process tree, and nsys would capture nothing)."""
    replay = {
        "settings": {**settings, "model": cell["model"], "context_length": cell["context_length"]},
        "device": device,
        "config": config,
        "profile_steps": profile_steps,
        "output": str(output),
    }
    return [sys.executable, "-m", ladder_cell.__name__, "--replay", json.dumps(replay)]


def measure(args, device) -> dict:
    if device.type != "cuda":
        raise Unsupported("an Nsight Systems profile of CUDA kernels needs a CUDA device; this cell runs on the CPU")
    exe = nsys.find_nsys(None)
    if exe is None:
        raise Unsupported("nsys is not on PATH: the best rung was not profiled")
    best = best_rung([load_record(p) for p in args.records])
    m, cell = best["metrics"], best["cell"]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / f"{cell['model'].replace('.', 'p')}_ctx{cell['context_length']}_{cell['rung']}"
        times = Path(tmp) / "replay.json"
        settings = best["provenance"]["settings"]
        app = replay_command(cell, settings, m["config"], args.device, args.profile_steps, times)
        report = nsys.profile(exe, base, app)
        sqlite = nsys.export_sqlite(exe, report, base.with_name(base.name + ".sqlite"))
        trace = nsys.read_sqlite(sqlite)
        steps = sorted((r for r in trace.ranges if r.name == "ladder step"), key=lambda r: r.start_ns)
        if not steps:
            raise RuntimeError("the profile holds no 'ladder step' NVTX range")
        out = analyse(trace, (steps[0].start_ns, steps[-1].end_ns), args.top_kernels)
        replay = json.loads(times.read_text())
    out |= {"rung": cell["rung"], "config": m["config"], "profiled_steps": len(steps), **replay}
    return out | {"step_ms_ladder": m["step_ms_median"], "nsys_version": nsys.version(exe)}


def main(argv=None) -> int:
    job = parse_job("ladder_profile", argv, __doc__.splitlines()[0])
    args = job.args
    device = devices.check_device(args.device)
    first = load_record(args.records[0])["cell"]
    cell = {"model": first["model"], "context_length": first["context_length"]}
    job.write("ladder_profile", cell, lambda: measure(args, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
