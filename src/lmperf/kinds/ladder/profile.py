"""Ladder profile cell: an Nsight Systems profile of a ladder's best rung (what limits it).

Reads the ladder records of one (model, context), takes the ok rung with the most tokens/s and
runs its configuration again under ``nsys profile -c cudaProfilerApi`` (``lmperf.kinds.ladder.cell
--replay-config``): warm-up steps, then ``--profile-steps`` captured steps, each in an NVTX range
with a synchronize at its end. From the SQLite export, over the captured window (first step's
start to last step's end): GPU busy time (union of kernel intervals), the idle gaps between
kernels (total, count above a threshold, the largest with their neighbours), the top kernels by
GPU time and the time per kernel class (matmul, elementwise, optimizer, …; lmperf.profiling.kernels).
Without CUDA or nsys the record is ``unsupported``, saying why.

    python -m lmperf ladder_profile --output results/h100/ladder_profile/2.7B_ctx1024.json \
        --device h100 --records results/h100/ladder/2.7B_ctx1024_*.json
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
from pathlib import Path

from lmperf.core import device as devices
from lmperf.core.cell import parse_job
from lmperf.core.record import Unsupported, load_record
from lmperf.profiling import kernels as kernel_names
from lmperf.profiling import nsys

GAP_THRESHOLD_NS = 10_000


def best_rung(records: list[dict]) -> dict:
    ok = [r for r in records if r["kind"] == "ladder" and r["status"] == "ok"]
    if not ok:
        raise Unsupported("no ladder rung of this size ran (every one out of memory or unsupported)")
    return max(ok, key=lambda r: r["metrics"]["tokens_per_s"])


def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [tuple(x) for x in out]


def analyse(trace, window: tuple[int, int], top_n: int, gap_threshold_ns: int = GAP_THRESHOLD_NS) -> dict:
    """Busy time, idle gaps and top kernels of the kernels that start inside ``window``."""
    lo, hi = window
    ks = [k for k in trace.kernels if lo <= k.start_ns <= hi]
    if not ks:
        raise RuntimeError("the profiled window holds no kernel")
    busy = merge([(k.start_ns, min(k.end_ns, hi)) for k in ks])
    busy_ns = sum(e - s for s, e in busy)
    span = hi - lo
    gaps = []
    edges = [(lo, lo)] + busy + [(hi, hi)]
    for (_, prev_end), (next_start, _) in itertools.pairwise(edges):
        if next_start > prev_end:
            gaps.append((next_start - prev_end, prev_end, next_start))
    by_start = sorted(ks, key=lambda k: k.start_ns)

    def neighbour(t, before):
        cands = [k for k in by_start if (k.end_ns <= t if before else k.start_ns >= t)]
        if not cands:
            return None
        k = max(cands, key=lambda k: k.end_ns) if before else min(cands, key=lambda k: k.start_ns)
        return kernel_names.label(k.name, k.short_name or None)

    largest = sorted(gaps, reverse=True)[:5]
    per_kernel: dict[str, dict] = {}
    per_class: dict[str, float] = {}
    for k in ks:
        name = kernel_names.label(k.name, k.short_name or None)
        entry = per_kernel.setdefault(name, {"name": name, "class": kernel_names.classify(k.name), "ns": 0, "count": 0})
        entry["ns"] += k.end_ns - k.start_ns
        entry["count"] += 1
        cls = kernel_names.classify(k.name)
        per_class[cls] = per_class.get(cls, 0) + (k.end_ns - k.start_ns)
    kernel_ns = sum(e["ns"] for e in per_kernel.values())
    top = sorted(per_kernel.values(), key=lambda e: -e["ns"])[:top_n]
    return {
        "window_ms": span / 1e6,
        "kernels": len(ks),
        "busy_ms": busy_ns / 1e6,
        "busy_fraction": busy_ns / span,
        "idle_ms": (span - busy_ns) / 1e6,
        "gaps": len(gaps),
        "gaps_over_threshold": sum(1 for g in gaps if g[0] >= gap_threshold_ns),
        "gap_threshold_us": gap_threshold_ns / 1e3,
        "idle_in_gaps_over_threshold_ms": sum(g[0] for g in gaps if g[0] >= gap_threshold_ns) / 1e6,
        "largest_gaps": [
            {"us": g / 1e3, "after": neighbour(s, True), "before": neighbour(e, False)} for g, s, e in largest
        ],
        "top_kernels": [{**e, "ms": e["ns"] / 1e6, "share": e["ns"] / kernel_ns} for e in top],
        "class_ms": {c: v / 1e6 for c, v in sorted(per_class.items(), key=lambda x: -x[1])},
        "class_share": {c: v / kernel_ns for c, v in sorted(per_class.items(), key=lambda x: -x[1])},
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
    return [sys.executable, "-m", "lmperf.kinds.ladder.cell", "--replay", json.dumps(replay)]


def measure(args, device) -> dict:
    if device.type != "cuda":
        raise Unsupported("an Nsight Systems profile of CUDA kernels needs a CUDA device; this cell runs on the CPU")
    exe = nsys.find_nsys(args.nsys_path)
    if exe is None:
        raise Unsupported("nsys is not on PATH (and no --nsys-path): the best rung was not profiled")
    records = [load_record(p) for p in args.records]
    best = best_rung(records)
    m, cell = best["metrics"], best["cell"]
    settings = best["provenance"]["settings"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        base = work / f"{cell['model'].replace('.', 'p')}_ctx{cell['context_length']}_{cell['rung']}"
        times = work / "replay.json"
        app = replay_command(cell, settings, m["config"], args.device, args.profile_steps, times)
        report = nsys.profile(exe, base, app)
        sqlite = nsys.export_sqlite(exe, report, base.with_name(base.name + ".sqlite"))
        trace = nsys.read_sqlite(sqlite)
        steps = sorted((r for r in trace.ranges if r.name == "ladder step"), key=lambda r: r.start_ns)
        if not steps:
            raise RuntimeError("the profile holds no 'ladder step' NVTX range")
        out = analyse(trace, (steps[0].start_ns, steps[-1].end_ns), args.top_kernels)
        replay = json.loads(times.read_text())
    out.update(
        {
            "rung": cell["rung"],
            "config": m["config"],
            "profiled_steps": len(steps),
            # the ladder record's step time, by the statistic it names (records before it: the mean)
            "step_ms_ladder": m[f"step_ms_{m.get('step_statistic', 'mean')}"],
            **replay,
            "nsys_version": nsys.version(exe),
        }
    )
    return out


def main(argv=None) -> int:
    job = parse_job("ladder_profile", argv, __doc__.splitlines()[0])
    args = job.args
    args.nsys_path, args.keep_dir = None, None
    device = devices.check_device(args.device)
    first = load_record(args.records[0])["cell"]
    cell = {"model": first["model"], "context_length": first["context_length"]}
    job.write("ladder_profile", cell, lambda: measure(args, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
