"""The front page's **Across devices** section (each kind's ``compare``: a row and a fold per kind) and
the report header's measured time, from records (no torch)."""

from __future__ import annotations

import datetime as dt
import importlib
import statistics
from pathlib import Path

from lmperf.core.record import load_record
from lmperf.core.stats import SAME_MARGIN
from lmperf.kinds import RECORD_FOLDERS
from lmperf.report.common import details, md_table, record_paths, times
from lmperf.report.compare import Comparison, compared_cell

# The kinds compared across devices, each with the module that holds its ``compare``.
COMPARE_MODULES = {k: f"lmperf.kinds.{k}.compare" for k in ("e2e", "nsys", "memory", "attention", "flash", "ladder")}


def package_of(record: dict) -> str:
    return RECORD_FOLDERS.get(record["kind"], record["kind"])


def against(by_device: dict[str, list[dict]], reference: str, other: str) -> list[str]:
    """``other`` against ``reference``: each kind's ``compare`` as a row of a summary table, then a fold per
    kind with the kind's table."""
    found: list[Comparison] = []
    for kind, module in COMPARE_MODULES.items():
        mine = {d: [r for r in by_device.get(d, []) if package_of(r) == kind] for d in (reference, other)}
        found.append(importlib.import_module(module).compare(mine))
    columns = ["kind", "compared", "cells", f"`{other}` / `{reference}`", "interval from", "verdict", "evidence"]
    rows = [(c.kind, c.what, c.cells, times(c.ratio), c.interval, c.verdict, c.evidence) for c in found]
    tabled = [c for c in found if c.table is not None and not c.table.empty]
    folds = "\n".join(details(f"{c.kind}: {c.what}, {c.cells} cells", md_table(c.table)) + "\n" for c in tabled)
    return [f"### `{other}` against `{reference}`", "", md_table(rows, columns), folds]


def code_sentence(by_device: dict[str, list[dict]], devices: list[str]) -> str:
    """Whether the shared cells ran the same code on every device: a record's code version is the hash
    of the code its cell ran (``lmperf.core.fingerprint``), so equal versions are the same code; ''
    when no cell is shared."""
    cells = {
        d: {(r["kind"], compared_cell(r)): r for r in by_device.get(d, []) if package_of(r) in COMPARE_MODULES}
        for d in devices
    }
    shared = ([cells[d][key] for d in devices if key in cells[d]] for key in set.union(*map(set, cells.values())))
    versions = [{r["provenance"].get("code_version") for r in recs} for recs in shared if len(recs) > 1]
    if not versions:
        return ""
    differ = sum(None in v or len(v) > 1 for v in versions)
    if not differ:
        return "Every compared cell ran the same code on each device.\n"
    return (
        f"**{differ} of {len(versions)} compared cells ran different code on different devices**: their ratios compare "
        "code as well as devices; each device's report header lists its records measured with older code.\n"
    )


def across_devices(results_root: Path, reference: str, report_dir: Path | None = None) -> str:
    """``reference`` against each other device under ``results_root`` (never a CPU run); ``report_dir``
    adds links to each device's report."""
    folders = (d for d in sorted(Path(results_root).iterdir()) if d.name != "cpu" or d.name == reference)
    by_device = {d.name: [load_record(p) for p in paths] for d in folders if (paths := record_paths(d))}
    devices = [reference] + sorted(d for d in by_device if d != reference)
    lines = ["## Across devices", ""]
    if report_dir is not None:
        lines += ["Each device's own report: " + ", ".join(f"[`{d}`]({d}/answers.md)" for d in devices) + ".", ""]
    if len(devices) < 2:
        return "\n".join(lines + [f"_Only `{reference}` has records under `results/`; nothing to compare yet._\n"])
    lines.append(
        "Per kind, the ratio of the other device's number to this one's (under 1: the other device takes less "
        "time), the median over the cells measured on both, with its 95% interval: from the cells' trials where "
        "the records have them, else a bootstrap over the cells, or their range below five (their spread, not a "
        "trial interval). A device is "
        f"faster or slower only where that interval lies more than {100 * SAME_MARGIN:.0f}% from 1; what bounds "
        "the cells comes from what they do (how the time grows with the work, kernel classes, memory).\n"
    )
    code = code_sentence(by_device, devices)
    lines += [code] if code else []
    for other in devices[1:]:
        lines += against(by_device, reference, other)
    return "\n".join(lines)


def _union_s(intervals: list[tuple[dt.datetime, dt.datetime]]) -> float:
    """Seconds covered by the intervals, overlaps counted once."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        begin = start if end is None else max(start, end)
        if stop >= begin:
            total, end = total + (stop - begin).total_seconds(), stop
    return total


def header_time(records: list[dict]) -> dict:
    """One device's measured time: its cell processes from start to last record, those that ran at once
    counted once, in all and per kind; records without process times; e2e's median start-up."""
    ends: dict[tuple, tuple[str, float]] = {}
    untimed = 0
    for r in records:
        prov = r["provenance"]
        if not prov.get("process_start_time") or prov.get("process_age_s") is None:
            untimed += 1
        else:
            key = (prov.get("hostname"), prov["process_start_time"], r["kind"])
            ends[key] = (package_of(r), max(prov["process_age_s"], ends.get(key, ("", 0.0))[1]))
    intervals: dict[str, list[tuple[dt.datetime, dt.datetime]]] = {}
    for (_, start, _), (kind, age) in ends.items():
        began = dt.datetime.fromisoformat(start)
        intervals.setdefault(kind, []).append((began, began + dt.timedelta(seconds=age)))
    every = [i for kind in intervals.values() for i in kind]
    e2e = [(r.get("metrics") or {}).get("process_start_to_first_step_s") for r in records if r["kind"] == "e2e"]
    startup = [s for s in e2e if s is not None]
    # a merged record's provenance is its first trial's: the later trials' processes are not in the records
    merged = [len((r.get("metrics") or {}).get("trials") or []) for r in records]
    return {
        "total_s": _union_s(every) if every else None,
        "per_kind_s": {kind: _union_s(v) for kind, v in sorted(intervals.items())},
        "processes": len(ends),
        "untimed_records": untimed,
        "merged_records": sum(k > 1 for k in merged),
        "later_trials": sum(k - 1 for k in merged if k > 1),
        "startup_median_s": statistics.median(startup) if startup else None,
        "startup_n": len(startup),
    }


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def timing_lines(records: list[dict]) -> list[str]:
    """The header's lines from ``header_time``: the measured time in all and per kind, the start-up."""
    t = header_time(records)
    if t["total_s"] is None:
        lines = ["- Measured time: not recorded (these records carry no process times)"]
    else:
        kinds = ", ".join(f"{k} {_minutes(s)}" for k, s in sorted(t["per_kind_s"].items(), key=lambda kv: -kv[1]))
        first = "first-trial " if t["later_trials"] else ""
        lines = [
            f"- Measured time: {_minutes(t['total_s'])} of {first}cell processes ({t['processes']} processes, "
            f"those that ran at once counted once); per kind: {kinds}"
            + (f"; {t['untimed_records']} records carry no process times" if t["untimed_records"] else "")
            + (
                f"; a merged record keeps its first trial's process time only, so the {t['later_trials']} later "
                f"trials of its {t['merged_records']} merged records are not in this figure"
                if t["later_trials"]
                else ""
            )
        ]
    if t["startup_median_s"] is not None:
        lines.append(
            f"- Per-cell start-up (e2e, process start → first step): median {t['startup_median_s']:.1f} s "
            f"over {t['startup_n']} cells"
        )
    return lines
