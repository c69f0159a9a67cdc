"""FlashAttention-2 forward pass as a Triton kernel (flash_forward (b), (c)).

One program per (query tile, batch element): it loads its Q tile once, loops over key tiles
keeping the running max m, running sum l and unnormalised output in float32, and writes O (in
the input dtype) and L = logsumexp of the scaled scores (float32, natural log).

Softmax runs in base 2: scores are multiplied by sm_scale * log2(e) once, so every exponential
is an exp2 and L is converted back to natural log at the end.

Causal (top-left, query i sees key j iff i >= j; see reference.py): key tiles wholly above the
diagonal are never visited; tiles wholly below it run without a mask; the few tiles on the
diagonal and the ragged last key tile go through the masked variant of the same loop.

Whether the kernels run compiled or in Triton's interpreter is fixed when this module is
imported (triton.jit reads TRITON_INTERPRET then). Interpreted, autotuning is cut to one small
config so CPU tests stay fast.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # 1/ln(2): exp(x) == exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): log(x) == log2(x) * LN2 (constexpr: used in kernels)


@triton.jit
def _fwd_key_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                  offs_m, offs_d, lo, hi, n_keys, qk_scale,
                  BLOCK_N: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """Online softmax over key tiles [lo, hi); returns the updated state (acc, l, m).

    MASKED=False is the fast path for tiles wholly inside [0, n_keys) and (causal) wholly
    below the diagonal; MASKED=True applies the key bound and, when causal, i >= j.
    """
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k_ptrs = k_base + offs_n[:, None] * stride_kn + offs_d[None, :]
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :]
        if MASKED:
            key_ok = offs_n < n_keys
            k = tl.load(k_ptrs, mask=key_ok[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=key_ok[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        if MASKED:
            keep = key_ok[None, :]
            if IS_CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            s = tl.where(keep, s, float("-inf"))
        # Every row meets key 0 in its first tile, so m_new is finite and no -inf - -inf occurs.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def flash_fwd_kernel(Q, K, V, O, L,
                     stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
                     stride_ob, stride_on,
                     n_queries, n_keys, batch, qk_scale,
                     HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (cdiv(n_queries, BLOCK_M), batch). Needs BLOCK_M % BLOCK_N == 0 (causal split).

    `batch` is unused in the body; it is in the autotune key because occupancy depends on it.
    L is (batch, n_queries) float32, contiguous.
    """
    qk_scale = tl.cast(qk_scale, tl.float32)  # a float argument may arrive as fp64 (torch.compile)
    tile_m = tl.program_id(0)
    if IS_CAUSAL:  # the last query tiles do the most work: launch them first
        tile_m = tl.num_programs(0) - 1 - tile_m
    b = tl.program_id(1).to(tl.int64)
    start_m = tile_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ok = offs_m < n_queries
    q = tl.load(Q + b * stride_qb + offs_m[:, None] * stride_qn + offs_d[None, :],
                mask=q_ok[:, None], other=0.0)
    k_base = K + b * stride_kb
    v_base = V + b * stride_vb

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    n_keys_full = (n_keys // BLOCK_N) * BLOCK_N  # keys in whole tiles
    if IS_CAUSAL:
        # keys < start_m are below the diagonal for every row of this tile (start_m is a
        # multiple of BLOCK_N); keys in [start_m, start_m + BLOCK_M) straddle it
        hi_unmasked = tl.minimum(start_m, n_keys_full)
        hi = tl.minimum(start_m + BLOCK_M, n_keys)
    else:
        hi_unmasked = n_keys_full
        hi = n_keys
    acc, l_i, m_i = _fwd_key_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                  offs_m, offs_d, 0, hi_unmasked, n_keys, qk_scale,
                                  BLOCK_N, False, IS_CAUSAL)
    acc, l_i, m_i = _fwd_key_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn,
                                  offs_m, offs_d, hi_unmasked, hi, n_keys, qk_scale,
                                  BLOCK_N, True, IS_CAUSAL)

    o = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) * LN2  # back from log2 units to natural log
    tl.store(O + b * stride_ob + offs_m[:, None] * stride_on + offs_d[None, :],
             o.to(O.dtype.element_ty), mask=q_ok[:, None])
    tl.store(L + b * n_queries + offs_m, lse, mask=q_ok)


def is_interpreted(kernel) -> bool:
    """True when `kernel` (a triton.jit function, possibly autotuned) runs in the interpreter."""
    from triton.runtime.interpreter import InterpretedFunction
    while hasattr(kernel, "fn") and not isinstance(kernel, InterpretedFunction):
        kernel = kernel.fn
    return isinstance(kernel, InterpretedFunction)


INTERPRETED = is_interpreted(flash_fwd_kernel)


def _patch_interpreter_bf16_dot() -> None:
    """Make the interpreter's tl.dot correct for bfloat16 operands.

    Triton's interpreter keeps bfloat16 values as their raw uint16 bits and its create_dot
    multiplies those bits as integers (seen with Triton 3.9). Widen them to float32 first:
    exact, since bfloat16 is the top half of a float32.
    """
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "widens_bf16", False):
        return
    original = builder.create_dot

    def widen(h):
        if h.dtype == tl.bfloat16:
            return interpreter.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32),
                                            tl.float32)
        return h

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot.widens_bf16 = True
    builder.create_dot = create_dot


if INTERPRETED:
    _patch_interpreter_bf16_dot()

# One small config under the interpreter: BLOCK_M > BLOCK_N so the causal diagonal spans
# several key tiles, and small enough that short test sequences cover many tiles.
INTERPRETER_FWD_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 16}


def _keep_fwd(config: triton.Config) -> bool:
    """Candidates kept after a full sweep of 18 on an H200 (bench/flash_notes.md): 64x64 tiles
    with 4 warps, 128x64 / 128x128 with 8, deeper pipelines for the 64-wide key tiles, plus
    64x32 in two stages, the one that fits shared memory for float32 at d=128."""
    bm, bn, w, s = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps, config.num_stages
    if bm % bn or (w == 8) != (bm == 128):  # the causal split needs BLOCK_N | BLOCK_M
        return False
    if bn == 32:
        return bm == 64 and s == 2
    return s == 3 or (s == 4 and bn == 64)


if INTERPRETED:
    FWD_CONFIGS = [triton.Config(INTERPRETER_FWD_CONFIG, num_warps=4, num_stages=1)]
else:
    FWD_CONFIGS = list(filter(_keep_fwd, [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bm in (64, 128) for bn in (32, 64, 128) for w in (4, 8) for s in (2, 3, 4)]))

AUTOTUNE_KEY = ["n_queries", "n_keys", "batch", "HEAD_DIM", "IS_CAUSAL"]  # + dtypes (implicit)

flash_fwd_kernel_tuned = triton.autotune(configs=FWD_CONFIGS, key=AUTOTUNE_KEY)(flash_fwd_kernel)


def check_device(*tensors: torch.Tensor) -> None:
    """The compiled kernels need CUDA tensors; the interpreter runs on CPU tensors."""
    if not INTERPRETED and not all(t.is_cuda for t in tensors):
        raise ValueError("the Triton FlashAttention kernels need CUDA tensors (or set "
                         "TRITON_INTERPRET=1 before importing lmperf.flash to run them on CPU), "
                         f"got device {tensors[0].device}")


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                  config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """O (B, n_q, d) in q's dtype and L (B, n_q) float32 for (B, n, d) inputs, head dim stride 1.

    `config` ({"BLOCK_M", "BLOCK_N", optional "num_warps", "num_stages"}) bypasses autotuning.
    """
    batch, n_q, d = q.shape
    n_k = k.shape[1]
    o = torch.empty_like(q)
    lse = torch.empty(batch, n_q, device=q.device, dtype=torch.float32)
    qk_scale = LOG2E / math.sqrt(d)
    args = (q, k, v, o, lse,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            o.stride(0), o.stride(1), n_q, n_k, batch, qk_scale)
    if config is None:
        def grid(meta):
            return (triton.cdiv(n_q, meta["BLOCK_M"]), batch)
        flash_fwd_kernel_tuned[grid](*args, HEAD_DIM=d, IS_CAUSAL=bool(is_causal))
    else:
        if config["BLOCK_M"] % config["BLOCK_N"]:
            raise ValueError(f"BLOCK_M must be a multiple of BLOCK_N, got {config}")
        grid = (triton.cdiv(n_q, config["BLOCK_M"]), batch)
        flash_fwd_kernel[grid](*args, HEAD_DIM=d, IS_CAUSAL=bool(is_causal), **config)
    return o, lse
