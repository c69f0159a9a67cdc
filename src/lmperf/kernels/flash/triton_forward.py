"""FlashAttention-2 forward pass as a Triton kernel (flash_forward (b), (c)): one program per (query
tile, batch element) loops over key tiles keeping the running max, sum and output in float32, softmax
in base 2 (log2(e) folded into the scale), and writes O and L = logsumexp (natural log). Causal: tiles
above the diagonal are skipped, those below run unmasked, the rest masked.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .triton_common import (
    INTERPRETED,
    LN2,
    LOG2E,
    block_d,
    check_device,
    dot_precision,
    load_rows,
    load_tile,
    store_tile,
    streamed_rows,
    strides,
    use_tma,
)

__all__ = ["INTERPRETED", "LOG2E", "check_device", "flash_forward", "flash_fwd_kernel"]


@triton.jit
def _fwd_key_loop(
    acc,
    l_i,
    m_i,
    q,
    stride_kn,
    stride_vn,
    k_rows,
    v_rows,
    offs_m,
    offs_d,
    d_ok,
    lo,
    hi,
    n_keys,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """Online softmax over key tiles [lo, hi); returns the updated state (acc, l, m).

    MASKED=False is the fast path for tiles wholly inside [0, n_keys) and (causal) wholly
    below the diagonal; MASKED=True applies the key bound and, when causal, i >= j.
    """
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < n_keys
        k = load_rows(k_rows, start_n, offs_n, key_ok, stride_kn, offs_d, d_ok, MASKED, HEAD_DIM, BLOCK_D, USE_TMA)
        v = load_rows(v_rows, start_n, offs_n, key_ok, stride_vn, offs_d, d_ok, MASKED, HEAD_DIM, BLOCK_D, USE_TMA)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N), unscaled
        if MASKED:
            keep = key_ok[None, :]
            if IS_CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            s = tl.where(keep, s, float("-inf"))
        # Every row meets key 0 in its first tile, so m_new is finite and no -inf - -inf occurs.
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)  # log2 units
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s * qk_scale - m_new[:, None])  # one FMA per score
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["n_queries", "n_keys"])  # one binary for every length
def flash_fwd_kernel(
    Q,
    K,
    V,
    O,
    L,
    stride_qb,
    stride_qn,
    stride_kb,
    stride_kn,
    stride_vb,
    stride_vn,
    stride_ob,
    stride_on,
    n_queries,
    n_keys,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    USE_TMA: tl.constexpr,
    BATCH_FIRST: tl.constexpr,
):
    """Grid (cdiv(n_queries, BLOCK_M), batch), or (batch, cdiv(n_queries, BLOCK_M)) with BATCH_FIRST.
    Needs BLOCK_M % BLOCK_N == 0 (causal split).

    L is (batch, n_queries) float32, contiguous. qk_scale = sm_scale * log2(e). USE_TMA loads K and
    V through tensor descriptors (Hopper's TMA; needs 16-byte aligned rows, see launch_forward).
    BATCH_FIRST launches every batch element's tiles of one rank side by side, so all of the longest
    causal tiles run before any shorter one (a tuning candidate: docs/decisions/flash-batch-first-grid.md).
    """
    qk_scale = tl.cast(qk_scale, tl.float32)  # a float argument may arrive as fp64 (torch.compile)
    tile_axis: tl.constexpr = 1 if BATCH_FIRST else 0
    tile_m = tl.program_id(tile_axis)
    if IS_CAUSAL:  # the last query tiles do the most work: launch them first
        tile_m = tl.num_programs(tile_axis) - 1 - tile_m
    b = tl.program_id(1 - tile_axis).to(tl.int64)
    start_m = tile_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q_ok = offs_m < n_queries
    q = load_tile(
        Q + b * stride_qb + offs_m[:, None] * stride_qn + offs_d[None, :], q_ok, d_ok, True, HEAD_DIM != BLOCK_D
    )
    k_rows = streamed_rows(K + b * stride_kb, n_keys, stride_kn, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
    v_rows = streamed_rows(V + b * stride_vb, n_keys, stride_vn, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    n_keys_full = (n_keys // BLOCK_N) * BLOCK_N  # keys in whole tiles
    if IS_CAUSAL:
        # keys < start_m are below the diagonal for every row of this tile (start_m is a
        # multiple of BLOCK_N); keys in [start_m, start_m + BLOCK_M) straddle it
        hi_unmasked = tl.minimum(start_m, n_keys_full)
        hi = tl.minimum(start_m + BLOCK_M, n_keys)
    else:
        hi_unmasked = n_keys_full
        hi = n_keys
    for masked in tl.static_range(2):  # the whole tiles below the diagonal unmasked, then the rest masked
        acc, l_i, m_i = _fwd_key_loop(
            acc,
            l_i,
            m_i,
            q,
            stride_kn,
            stride_vn,
            k_rows,
            v_rows,
            offs_m,
            offs_d,
            d_ok,
            hi_unmasked if masked else 0,
            hi if masked else hi_unmasked,
            n_keys,
            qk_scale,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            masked == 1,
            IS_CAUSAL,
            PRECISION,
            WARP_SPECIALIZE and masked == 0,
            USE_TMA,
        )

    o = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) * LN2  # back from log2 units to natural log
    o_ptrs = O + b * stride_ob + offs_m[:, None] * stride_on + offs_d[None, :]
    store_tile(o_ptrs, o.to(O.dtype.element_ty), q_ok, d_ok, HEAD_DIM != BLOCK_D)
    tl.store(L + b * n_queries + offs_m, lse, mask=q_ok)


def launch_forward(q, k, v, o, lse, is_causal: bool, config: dict, precision: str) -> None:
    """One launch of flash_fwd_kernel with a full config (BLOCK_M, BLOCK_N, num_warps, num_stages)."""
    config = dict(config)
    if config["BLOCK_M"] % config["BLOCK_N"]:
        raise ValueError(f"forward: BLOCK_M must be a multiple of BLOCK_N, got {config}")
    config.setdefault("WARP_SPECIALIZE", False)
    config.setdefault("BATCH_FIRST", False)
    config = use_tma(config, k, v)  # K and V through tensor descriptors where they are aligned for it
    batch, n_q, d = q.shape
    grid = (triton.cdiv(n_q, config["BLOCK_M"]), batch)
    if config["BATCH_FIRST"]:
        grid = grid[::-1]
    args = (q, k, v, o, lse, *strides(q, k, v, o), n_q, k.shape[1], LOG2E / math.sqrt(d))
    constexprs = dict(HEAD_DIM=d, BLOCK_D=block_d(d), IS_CAUSAL=bool(is_causal), PRECISION=precision)
    flash_fwd_kernel[grid](*args, **constexprs, **config)


@torch.compiler.disable  # the tuner reads and writes files: run eagerly under torch.compile
def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    config: dict | None = None,
    tf32: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """O (B, n_q, d) in q's dtype and L (B, n_q) float32 for (B, n, d) inputs, head dim stride 1.

    `config` ({"BLOCK_M", "BLOCK_N", optional "num_warps", "num_stages"}) bypasses the tuner
    (lmperf.kernels.flash.tuning), which otherwise picks the tiles of this input's bucket. `tf32`: see
    triton_common.dot_precision (default: fp32 products in fp32).
    """
    from . import tuning

    check_device(q, k, v)
    batch, n_q, _ = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(batch, n_q, device=q.device, dtype=torch.float32)
    precision = dot_precision(q.dtype, tf32)
    if config is None:
        launch = lambda c: launch_forward(q, k, v, o, lse, is_causal, c, precision)  # noqa: E731
        config = tuning.choose("fwd", q, k, is_causal, precision, launch, outputs=(o,))
    else:
        config = {"num_warps": 4, "num_stages": 1 if INTERPRETED else 2, **config}
    launch_forward(q, k, v, o, lse, is_causal, config, precision)
    return o, lse
