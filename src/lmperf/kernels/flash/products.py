"""What our Triton kernels multiply float32 inputs in (imports neither torch nor Triton).

"tf32x3" (the default) splits each float32 operand into a TF32 high part and a TF32 low part and
adds three tensor-core products (high*high + high*low + low*high) with fp32 accumulation: on an
H100 its error against float64 matches SDPA's fp32 at several times the speed of "ieee", which
runs `tl.dot` on the FMA units (docs/decisions/flash-fp32-products.md). "ieee" is true IEEE
float32 products. Choose with ``LMPERF_FLASH_FP32``; TF32 (one product) is a precision of its own,
asked for by ``tf32=True`` or ``torch.backends.cuda.matmul.allow_tf32``.
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
