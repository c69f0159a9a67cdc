"""What every cell CLI shares: the standard arguments, process start time, freeing memory, and
turning an attention implementation that cannot run here into an ``unsupported`` record.

The measuring harness itself: ``lmperf.timing`` (timers, pass budgets), ``lmperf.oom`` (out of
memory as an outcome), ``lmperf.dtypes`` (precision names, autocast), ``lmperf.units``,
``lmperf.flops.tflops_per_s``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import torch

from lmperf import attention
from lmperf.record import Unsupported


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--output", required=True, help="record path, results/<device>/<kind>/<cell>.json")
    parser.add_argument("--device", required=True, help="device slug the output path names (cpu, h100, …)")
    return parser


def process_age_s() -> float:
    """Seconds since this process started (from /proc where available, else since import).

    A cell forked by the fork server counts from its client's start (``LMPERF_PROCESS_START``,
    ``<pid>:<epoch seconds>``, honoured only in that pid), so start-up means the same either way.
    """
    started = os.environ.get("LMPERF_PROCESS_START", "")
    pid, _, epoch = started.partition(":")
    if pid == str(os.getpid()) and epoch:
        return time.time() - float(epoch)
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        return uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORT_TIME


_IMPORT_TIME = time.monotonic()


@contextlib.contextmanager
def unavailable_as_unsupported():
    """An attention implementation that cannot run here (``attention.Unavailable``) ends the cell as
    an ``unsupported`` record, with the implementation's reason."""
    try:
        yield
    except attention.Unavailable as exc:
        raise Unsupported(str(exc)) from exc


def process_clock() -> dict:
    """Provenance of a record's wall time: when its cell process started and how long it had run."""
    import datetime as _dt

    age = process_age_s()
    start = _dt.datetime.fromtimestamp(time.time() - age, _dt.timezone.utc)
    return {"process_start_time": start.isoformat(timespec="milliseconds"), "process_age_s": round(age, 3)}


def free_memory(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
