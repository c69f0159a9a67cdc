"""What our Triton kernels multiply float32 inputs in (imports neither torch nor Triton): "tf32x3" (the
default: three TF32 tensor-core products per product, high*high + high*low + low*high; fp32's error at
several times the speed of "ieee", docs/decisions/flash-fp32-products.md) or "ieee" (true float32
products, on the FMA units), by ``LMPERF_FLASH_FP32``; TF32 (one product) is a precision of its own.
"""

from __future__ import annotations

import os

FP32_PRODUCTS = ("tf32x3", "ieee")


def fp32_products() -> str:
    """tl.dot's input_precision for float32 inputs when TF32 is not asked for: "tf32x3" or "ieee"."""
    value = os.environ.get("LMPERF_FLASH_FP32", "tf32x3")
    if value not in FP32_PRODUCTS:
        raise ValueError(f"LMPERF_FLASH_FP32 must be one of {FP32_PRODUCTS}, got {value!r}")
    return value


def dot_precision_for(precision: str, allow_tf32: bool = False) -> str:
    """What our kernels multiply in for a cell of precision `precision` (the records' ``dot_precision``).

    "tf32" (float32 inputs with TF32 matmuls asked for) multiplies in TF32; "fp32" in
    fp32_products() unless `allow_tf32` (torch.backends.cuda.matmul.allow_tf32 where the cell runs)
    turns TF32 on; 16-bit precisions ("bf16", "fp16") run the tensor cores at their own width and
    are returned as they are.
    """
    if precision == "tf32" or (precision == "fp32" and allow_tf32):
        return "tf32"
    if precision == "fp32":
        return fp32_products()
    return precision
