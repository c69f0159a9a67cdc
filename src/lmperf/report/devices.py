"""Devices side by side, and each device's measured time: pure functions over records (no torch).

``across_devices`` is the **Across devices** section of the front page (``report/answers.md``): for
each kind, its ``compare`` (``lmperf.kinds.<kind>.compare``) over the cells measured on the report's
device and on each other device under ``results/`` — one row per kind (the ratio with its interval,
a verdict and its evidence) and a fold with the kind's small table.

``header_time`` gives the report header each device's measured time: the time its cell processes
ran (from the provenance every record carries: ``process_start_time``, ``process_age_s``), in all
and per kind, and e2e's median start-up.
"""

from __future__ import annotations

import datetime as dt
import glob
import importlib
import statistics
from pathlib import Path

import pandas as pd

from lmperf.core.record import load_record
from lmperf.core.stats import SAME_MARGIN
from lmperf.report.compare import (  # noqa: F401 - LAUNCH_BOUND_GROWTH and attention_of: kinds' reports read them here
    LAUNCH_BOUND_GROWTH,
    Comparison,
    attention_of,
    compared_cell,
    fmt_ratio,
    markdown_table,
)

SAME = SAME_MARGIN  # two numbers are "the same" when their ratio's interval reaches into 1 ± this
# The kinds compared across devices, each with the module that holds its ``compare``.
COMPARE_MODULES = {
    "e2e": "lmperf.kinds.e2e.compare",
    "nsys": "lmperf.kinds.nsys.compare",
    "memory": "lmperf.kinds.memory.compare",
    "attention": "lmperf.kinds.attention.compare",
    "flash": "lmperf.kinds.flash.compare",
    "ladder": "lmperf.kinds.ladder.compare",
}
# Record kinds written by another kind's package (their records belong to that kind).
PACKAGE_OF = {"e2e_compile": "e2e", "gemm_peak": "ladder", "ladder_profile": "ladder"}


def package_of(record: dict) -> str:
    return PACKAGE_OF.get(record["kind"], record["kind"])


def device_record_paths(results_root: Path) -> dict[str, list[str]]:
    """Record paths per device slug, results/<device>/<kind>/*.json (devices in name order)."""
    out = {}
    for directory in sorted(p for p in Path(results_root).iterdir() if p.is_dir()):
        paths = sorted(glob.glob(str(directory / "*" / "*.json")))
        if paths:
            out[directory.name] = paths
    return out


def device_records(results_root: Path) -> dict[str, list[dict]]:
    """Records per device slug (devices in name order)."""
    return {d: [load_record(p) for p in paths] for d, paths in device_record_paths(results_root).items()}


def comparisons(by_device: dict[str, list[dict]], reference: str, other: str) -> list[Comparison]:
    """Every compared kind's Comparison of ``other`` against ``reference``."""
    out = []
    for kind, module in COMPARE_MODULES.items():
        mine = {d: [r for r in by_device.get(d, []) if package_of(r) == kind] for d in (reference, other)}
        out.append(importlib.import_module(module).compare(mine))
    return out


def summary(found: list[Comparison], reference: str, other: str) -> str:
    """One row per kind: what is compared, cells, the ratio with its interval, verdict, evidence."""
    rows = [
        {
            "kind": c.kind,
            "compared": c.what,
            "cells": c.cells,
            f"`{other}` / `{reference}`": fmt_ratio(c.ratio),
            "interval from": c.interval,
            "verdict": c.verdict,
            "evidence": c.evidence,
        }
        for c in found
    ]
    return markdown_table(pd.DataFrame(rows))


def folds(found: list[Comparison]) -> str:
    parts = []
    for c in found:
        if c.table is not None and not c.table.empty:
            parts.append(
                f"<details><summary>{c.kind}: {c.what}, {c.cells} cells</summary>\n\n{markdown_table(c.table)}\n</details>\n"
            )
    return "\n".join(parts)


def cell_id(record: dict) -> tuple[str, str]:
    return record["kind"], compared_cell(record)


def code_sentence(by_device: dict[str, list[dict]], devices: list[str], stale: set[tuple] = frozenset()) -> str:
    """Whether the compared cells ran the same code on every device: two records did when their code
    versions are equal, or neither is stale ((device, *cell_id) of records measured with older code
    than the current: both ran the current code). '' when no cell is shared."""
    cells = {d: {cell_id(r): r for r in by_device.get(d, []) if package_of(r) in COMPARE_MODULES} for d in devices}
    total = differ = 0
    for key in set.union(*(set(c) for c in cells.values())):
        present = [d for d in devices if key in cells[d]]
        if len(present) < 2:
            continue
        versions = {cells[d][key]["provenance"].get("code_version") for d in present}
        total += 1
        differ += not ((None not in versions and len(versions) == 1) or not any((d, *key) in stale for d in present))
    if not total:
        return ""
    if not differ:
        return "Every compared cell ran the same code on each device.\n"
    return (
        f"**{differ} of {total} compared cells ran different code on different devices**: their ratios compare "
        "code as well as devices; each device's report header lists its records measured with older code.\n"
    )


def across_devices(
    results_root: Path, reference: str, report_dir: Path | None = None, stale: list[str] | tuple[str, ...] = ()
) -> str:
    """The **Across devices** section: per kind, ``reference`` against each other device under
    ``results_root`` (a local CPU run, results/cpu/, is no device to set beside a GPU). ``report_dir``
    adds links to each device's own report; ``stale``, record paths measured with older code."""
    paths = {d: p for d, p in device_record_paths(Path(results_root)).items() if d != "cpu" or d == reference}
    by_device = {d: [load_record(p) for p in device_paths] for d, device_paths in paths.items()}
    stale_paths = {Path(p).resolve() for p in stale}
    stale_cells = {
        (d, *cell_id(record))
        for d, device_paths in paths.items()
        for path, record in zip(device_paths, by_device[d])
        if Path(path).resolve() in stale_paths
    }
    devices = [reference] + sorted(d for d in by_device if d != reference)
    lines = ["## Across devices", ""]
    if report_dir is not None:
        lines += ["Each device's own report: " + ", ".join(f"[`{d}`]({d}/answers.md)" for d in devices) + ".", ""]
    if len(devices) < 2:
        return "\n".join(lines + [f"_Only `{reference}` has records under `results/`; nothing to compare yet._\n"])
    lines.append(
        "Per kind, the ratio of the other device's number to this one's (under 1: the other device takes less "
        "time), the median over the cells measured on both, with its 95% interval: from the cells' trials where "
        "the records have them, else a bootstrap over the cells (their spread, not a trial interval). A device is "
        f"faster or slower only where that interval lies more than {100 * SAME_MARGIN:.0f}% from 1; what bounds "
        "the cells comes from what they do (how the time grows with the work, kernel classes, memory).\n"
    )
    code = code_sentence(by_device, devices, stale_cells)
    lines += [code] if code else []
    for other in devices[1:]:
        found = comparisons(by_device, reference, other)
        lines += [f"### `{other}` against `{reference}`", "", summary(found, reference, other), folds(found)]
    return "\n".join(lines)


def _union_s(intervals: list[tuple[dt.datetime, dt.datetime]]) -> float:
    """Seconds covered by the intervals, overlaps counted once."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total, end = total + (stop - start).total_seconds(), stop
        elif stop > end:
            total, end = total + (stop - end).total_seconds(), stop
    return total


def header_time(records: list[dict]) -> dict:
    """One device's measured time: ``total_s``, the time its cell processes ran (each from its start
    to its last record, ``process_age_s``; processes that ran at once, such as the compile job's,
    counted once), ``per_kind_s`` the same per kind, ``processes`` (``process_sum_s``: their plain
    sum), ``untimed_records`` (without process times), e2e's median start-up over ``startup_n``."""
    ends: dict[tuple, tuple[str, float]] = {}
    untimed = 0
    for r in records:
        prov = r["provenance"]
        if not prov.get("process_start_time") or prov.get("process_age_s") is None:
            untimed += 1
            continue
        key = (prov.get("hostname"), prov["process_start_time"], r["kind"])
        ends[key] = (package_of(r), max(prov["process_age_s"], ends.get(key, ("", 0.0))[1]))
    intervals: dict[str, list[tuple[dt.datetime, dt.datetime]]] = {}
    for (_, start, _), (kind, age) in ends.items():
        began = dt.datetime.fromisoformat(start)
        intervals.setdefault(kind, []).append((began, began + dt.timedelta(seconds=age)))
    every = [i for kind in intervals.values() for i in kind]
    startup = [
        r["metrics"]["process_start_to_first_step_s"]
        for r in records
        if r["kind"] == "e2e" and (r.get("metrics") or {}).get("process_start_to_first_step_s") is not None
    ]
    return {
        "total_s": _union_s(every) if every else None,
        "per_kind_s": {kind: _union_s(v) for kind, v in sorted(intervals.items())},
        "processes": len(ends),
        "process_sum_s": sum(age for _, age in ends.values()),  # the same without counting overlaps once
        "untimed_records": untimed,
        "startup_median_s": statistics.median(startup) if startup else None,
        "startup_n": len(startup),
    }


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def timing_lines(records: list[dict], run_starts=()) -> list[str]:
    """Header lines from ``header_time``: the measured time in all and per kind, and the start-up.
    (``run_starts`` is accepted and unused: the time between runs is no longer accounted.)"""
    t = header_time(records)
    if t["total_s"] is None:
        lines = ["- Measured time: not recorded (these records carry no process times)"]
    else:
        kinds = ", ".join(f"{k} {_minutes(s)}" for k, s in sorted(t["per_kind_s"].items(), key=lambda kv: -kv[1]))
        lines = [
            f"- Measured time: {_minutes(t['total_s'])} of cell processes ({t['processes']} processes, "
            f"those that ran at once counted once); per kind: {kinds}"
            + (f"; {t['untimed_records']} records carry no process times" if t["untimed_records"] else "")
        ]
    if t["startup_median_s"] is not None:
        lines.append(
            f"- Per-cell start-up (e2e, process start → first step): median {t['startup_median_s']:.1f} s "
            f"over {t['startup_n']} cells"
        )
    return lines


def commits_words(records: list[dict]) -> str:
    """', commit `0aa86bc`' or ', commits `0aa86bc` (240), `831eca9` (1)' ('' where none is known)."""
    counts: dict[str, int] = {}
    for r in records:
        commit = r["provenance"].get("git_commit") or "unknown"
        dirty = " (dirty)" if r["provenance"].get("git_dirty") else ""
        counts[commit[:7] + dirty] = counts.get(commit[:7] + dirty, 0) + 1
    if set(counts) == {"unknown"}:
        return ""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(ranked) == 1:
        return f", commit `{ranked[0][0]}`"
    return ", commits " + ", ".join(f"`{c}` ({n})" for c, n in ranked)
