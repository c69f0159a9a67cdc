"""What every cell CLI shares: the standard arguments, process start time, freeing memory, and
turning an attention implementation that cannot run here into an ``unsupported`` record.

The measuring harness itself: ``lmperf.core.timing`` (timers, pass budgets), ``lmperf.core.oom`` (out of
memory as an outcome), ``lmperf.core.dtypes`` (precision names, autocast), ``lmperf.core.units``,
``lmperf.core.flops.tflops_per_s``.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from lmperf import attention
from lmperf.core.device import process_age_s, process_clock  # noqa: F401 - the cells' names for them
from lmperf.core.record import Unsupported


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--output", required=True, help="record path, results/<device>/<kind>/<cell>.json")
    parser.add_argument("--device", required=True, help="device slug the output path names (cpu, h100, …)")
    return parser


@contextlib.contextmanager
def unavailable_as_unsupported():
    """An attention implementation that cannot run here (``attention.Unavailable``) ends the cell as
    an ``unsupported`` record, with the implementation's reason."""
    try:
        yield
    except attention.Unavailable as exc:
        raise Unsupported(str(exc)) from exc


def free_memory(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
