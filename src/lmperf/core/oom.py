"""Out of memory as an outcome: ``capture_oom`` runs one part of a cell and says what ran out, if it did.

It returns outside the ``except`` block, so the failing frames and their tensors are gone when the
caller frees memory; any other error propagates.
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
    error_type: str
    message: str
    allocated_when_caught_bytes: int | None = None  # CUDA only: torch.cuda.memory_allocated in the except block

    @property
    def first_line(self) -> str:
        return self.message.splitlines()[0] if self.message else self.error_type

    @property
    def reason(self) -> str:
        return f"{self.error_type}: {self.first_line}"


def capture_oom(part: Callable[[], object], device=None) -> OutOfMemory | None:
    """Run ``part()``: None, or the ``OutOfMemory`` it raised (with a CUDA ``device``, and the memory
    still allocated while its frames hold their tensors)."""
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
