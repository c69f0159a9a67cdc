"""What every cell CLI shares: the standard arguments, process start time, precision contexts."""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import torch

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--output", required=True, help="record path, results/<device>/<kind>/<cell>.json")
    parser.add_argument("--device", required=True, help="device slug the output path names (cpu, h100, …)")
    return parser


def process_age_s() -> float:
    """Seconds since this process started (from /proc where available, else since import)."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        return uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORT_TIME


_IMPORT_TIME = time.monotonic()


def autocast(device: torch.device, precision: str):
    """bf16/fp16 autocast (mixed precision, fp32 parameters) or nothing for fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: {sorted(PRECISIONS)}")
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def free_memory(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
