"""Out of memory as an outcome: run one part of a cell, and say what ran out if it did.

An out-of-memory error is an answer (the configuration does not fit), so every kind of
measurement catches it, and only it, around each part of a cell, and keeps what the other parts
measured (``record.PartialOutOfMemory``). ``capture_oom`` is that try/except, written once:

    oom = capture_oom(lambda: metrics.update(measure_training(...)), device)
    if oom:
        failures.append(f"training step: {oom.first_line}")

It returns outside the ``except`` block, so the failing frames and the tensors they hold are
gone when the caller frees memory. Any other error propagates with its traceback.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from lmperf.core.record import is_out_of_memory
from lmperf.core.units import GIB, KIB, MIB

_SIZE = r"([\d.]+) (GiB|MiB|KiB|bytes|B)\b"
_BYTES_PER = {"GiB": GIB, "MiB": MIB, "KiB": KIB, "bytes": 1, "B": 1}
_MESSAGE_FIELDS = {
    "oom_requested_mib": r"Tried to allocate " + _SIZE,
    "oom_total_capacity_mib": r"total capacity of " + _SIZE,
    "oom_free_mib": r"of which " + _SIZE + " is free",
    "oom_allocated_by_pytorch_mib": _SIZE + " is allocated by PyTorch",
}


@dataclass(frozen=True)
class OutOfMemory:
    """What an out-of-memory error said, kept without its traceback."""

    error_type: str
    message: str
    allocated_when_caught_bytes: int | None = None  # CUDA only: torch.cuda.memory_allocated in the except block

    @property
    def first_line(self) -> str:
        return self.message.splitlines()[0] if self.message else self.error_type

    @property
    def reason(self) -> str:
        """'OutOfMemoryError: CUDA out of memory. Tried to allocate …' (the first line)."""
        return f"{self.error_type}: {self.first_line}"


def capture_oom(part: Callable[[], object], device=None) -> OutOfMemory | None:
    """Run ``part()``; None if it returned, an ``OutOfMemory`` if it ran out of memory.

    Any other exception propagates. With a CUDA ``device``, the memory still allocated while the
    failing frames hold their tensors is noted too.
    """
    try:
        part()
        return None
    except Exception as exc:  # noqa: BLE001 - only out of memory is an outcome; the rest re-raises
        if not is_out_of_memory(exc):
            raise
        allocated = None
        if device is not None and device.type == "cuda":
            import torch

            allocated = torch.cuda.memory_allocated(device)
        return OutOfMemory(type(exc).__name__, str(exc), allocated)


def parse_oom_message(message: str) -> dict:
    """The allocator's numbers from a CUDA out-of-memory message, in MiB (absent ones omitted)."""
    out = {}
    for key, pattern in _MESSAGE_FIELDS.items():
        match = re.search(pattern, message)
        if match:
            out[key] = float(match.group(1)) * _BYTES_PER[match.group(2)] / MIB
    return out
