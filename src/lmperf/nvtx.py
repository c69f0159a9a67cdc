"""NVTX ranges that cost nothing unless a profiling cell calls ``enable()``: elsewhere ``range(name)`` is a
no-op, so the model's annotations do not perturb timings."""

from __future__ import annotations

import contextlib

import torch

_enabled = False


def enable(on: bool = True) -> None:
    global _enabled
    _enabled = on and torch.cuda.is_available()


def is_enabled() -> bool:
    return _enabled


def range(name: str):  # noqa: A001 - mirrors torch.cuda.nvtx.range
    if _enabled:
        return torch.cuda.nvtx.range(name)
    return contextlib.nullcontext()
