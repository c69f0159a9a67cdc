"""Where a device's committed grid spends its time, finer than the report header's per-kind totals.

Reads the records under ``results/<device>/`` (no GPU needed) and splits each cell process's time
among the records it wrote: a record's share is the time from the previous record of the same
process (or from the process's start) to its own writing (``process_age_s``). The shares are
grouped by what asked for them, so the 20-minute question of issue 16 can be argued from
measurements: the course's own configurations (`../shared/PROBLEMS.md`: every size at the lengths
128-1024, torch_compile (b) included; attention up to 16384; flash_benchmarking's bf16 and fp32 of
ours and plain PyTorch), what this project measures beyond them, and the speed ladder. A record
that ran the course's part first and says when it ended (``course_part_process_age_s``: the
leaderboard, the flash correctness check), or an nsys profile whose size's NVTX-overhead timing
(``stage_s``) ran just before its records were written, splits its share there, as the header does
(``lmperf.report.devices.record_parts``).

    python bench/grid_time_breakdown.py h100 h200 > bench/results/grid_time_breakdown.txt

Gaps between consecutive cell processes shorter than the report's pause threshold (30 s) are mostly
the exit of the process before them (its last record is written before it ends) and Snakemake
starting the next job; they are summed apart, per who asked for the process before them (the report
header counts each gap with that process). A gap in which a
Snakemake run began (``results/<device>/runs.jsonl``, lmperf.run_log) is a restart between runs
instead, however short, and is summed apart from those, as the report header leaves it out.

Beside each group's time, its **timed passes**: the least time its measurement protocol needs, from
the records' own medians and settings (``timed_passes_s``): the warm-up and measured steps of an
e2e cell, the warm-up and timed passes of an attention cell (its backward re-runs the forward
outside the timed region, so each backward pass costs a forward too), and do_bench's calls
(``do_bench_s``: its estimate, warm-up and repetition windows) in the flash benchmark and the
leaderboard. What a group takes
beyond them is overhead: process start, model builds, compiling, memory checks, profiler start-up.
Kinds whose protocol is not read here (nsys, memory, flash correctness, the ladder) show "-". Where
the nsys records split their process's time (``stage_s``, since ``a06cb52``), a second table gives
each nsys process's split: profiling (the profiled process's start-up, model build and warm-up up to
its capture among it), the SQLite export, reading the trace and the NVTX-overhead timing.
"""

import argparse
import json
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

from lmperf import run_log

# the report header's own pause threshold, time parsing, union of overlapping processes, which part
# of the grid a record counts to (Part 1's configurations, this project's additions, the ladder), and
# whether a gap between processes is a restart between runs
from lmperf.report.devices import (
    COURSE_ATTENTION_MAX_LENGTH,
    PAUSE_S,
    _parse_time,
    _union_s,
    grid_part,
    record_parts,
    run_began_between,
)

WHO = {"course": "course", "additions": "beyond the course", "ladder": "speed ladder (its own issue)"}


def group_of(record, part=None):
    """(group, who asked) of one record, or of its ``part`` of the grid (a record whose process ran the
    course's part first: ``record_parts``); who asked follows the report header's ``grid_part``."""
    kind, cell = record["kind"], record.get("cell", {})
    part = part or grid_part(record)
    who = WHO.get(part, part)
    if kind == "e2e":
        if record["provenance"].get("settings", {}).get("attention", "plain") != "plain":
            return "e2e attention_compare (our kernels in the whole model)", who
        if cell.get("compile") not in (None, "eager"):
            return "e2e torch.compile'd cells, warm (torch_compile (b) at the 4 lengths)", who
        if cell.get("warmup_steps", 5) != 5:
            return "e2e warm-up sweep 0/1/2", who
        return "e2e eager main (sizes x lengths x fp32/bf16)", who
    if kind == "e2e_compile":
        return "e2e_compile job (cold compiles of the 20 compiled cells)", who
    if kind == "attention":
        limit = COURSE_ATTENTION_MAX_LENGTH
        long = cell.get("sequence_length", 0) > limit
        return f"attention {cell.get('implementation')}, N {'>' if long else '<='} {limit}", who
    if kind == "flash":
        test = cell.get("test")
        if test == "benchmark":
            return f"flash benchmark {cell.get('implementation')} {cell.get('precision')}", who
        return f"flash {test}", who
    if kind == "nsys":
        return "nsys profiles", who
    return kind, who


def _steps_s(count: int, ms: float | None) -> float:
    return count * ms / 1e3 if ms else 0.0


def do_bench_s(call_ms: float, warmup_ms: float, rep_ms: float) -> float:
    """Seconds ``triton.testing.do_bench(fn, warmup, rep)`` runs ``fn`` for when one call takes
    ``call_ms``: one first call and 5 to estimate, then warm-up and repetition windows of at least one
    call each."""
    return (6 * call_ms + max(call_ms, warmup_ms) + max(call_ms, rep_ms)) / 1e3


def is_leaderboard(record) -> bool:
    return record["kind"] == "flash" and record.get("cell", {}).get("test") == "leaderboard"


def leaderboard_protocol_s(settings: dict) -> float:
    """Seconds of one leaderboard protocol run: do_bench's warm-up and repetition windows."""
    return (settings.get("warmup_ms", 0) + settings.get("rep_ms", 0)) / 1e3


def timed_passes_s(record) -> float | None:
    """Seconds the record's measurement protocol needs at least (its warm-up and timed passes at the
    record's own medians or means, or do_bench's time windows); None where this script does not read
    the kind's protocol."""
    kind, metrics = record["kind"], record.get("metrics", {})
    settings = record.get("provenance", {}).get("settings", {})
    if kind == "e2e":
        steps = settings.get("warmup_steps", 0) + settings.get("measured_steps", 0)
        return _steps_s(steps, metrics.get("training_step_ms_median")) + _steps_s(
            steps, metrics.get("inference_forward_ms_median")
        )
    if kind == "attention":
        forward_ms = metrics.get("forward_ms_mean")
        forward = _steps_s(metrics.get("forward_warmup_passes", 0) + metrics.get("forward_n", 0), forward_ms)
        backward_ms = metrics.get("backward_ms_mean")
        passes = metrics.get("backward_warmup_passes", 0) + metrics.get("backward_n", 0)
        return forward + (_steps_s(passes, forward_ms + backward_ms) if forward_ms and backward_ms else 0.0)
    if kind == "flash" and record.get("cell", {}).get("test") == "benchmark":
        timed = ("forward_ms_median", "backward_ms_median", "forward_backward_ms_median")
        warmup_ms, rep_ms = settings.get("warmup_ms", 0), settings.get("rep_ms", 0)
        return sum(do_bench_s(metrics[key], warmup_ms, rep_ms) for key in timed if metrics.get(key))
    if is_leaderboard(record):
        protocol_s = leaderboard_protocol_s(settings)
        protocol_runs = len(settings.get("protocol_head_dims", [])) * len(settings.get("implementations", []))
        table_s = (settings.get("table_warmup_ms", 0) + settings.get("table_rep_ms", 0)) / 1e3
        table_runs = 3 * len(metrics.get("side_by_side", []))  # forward, backward, forward+backward per row
        return protocol_runs * protocol_s + table_runs * table_s
    return None


def timed_passes_parts(record, parts) -> list:
    """``timed_passes_s`` of each of the record's ``parts`` (``record_parts``): a leaderboard record whose
    course's part is apart gives that part one protocol run (our kernel at the leaderboard's shape) and the
    rest the others; a kind whose protocol is not read here gives None to each part."""
    total = timed_passes_s(record)
    if len(parts) == 1:
        return [total]
    if total is not None and is_leaderboard(record):
        course = leaderboard_protocol_s(record.get("provenance", {}).get("settings", {}))
        return [course, total - course]
    return [None] * len(parts)


def breakdown(device):
    """Seconds per (group, who), seconds of short gaps between processes (per who asked for the share
    that ended before the gap: the report header counts a gap with the process before it), process
    count, the timed passes' seconds per group (None for a group whose records' protocol is not read here), the
    restarts between runs (number, seconds), and each record's share of its process:
    {path under results/<device>: (seconds, grid part, status)}."""
    per_process = defaultdict(list)
    for path in sorted(Path("results", device).glob("*/*.json")):
        record = json.loads(path.read_text())
        prov = record.get("provenance", {})
        if "kind" not in record or prov.get("process_age_s") is None or record["kind"] == "scaleout":
            continue
        key = (record["kind"], prov["process_start_time"], prov.get("hostname"))
        per_process[key].append((prov["process_age_s"], path.relative_to(Path("results", device)).as_posix(), record))
    spans = defaultdict(list)  # group -> (start, stop) of each record's share
    shares = {}
    timed: dict = {}
    intervals = []
    for (_, start, _), rows in per_process.items():
        rows.sort(key=lambda row: row[0])
        t0, before = _parse_time(start), 0.0
        ends = []  # every part of every record of the process, in the order they ended
        for age, name, record in rows:
            shares[name] = (age - before, grid_part(record), record.get("status"))
            before = age
            parts = record_parts(record)
            ends += [
                (end, group_of(record, part), floor)
                for (end, part), floor in zip(parts, timed_passes_parts(record, parts))
            ]
        # records written together split at their own ages (an nsys size's records, each with its
        # NVTX-overhead timing after the course's part): walk the parts in order, as the header does
        before, who = 0.0, None
        for end, group, floor in sorted(ends, key=lambda item: item[0]):
            spans[group].append((t0 + timedelta(seconds=before), t0 + timedelta(seconds=end)))
            timed[group] = None if floor is None else (timed.get(group) or 0.0) + floor
            before, who = end, group[1]
        intervals.append((t0, t0 + timedelta(seconds=before), who))
    # processes of one group can overlap (the compile job's cells compile side by side): count
    # their time once, as the report header does
    seconds = {group: _union_s(group_spans) for group, group_spans in spans.items()}
    intervals.sort()
    run_starts = run_log.run_starts(Path("results", device))
    gaps, restarts, end, end_who = defaultdict(float), [], None, None
    for start, stop, who in intervals:
        gap = 0.0 if end is None else (start - end).total_seconds()
        if gap > 0 and run_began_between(run_starts, end, start):
            restarts.append(gap)
        elif 0 < gap <= PAUSE_S:
            gaps[end_who] += gap
        if end is None or stop > end:
            end, end_who = stop, who
    return seconds, dict(gaps), len(per_process), timed, (len(restarts), sum(restarts)), shares


def course_only_here(shares: dict, other: dict) -> tuple[int, float]:
    """(cells, seconds) of the course's records that ran (status ok) on this device but not on the
    other, from ``breakdown``'s shares of both: what a device with more memory measures beyond the
    other's grid. Records written together (an nsys process's sizes) share one process time: all but
    its first count little or nothing here, so the seconds are a floor."""
    cells = [
        name
        for name, (_, part, status) in shares.items()
        if part == "course" and status == "ok" and other.get(name, (0, "", None))[2] != "ok"
    ]
    return len(cells), sum(shares[name][0] for name in cells)


def nsys_stages(device):
    """One row per nsys process whose records split its time, in the order the processes ran: (its
    sizes in the order they were profiled, precision, process seconds, `stage_s`, the profiled
    process's age at its first capture). A process that profiles several sizes (one per precision,
    lmperf.cells.nsys) repeats its profile, export and read seconds in every record; its NVTX-overhead
    timing is per size, summed here."""
    processes = {}
    for path in sorted(Path("results", device, "nsys").glob("*.json")):
        record = json.loads(path.read_text())
        metrics, prov = record.get("metrics", {}), record.get("provenance", {})
        if "stage_s" not in metrics or prov.get("process_age_s") is None:
            continue
        p = processes.setdefault(prov["process_start_time"], {"age": 0.0, "sizes": {}})
        p["age"] = max(p["age"], prov["process_age_s"])
        p["precision"], p["stage"] = record["cell"]["precision"], metrics["stage_s"]
        p["sizes"][record["cell"]["model"]] = (
            metrics.get("capture_start_process_age_s"),
            metrics["stage_s"].get("nvtx_overhead"),
        )
    rows = []
    for key in sorted(processes):
        p = processes[key]
        sizes = sorted(p["sizes"].items(), key=lambda item: (item[1][0] is None, item[1][0] or 0.0))
        stage = dict(p["stage"])
        overheads = [nvtx for _, (_, nvtx) in sizes if nvtx is not None]
        stage["nvtx_overhead"] = sum(overheads) if overheads else None
        rows.append((", ".join(name for name, _ in sizes), p["precision"], p["age"], stage, sizes[0][1][0]))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("devices", nargs="+", help="device slugs under results/")
    args = parser.parse_args()
    results = {device: breakdown(device) for device in args.devices}
    for device in args.devices:
        seconds, gaps, processes, timed, (restarts, restart_s), shares = results[device]
        if not seconds:
            raise SystemExit(f"no records with process times under results/{device}/")
        print(f"## {device}: {processes} cell processes\n")
        print("| group | asked by | minutes | timed passes (min) |")
        print("|---|---|---:|---:|")
        for (group, who), s in sorted(seconds.items(), key=lambda item: -item[1]):
            floor = timed.get((group, who))
            print(f"| {group} | {who} | {s / 60:.2f} | {'-' if floor is None else f'{floor / 60:.2f}'} |")
        totals, read, floors = defaultdict(float), defaultdict(float), defaultdict(float)
        for key, s in seconds.items():
            totals[key[1]] += s
            if timed.get(key) is not None:
                read[key[1]] += s
                floors[key[1]] += timed[key]
        print()
        for who, s in sorted(totals.items(), key=lambda item: -item[1]):
            where = f"{read[who] / 60:.1f} min in groups whose protocol is read, {floors[who] / 60:.1f} of them timed passes"
            print(f"- {who}: {s / 60:.1f} min ({where})")
        if restarts:
            print(
                f"- restarts between Snakemake runs ({restarts}, left out of the header's time): {restart_s / 60:.1f} min"
            )
        after = ", ".join(f"after {who} {s / 60:.1f}" for who, s in sorted(gaps.items(), key=lambda item: -item[1]))
        print(
            f"- gaps between cell processes (under {PAUSE_S:.0f} s each; the header counts each with the "
            f"process before it): {sum(gaps.values()) / 60:.1f} min ({after})"
        )
        for other in args.devices:
            if other != device:
                cells, s = course_only_here(shares, results[other][5])
                print(
                    f"- course cells that ran here and not on {other} (no ok record there): {cells}, {s / 60:.1f} min at least"
                )
        print()
        stages = nsys_stages(device)
        if stages:
            print(f"### {device}: where each nsys process's time went (s)\n")
            print(
                "| sizes | precision | process | profile | of it, to the first capture | export | read | NVTX overhead |"
            )
            print("|---|---|---:|---:|---:|---:|---:|---:|")
            for model, precision, process_s, stage, capture_s in stages:
                cells = [stage.get(name) for name in ("profile", "export", "read", "nvtx_overhead")]
                cells.insert(1, capture_s)
                shown = " | ".join("-" if x is None else f"{x:.1f}" for x in cells)
                print(f"| {model} | {precision} | {process_s:.1f} | {shown} |")
            print()


if __name__ == "__main__":
    main()
