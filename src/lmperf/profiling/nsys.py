"""Nsight Systems: find ``nsys``, profile a command over its ``cudaProfilerStart``/``Stop`` ranges (a
report each), export to SQLite and read kernels, the launching runtime calls and NVTX ranges from it.
A failure raises ``NsysError``.
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

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
_TID_BITS = 24  # globalTid = (vm << 56) | (pid << 24) | tid: >> 24 leaves the process


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


def run(cmd: list, what: str) -> subprocess.CompletedProcess:
    """Run an nsys command, its output echoed to stderr (the rule's log); a non-zero exit raises."""
    cmd = list(map(str, cmd))
    print(f"[nsys] $ {' '.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(proc.stdout + proc.stderr)
    sys.stderr.flush()
    if proc.returncode != 0:
        raise NsysError(f"{what} failed with exit status {proc.returncode}: {' '.join(cmd)}\n{_stderr_tail(proc)}")
    return proc


def _stderr_tail(proc: subprocess.CompletedProcess) -> str:
    return f"--- stderr ---\n{proc.stderr.strip()[-6000:] or '(empty)'}"


def version(nsys: str) -> str:
    proc = subprocess.run([nsys, "--version"], capture_output=True, text=True)
    return (proc.stdout or proc.stderr).strip().splitlines()[-1] if proc.returncode == 0 else "unknown"


def profile_options(ranges: int = 1) -> list[str]:
    end = "stop" if ranges == 1 else f"repeat:{ranges}"
    return ["-t", "cuda,nvtx", "-s", "none", "--cpuctxsw=none", "-c", "cudaProfilerApi", f"--capture-range-end={end}"]


def _range_number(path: Path) -> int:
    """The capture range a report of ``--capture-range-end=repeat`` holds: the last number in its name."""
    numbers = re.findall(r"\d+", path.name.removesuffix(".nsys-rep"))
    return int(numbers[-1]) if numbers else 0


def profile_ranges(nsys: str, output_base: Path, app_argv: list[str], ranges: int) -> list[Path]:
    """Profile ``app_argv``, which opens up to ``ranges`` capture ranges; the reports in range order (nsys
    names them after the base's first part when it has a dot: those newer than the run's start)."""
    output_base = Path(output_base)
    output_base.parent.mkdir(parents=True, exist_ok=True)
    stem = output_base.name.split(".", 1)[0]
    started = time.time()
    cmd = [nsys, "profile", *profile_options(ranges), "-o", output_base, "--force-overwrite", "true", *app_argv]
    proc = run(cmd, "nsys profile")
    written = sorted(
        (p for p in output_base.parent.glob(f"{stem}*.nsys-rep") if p.stat().st_mtime >= started - 1),
        key=lambda p: (_range_number(p), p.stat().st_mtime),
    )
    if not written:
        raise NsysError(f"nsys profile exited 0 but wrote no report beside {output_base}\n{_stderr_tail(proc)}")
    if ranges == 1:
        written = written[-1:]
    reports = []
    for i, path in enumerate(written, start=1):
        suffix = ".nsys-rep" if ranges == 1 else f".range{i}.nsys-rep"
        reports.append(path.replace(output_base.with_name(output_base.name + suffix)))
    return reports


def profile(nsys: str, output_base: Path, app_argv: list[str]) -> Path:
    """Profile ``app_argv`` with one capture range; returns ``<output_base>.nsys-rep``."""
    return profile_ranges(nsys, output_base, app_argv, 1)[0]


def export_sqlite(nsys: str, report: Path, sqlite_path: Path) -> Path:
    """``nsys export --type sqlite`` of ``report`` to ``sqlite_path``."""
    Path(sqlite_path).unlink(missing_ok=True)
    run(
        [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", sqlite_path, report],
        "nsys export",
    )
    if not Path(sqlite_path).is_file():
        raise NsysError(f"nsys wrote no SQLite export at {sqlite_path}")
    return Path(sqlite_path)


def _column(con: sqlite3.Connection, table: str, *names: str) -> str:
    """The first of ``names`` that ``table`` has (NULL where none): the schema differs across nsys versions."""
    have = {row[1] for row in con.execute(f"PRAGMA table_info({table})")}
    return next((n for n in names if n in have), "NULL")


def read_sqlite(path: str | os.PathLike) -> Trace:
    """Kernels (with launch times from the runtime API) and NVTX ranges of an nsys SQLite export."""
    con = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True)
    try:
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if KERNEL_TABLE not in tables:
            raise NsysError(f"{path}: no {KERNEL_TABLE} table — the capture recorded no CUDA kernel")
        strings = dict(con.execute("SELECT id, value FROM StringIds")) if "StringIds" in tables else {}
        name, short = _column(con, KERNEL_TABLE, "demangledName", "shortName"), _column(con, KERNEL_TABLE, "shortName")
        pid = _column(con, KERNEL_TABLE, "globalPid")
        launches: dict[tuple, int] = {}
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
            for corr, start, gtid in con.execute(
                "SELECT correlationId, start, globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME"
            ):
                launches[(corr, None if gtid is None else gtid >> _TID_BITS)] = start
                launches.setdefault((corr, "any"), start)
        kernels = []
        query = f'SELECT start, "end", correlationId, {name}, {short}, {pid} FROM {KERNEL_TABLE} ORDER BY start'
        for start, end, corr, name_id, short_id, gpid in con.execute(query):
            launch = launches.get((corr, None if gpid is None else gpid >> _TID_BITS), launches.get((corr, "any")))
            known = launch is not None
            full_name, short_name = strings.get(name_id, str(name_id)), strings.get(short_id, "")
            kernels.append(Kernel(full_name, start, end, launch if known else start, short_name, launch_known=known))
        ranges = []
        if "NVTX_EVENTS" in tables:
            text_id, tid = _column(con, "NVTX_EVENTS", "textId"), _column(con, "NVTX_EVENTS", "globalTid")
            query = f'SELECT start, "end", text, {text_id}, {tid} FROM NVTX_EVENTS WHERE "end" >= start'
            for start, end, text, text_id_value, gtid in con.execute(query):
                text = text if text is not None else strings.get(text_id_value)
                if text is not None:
                    ranges.append(Range(text, start, end, gtid))
    finally:
        con.close()
    notes = {"kernels": len(kernels), "kernels_without_runtime_launch": sum(not k.launch_known for k in kernels)}
    return Trace(kernels, ranges, "nsys", notes | {"nvtx_ranges": len(ranges)})
