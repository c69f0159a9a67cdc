"""Where a device's committed grid spends its time, finer than the report header's per-kind totals.

Reads the records under ``results/<device>/`` (no GPU needed) and splits each cell process's time
among the records it wrote: a record's share is the time from the previous record of the same
process (or from the process's start) to its own writing (``process_age_s``). The shares are
grouped by what asked for them, so the 20-minute question of issue 16 can be argued from
measurements: the course's own configurations (`../shared/PROBLEMS.md`: every size at the lengths
128-1024, torch_compile (b) included; attention up to 16384; flash_benchmarking's bf16 and fp32 of
ours and plain PyTorch), what this project measures beyond them, and the speed ladder.

    python bench/grid_time_breakdown.py h100 h200 > bench/results/grid_time_breakdown.txt

Gaps between consecutive cell processes shorter than the report's pause threshold (30 s) are the
workflow's own overhead (Snakemake starting the next job); they are summed apart.
"""

import argparse
import json
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

# the report header's own pause threshold, time parsing and union of overlapping processes
from lmperf.report.devices import PAUSE_S, _parse_time, _union_s

LONG_ATTENTION = 16384  # attention lengths above this only find the out-of-memory boundary
COURSE_ATTENTION = {"plain", "compiled"}  # pytorch_attention and torch_compile (a)
COURSE_FLASH = {("flash_triton", "bf16"), ("flash_triton", "fp32"), ("plain", "bf16"), ("plain", "fp32")}


def group_of(record):
    """(group, who asked) of one record; who asked is `course` or the addition's reason."""
    kind, cell = record["kind"], record.get("cell", {})
    if kind == "e2e":
        if record["provenance"].get("settings", {}).get("attention", "plain") != "plain":
            return "e2e attention_compare (our kernels in the whole model)", "beyond the course"
        if cell.get("compile") not in (None, "eager"):
            return "e2e torch.compile'd cells, warm (torch_compile (b) at the 4 lengths)", "course"
        if cell.get("warmup_steps", 5) != 5:
            return "e2e warm-up sweep 0/1/2", "course"
        return "e2e eager main (sizes x lengths x fp32/bf16)", "course"
    if kind == "e2e_compile":
        return "e2e_compile job (cold compiles of the 20 compiled cells)", "course"
    if kind == "attention":
        impl, n = cell.get("implementation"), cell.get("sequence_length", 0)
        long = n > LONG_ATTENTION
        who = "course" if impl in COURSE_ATTENTION and not long else "beyond the course"
        return f"attention {impl}, N {'> 16384' if long else '<= 16384'}", who
    if kind == "flash":
        test = cell.get("test")
        if test == "benchmark":
            impl, prec = cell.get("implementation"), cell.get("precision")
            who = "course" if (impl, prec) in COURSE_FLASH else "beyond the course"
            return f"flash benchmark {impl} {prec}", who
        return f"flash {test}", "course"
    if kind == "nsys":
        return "nsys profiles", "course"
    if kind in ("ladder", "ladder_profile", "gemm_peak"):
        return kind, "speed ladder (its own issue)"
    return kind, "course"


def breakdown(device):
    """Seconds per (group, who), seconds of short gaps between processes, and process count."""
    per_process = defaultdict(list)
    for path in sorted(Path("results", device).glob("*/*.json")):
        record = json.loads(path.read_text())
        prov = record.get("provenance", {})
        if "kind" not in record or prov.get("process_age_s") is None or record["kind"] == "scaleout":
            continue
        key = (record["kind"], prov["process_start_time"], prov.get("hostname"))
        per_process[key].append((prov["process_age_s"], record))
    spans = defaultdict(list)  # group -> (start, stop) of each record's share
    intervals = []
    for (_, start, _), rows in per_process.items():
        rows.sort(key=lambda row: row[0])
        t0, before = _parse_time(start), 0.0
        for age, record in rows:
            spans[group_of(record)].append((t0 + timedelta(seconds=before), t0 + timedelta(seconds=age)))
            before = age
        intervals.append((t0, t0 + timedelta(seconds=before)))
    # processes of one group can overlap (the compile job's cells compile side by side): count
    # their time once, as the report header does
    seconds = {group: _union_s(group_spans) for group, group_spans in spans.items()}
    intervals.sort()
    gaps, end = 0.0, None
    for start, stop in intervals:
        gap = 0.0 if end is None else (start - end).total_seconds()
        if 0 < gap <= PAUSE_S:
            gaps += gap
        end = stop if end is None else max(end, stop)
    return seconds, gaps, len(per_process)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("devices", nargs="+", help="device slugs under results/")
    args = parser.parse_args()
    for device in args.devices:
        seconds, gaps, processes = breakdown(device)
        if not seconds:
            raise SystemExit(f"no records with process times under results/{device}/")
        print(f"## {device}: {processes} cell processes\n")
        print("| group | asked by | minutes |")
        print("|---|---|---:|")
        for (group, who), s in sorted(seconds.items(), key=lambda item: -item[1]):
            print(f"| {group} | {who} | {s / 60:.2f} |")
        totals = defaultdict(float)
        for (_, who), s in seconds.items():
            totals[who] += s
        print()
        for who, s in sorted(totals.items(), key=lambda item: -item[1]):
            print(f"- {who}: {s / 60:.1f} min")
        print(f"- gaps between cell processes (under {PAUSE_S:.0f} s each): {gaps / 60:.1f} min\n")


if __name__ == "__main__":
    main()
