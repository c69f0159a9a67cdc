"""Byte multiples (binary) and the bytes of one element per precision (no torch)."""

from __future__ import annotations

KIB = 2**10
MIB = 2**20
GIB = 2**30

# The precisions cells and reports name, and the bytes of one element of each.
BYTES_PER_ELEMENT = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}  # tf32: float32 tensors
