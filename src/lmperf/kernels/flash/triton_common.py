"""What the Triton FlashAttention-2 kernels share: constants, tile loads and stores, the interpreter.

Every kernel works on BLOCK_D-wide tiles (the head dim's next power of two, at least 16) and masks
the columns past HEAD_DIM (compiled out where they are equal). Whether the kernels run compiled or
in Triton's interpreter is fixed when this module is imported (triton.jit reads TRITON_INTERPRET).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .products import dot_precision_for

LOG2E = 1.4426950408889634  # 1/ln(2): exp(x) == exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): log(x) == log2(x) * LN2 (constexpr: used in kernels)


def block_d(head_dim: int) -> int:
    """The padded tile width of a head dim: the next power of two, at least 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(head_dim))


@triton.jit
def load_tile(ptrs, rows_ok, cols_ok, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    """Load a (rows, BLOCK_D) tile; masked rows and columns read as zero."""
    if MASK_ROWS:
        if MASK_COLS:
            x = tl.load(ptrs, mask=rows_ok[:, None] & cols_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
    else:
        if MASK_COLS:
            x = tl.load(ptrs, mask=cols_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def streamed_rows(
    base,
    n_rows,
    stride_row,
    HEAD_DIM: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """What a kernel streams a (n_rows, HEAD_DIM) operand through: with USE_TMA a tensor descriptor of
    (BLOCK_ROWS, BLOCK_D) tiles (Hopper's TMA; rows and columns out of bounds read as zero), else its
    base pointer; load_rows reads a tile from either."""
    if USE_TMA:
        return tl.make_tensor_descriptor(
            base, shape=[n_rows, HEAD_DIM], strides=[stride_row, 1], block_shape=[BLOCK_ROWS, BLOCK_D]
        )
    else:
        return base


@triton.jit
def load_rows(
    rows,
    start,
    offs_rows,
    rows_ok,
    stride_row,
    offs_d,
    d_ok,
    MASK_ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """The (BLOCK_ROWS, BLOCK_D) tile of rows offs_rows = start + arange(BLOCK_ROWS) of what
    streamed_rows gave: a tensor-descriptor load (rows and columns out of bounds read as zero) or
    load_tile from the base pointer (masked rows, if MASK_ROWS, and padded columns read as zero)."""
    if USE_TMA:
        x = rows.load([start, 0])
    else:
        x = load_tile(
            rows + offs_rows[:, None] * stride_row + offs_d[None, :], rows_ok, d_ok, MASK_ROWS, HEAD_DIM != BLOCK_D
        )
    return x


@triton.jit
def store_tile(ptrs, x, rows_ok, cols_ok, MASK_COLS: tl.constexpr):
    """Store a (rows, BLOCK_D) tile where the row is in range (and the column, if masked)."""
    if MASK_COLS:
        tl.store(ptrs, x, mask=rows_ok[:, None] & cols_ok[None, :])
    else:
        tl.store(ptrs, x, mask=rows_ok[:, None])


def is_interpreted(kernel) -> bool:
    """True when `kernel` (a triton.jit function, possibly wrapped) runs in the interpreter."""
    from triton.runtime.interpreter import InterpretedFunction

    while hasattr(kernel, "fn") and not isinstance(kernel, InterpretedFunction):
        kernel = kernel.fn
    return isinstance(kernel, InterpretedFunction)


INTERPRETED = is_interpreted(load_tile)


def _patch_interpreter_bf16_dot() -> None:
    """The interpreter keeps bfloat16 values as raw uint16 bits and its tl.dot multiplies those bits as
    integers (Triton 3.9): widen them to float32 first (exact: bfloat16 is a float32's top half)."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "widens_bf16", False):
        return
    original = builder.create_dot

    def widen(h):
        if h.dtype == tl.bfloat16:
            return interpreter.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
        return h

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot.widens_bf16 = True
    builder.create_dot = create_dot


def _patch_interpreter_bf16_cast() -> None:
    """Round float32 -> bfloat16 to nearest even, as the GPU does: the interpreter's cast keeps the top
    16 bits (Triton 3.9), a biased truncation that grows the backward's error with the length (a causal
    bf16 draw once gave dQ 3.8e-2 from float64, 2.9e-3 with rounding)."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.cast_impl, "rounds_bf16_to_nearest", False):
        return
    original = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            data = np.array(src.data, dtype=np.float32)  # a contiguous copy; a scalar stays 0-d
            bits = torch.from_numpy(data).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return interpreter.TensorHandle(bits.copy(), tl.bfloat16)
        return original(self, src, dst_type)

    cast_impl.rounds_bf16_to_nearest = True
    builder.cast_impl = cast_impl


if INTERPRETED:
    _patch_interpreter_bf16_dot()
    _patch_interpreter_bf16_cast()


def check_device(*tensors: torch.Tensor) -> None:
    """The compiled kernels need CUDA tensors; the interpreter runs on CPU tensors."""
    if not INTERPRETED and not all(t.is_cuda for t in tensors):
        raise ValueError(
            "the Triton FlashAttention kernels need CUDA tensors (or set "
            "TRITON_INTERPRET=1 before importing lmperf.kernels.flash to run them on CPU), "
            f"got device {tensors[0].device}"
        )


def dot_precision(dtype: torch.dtype, tf32: bool | None = None) -> str:
    """tl.dot's input_precision: for float32 inputs fp32 products unless TF32 is asked for (tf32=None:
    torch.backends.cuda.matmul.allow_tf32); "ieee" (unused) for 16-bit inputs."""
    if dtype != torch.float32:
        return "ieee"
    if tf32 is None:
        tf32 = torch.backends.cuda.matmul.allow_tf32
    return dot_precision_for("fp32", tf32)


def strides(*tensors: torch.Tensor) -> list[int]:
    """The batch and row strides of each (B, n, d) tensor, in order: the kernels' stride arguments."""
    return [s for t in tensors for s in t.stride()[:2]]


def tma_ok(t: torch.Tensor) -> bool:
    """TMA descriptors need 16-byte aligned base addresses and row strides."""
    size = t.element_size()
    return t.data_ptr() % 16 == 0 and all((s * size) % 16 == 0 for s in t.stride()[:-1]) and t.stride(-1) == 1


def set_tma_allocator(device: torch.device) -> None:
    """Scratch memory for in-kernel tensor descriptors, on this thread (Triton keeps its allocator per
    thread, and autograd runs the backward on one of its own: every TMA launch sets it)."""
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))


def use_tma(config: dict, *tensors: torch.Tensor) -> dict:
    """A launch config whose USE_TMA (default False) holds only where every tensor TMA reads is
    aligned for it (else plain loads: e.g. head dim 100 in bf16); with TMA, sets the allocator."""
    config = {**config, "USE_TMA": bool(config.get("USE_TMA")) and all(tma_ok(t) for t in tensors)}
    if config["USE_TMA"]:
        set_tma_allocator(tensors[0].device)
    return config
