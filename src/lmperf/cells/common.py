"""What every cell CLI shares: the standard arguments, process start time, freeing memory, and
turning an attention implementation that cannot run here into an ``unsupported`` record.

The measuring harness itself: ``lmperf.timing`` (timers, pass budgets), ``lmperf.oom`` (out of
memory as an outcome), ``lmperf.dtypes`` (precision names, autocast), ``lmperf.units``,
``lmperf.flops.tflops_per_s``.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from lmperf import attention
from lmperf.cells.lifetime import die_with_parent, forked_cell
from lmperf.device import process_age_s, process_clock  # noqa: F401 - the cells' names for them
from lmperf.record import Unsupported


def base_parser(description: str) -> argparse.ArgumentParser:
    # every cell builds its parser first thing: the one place that runs at each cell's start (a cell
    # the fork server forked is ended by the server when its client, which dies with Snakemake, goes)
    if not forked_cell():
        die_with_parent()
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
