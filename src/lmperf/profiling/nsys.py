"""Nsight Systems: find ``nsys``, profile a command, export the report to SQLite and read it.

The profile (docs/ARCHITECTURE.md, the nsys kind): ``nsys profile -t cuda,nvtx -s none --cpuctxsw=none`` with the
capture limited to the program's ``cudaProfilerStart``/``cudaProfilerStop`` pair
(``-c cudaProfilerApi --capture-range-end=stop``: the default, ``stop-shutdown``, would kill the
program at the stop, before it writes its results). The report is exported with
``nsys export --type sqlite`` and read with ``sqlite3``:

- ``CUPTI_ACTIVITY_KIND_KERNEL``: GPU start/end, ``correlationId``, name ids into ``StringIds``;
- ``CUPTI_ACTIVITY_KIND_RUNTIME``: the CUDA runtime calls, whose ``correlationId`` names the
  kernel each launch call started — its CPU ``start`` is the kernel's launch time;
- ``NVTX_EVENTS``: push/pop and start/end ranges (``text`` or ``textId``), on any thread.

Every failure of ``nsys`` raises ``NsysError`` carrying its exit status and stderr.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from lmperf.profiling.phases import Kernel, Range, Trace

PROFILE_OPTIONS = [
    "-t",
    "cuda,nvtx",
    "-s",
    "none",
    "--cpuctxsw=none",
    "-c",
    "cudaProfilerApi",
    "--capture-range-end=stop",
]
KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX_TABLE = "NVTX_EVENTS"
_TID_BITS = 24  # globalTid = (vm << 56) | (pid << 24) | tid; globalPid = globalTid with tid zeroed


class NsysError(RuntimeError):
    """nsys is missing, failed, or wrote a report that holds no kernels."""


def find_nsys(configured: str | None = None) -> str | None:
    """The nsys executable: the configured path (must exist) or ``nsys`` on PATH, else None."""
    if configured:
        path = Path(configured).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise NsysError(f"configured nsys_path {configured!r} is not an executable file")
        return str(path)
    return shutil.which("nsys")


def run(cmd: list[str], what: str, echo=None) -> subprocess.CompletedProcess:
    """Run an nsys command; its output goes to ``echo`` (stderr: the rule's log); non-zero exit raises."""
    echo = echo or sys.stderr
    print(f"[nsys] $ {' '.join(map(str, cmd))}", file=echo, flush=True)
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True)
    if proc.stdout:
        echo.write(proc.stdout)
    if proc.stderr:
        echo.write(proc.stderr)
    echo.flush()
    if proc.returncode != 0:
        raise NsysError(
            f"{what} failed with exit status {proc.returncode}: {' '.join(map(str, cmd))}\n"
            f"--- stderr ---\n{proc.stderr.strip()[-6000:] or '(empty)'}\n"
            f"--- stdout (tail) ---\n{proc.stdout.strip()[-2000:] or '(empty)'}"
        )
    return proc


def version(nsys: str) -> str:
    proc = subprocess.run([nsys, "--version"], capture_output=True, text=True)
    return (proc.stdout or proc.stderr).strip().splitlines()[-1] if proc.returncode == 0 else "unknown"


def profile_options(ranges: int = 1) -> list[str]:
    """PROFILE_OPTIONS; ``ranges`` > 1: up to that many capture ranges (cudaProfilerStart/Stop
    pairs), each its own report (``--capture-range-end=repeat:<ranges>``)."""
    options = list(PROFILE_OPTIONS)
    if ranges > 1:
        options[options.index("--capture-range-end=stop")] = f"--capture-range-end=repeat:{ranges}"
    return options


def profile_command(nsys: str, output_base: Path, app_argv: list[str], ranges: int = 1) -> list[str]:
    return [nsys, "profile", *profile_options(ranges), "-o", str(output_base), "--force-overwrite", "true", *app_argv]


def _range_number(path: Path) -> int:
    """The capture range a report of ``--capture-range-end=repeat`` holds: the last number in its name."""
    numbers = re.findall(r"\d+", path.name.removesuffix(".nsys-rep"))
    return int(numbers[-1]) if numbers else 0


def profile_ranges(nsys: str, output_base: Path, app_argv: list[str], ranges: int) -> list[Path]:
    """Profile ``app_argv``, which opens up to ``ranges`` capture ranges one after another, one report
    each; returns the reports in the order of their ranges (the caller checks their number against the
    ranges the app opened), renamed ``<output_base>.range<i>.nsys-rep`` (i from 1). nsys names them
    after the base with the range's number; the ones this run wrote are told apart from older files
    by their time. One range: `profile`, its report ``<output_base>.nsys-rep``."""
    if ranges == 1:
        return [profile(nsys, output_base, app_argv)]
    output_base = Path(output_base)
    output_base.parent.mkdir(parents=True, exist_ok=True)
    stem = output_base.name.split(".", 1)[0]
    started = time.time()
    proc = run(profile_command(nsys, output_base, app_argv, ranges), "nsys profile")
    written = sorted(
        (p for p in output_base.parent.glob(f"{stem}*.nsys-rep") if p.stat().st_mtime >= started - 1),
        key=lambda p: (_range_number(p), p.stat().st_mtime),
    )
    if not written:
        raise NsysError(
            f"nsys profile with up to {ranges} capture ranges wrote no report beside {output_base}\n"
            f"--- stderr ---\n{proc.stderr.strip()[-6000:] or '(empty)'}"
        )
    reports = []
    for i, path in enumerate(written, start=1):
        target = output_base.with_name(f"{output_base.name}.range{i}.nsys-rep")
        if path != target:
            path.replace(target)
        reports.append(target)
    return reports


def profile(nsys: str, output_base: Path, app_argv: list[str]) -> Path:
    """Profile ``app_argv``; returns the ``.nsys-rep`` path (``output_base`` + suffix)."""
    output_base = Path(output_base)
    output_base.parent.mkdir(parents=True, exist_ok=True)
    report = output_base.with_name(output_base.name + ".nsys-rep")
    report.unlink(missing_ok=True)
    started = time.time()
    proc = run(profile_command(nsys, output_base, app_argv), "nsys profile")
    if not report.is_file():
        # A base name with a dot in it (``2.7B_fp32``) might be taken for one with an extension:
        # take the report this run wrote under the name's first part.
        stem = output_base.name.split(".", 1)[0]
        written = sorted(
            (p for p in output_base.parent.glob(f"{stem}*.nsys-rep") if p.stat().st_mtime >= started - 1),
            key=lambda p: p.stat().st_mtime,
        )
        if written:
            written[-1].replace(report)
    if not report.is_file():
        raise NsysError(
            f"nsys profile exited 0 but wrote no report at {report}\n--- stderr ---\n"
            f"{proc.stderr.strip()[-6000:] or '(empty)'}"
        )
    return report


def export_sqlite(nsys: str, report: Path, sqlite_path: Path) -> Path:
    """``nsys export --type sqlite``; where that subcommand fails, ``nsys stats`` (which writes
    the .sqlite beside the report as a side effect)."""
    report, sqlite_path = Path(report), Path(sqlite_path)
    sqlite_path.unlink(missing_ok=True)
    try:
        run(
            [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", sqlite_path, report],
            "nsys export",
        )
    except NsysError as first:
        beside = report.with_suffix(".sqlite")
        try:
            run(
                [
                    nsys,
                    "stats",
                    "--force-export",
                    "true",
                    "--report",
                    "cuda_gpu_kern_sum",
                    "--format",
                    "csv",
                    "--output",
                    report.with_suffix(""),
                    report,
                ],
                "nsys stats",
            )
        except NsysError as second:
            raise NsysError(f"{first}\n\nand the fallback:\n{second}") from None
        if beside != sqlite_path and beside.is_file():
            beside.replace(sqlite_path)
    if not sqlite_path.is_file():
        raise NsysError(f"nsys wrote no SQLite export at {sqlite_path}")
    return sqlite_path


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in con.execute(f"PRAGMA table_info({table})")}


def read_sqlite(path: str | os.PathLike) -> Trace:
    """Kernels (with launch times from the runtime API) and NVTX ranges of an nsys SQLite export."""
    con = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True)
    try:
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if KERNEL_TABLE not in tables:
            raise NsysError(
                f"{path}: no {KERNEL_TABLE} table — the capture recorded no CUDA kernel "
                "(was cudaProfilerStart reached, with -t cuda?)"
            )
        strings = dict(con.execute("SELECT id, value FROM StringIds")) if "StringIds" in tables else {}
        kcols = _columns(con, KERNEL_TABLE)
        name_col = "demangledName" if "demangledName" in kcols else "shortName"
        short_col = "shortName" if "shortName" in kcols else name_col
        pid_col = "globalPid" if "globalPid" in kcols else "NULL"
        rows = con.execute(
            f'SELECT start, "end", correlationId, {name_col}, {short_col}, {pid_col} FROM {KERNEL_TABLE} ORDER BY start'
        ).fetchall()
        launches: dict[tuple, int] = {}
        launches_any: dict[int, int] = {}
        if RUNTIME_TABLE in tables:
            for corr, start, gtid in con.execute(f"SELECT correlationId, start, globalTid FROM {RUNTIME_TABLE}"):
                launches[(corr, None if gtid is None else gtid >> _TID_BITS)] = start
                launches_any.setdefault(corr, start)
        kernels = []
        for start, end, corr, name_id, short_id, gpid in rows:
            name = strings.get(name_id, str(name_id))
            short = strings.get(short_id, "") if short_id is not None else ""
            launch = launches.get((corr, None if gpid is None else gpid >> _TID_BITS), launches_any.get(corr))
            kernels.append(
                Kernel(
                    name=name,
                    short_name=short,
                    start_ns=start,
                    end_ns=end,
                    launch_ns=launch if launch is not None else start,
                    launch_known=launch is not None,
                )
            )
        ranges = []
        if NVTX_TABLE in tables:
            ncols = _columns(con, NVTX_TABLE)
            text_id = "textId" if "textId" in ncols else "NULL"
            tid = "globalTid" if "globalTid" in ncols else "NULL"
            for start, end, text, tid_value, gtid in con.execute(
                f'SELECT start, "end", text, {text_id}, {tid} FROM {NVTX_TABLE} '
                f'WHERE "end" IS NOT NULL AND "end" >= start'
            ):
                name = text if text is not None else strings.get(tid_value)
                if name is not None:
                    ranges.append(Range(name=name, start_ns=start, end_ns=end, thread=gtid))
        return Trace(
            kernels=kernels,
            ranges=ranges,
            source="nsys",
            notes={
                "kernels": len(kernels),
                "kernels_without_runtime_launch": sum(1 for k in kernels if not k.launch_known),
                "nvtx_ranges": len(ranges),
            },
        )
    finally:
        con.close()
