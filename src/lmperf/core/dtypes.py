"""The one map from a precision's name (``fp32``, ``bf16``, …) to its torch dtype, and autocast by name."""

from __future__ import annotations

import contextlib

import torch

# tf32: float32 tensors with TF32 matmuls allowed (torch.backends.cuda.matmul.allow_tf32); the element type is float32
DTYPES = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
# dtype -> name, read backwards so that a dtype's first name in DTYPES wins (float32 is "fp32", not "tf32")
_NAMES = {dtype: name for name, dtype in reversed(DTYPES.items())}


def torch_dtype(precision: str) -> torch.dtype:
    """'bf16' -> torch.bfloat16; an unknown name raises with the known ones."""
    if precision not in DTYPES:
        raise ValueError(f"unknown precision {precision!r}; known: {sorted(DTYPES)}")
    return DTYPES[precision]


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> 'bf16'; dtypes without a short name keep torch's ('int64')."""
    return _NAMES.get(dtype, str(dtype).replace("torch.", ""))


def autocast(device: torch.device, precision: str):
    """Mixed precision for bf16/fp16 (``torch.autocast``: fp32 parameters, low-precision matmuls); nothing for fp32."""
    dtype = torch_dtype(precision)
    if dtype in (torch.float32, torch.float64):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
