"""FlashAttention-2 backward pass as Triton kernels, without atomics, P recomputed from L:
``flash_bwd_delta_kernel`` (D = rowsum(O * dO)), ``flash_bwd_dkdv_kernel`` (each program one K/V tile
over query tiles: dV = P^T dO, dK = dS^T Q * sm_scale) and ``flash_bwd_dq_kernel`` (dQ = dS K * sm_scale),
with dP = dO V^T, dS = P * (dP - D): one writer per tile, S and dP computed in both passes.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from .triton_common import LOG2E, block_d, load_rows, load_tile, store_tile, streamed_rows, strides, use_tma

DELTA_BLOCK_M = 64


@triton.jit(do_not_specialize=["n_queries"])  # one binary for every length
def flash_bwd_delta_kernel(
    O,
    DO,
    Delta,
    stride_ob,
    stride_on,
    stride_dob,
    stride_don,
    n_queries,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Delta (batch, n_queries) float32 = rowsum(O * dO); grid (cdiv(n_queries, BLOCK_M), batch)."""
    b = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    ok = offs_m < n_queries
    o = load_tile(
        O + b * stride_ob + offs_m[:, None] * stride_on + offs_d[None, :], ok, d_ok, True, HEAD_DIM != BLOCK_D
    )
    do = load_tile(
        DO + b * stride_dob + offs_m[:, None] * stride_don + offs_d[None, :], ok, d_ok, True, HEAD_DIM != BLOCK_D
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(Delta + b * n_queries + offs_m, delta, mask=ok)


@triton.jit
def _dkdv_query_loop(
    dk,
    dv,
    k,
    v,
    q_rows,
    do_rows,
    l_base,
    delta_base,
    stride_qn,
    stride_don,
    offs_n,
    offs_d,
    d_ok,
    lo,
    hi,
    n_queries,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,
    DP_FIRST: tl.constexpr,
):
    """Accumulate (dK, dV) of one key tile over query tiles [lo, hi); works transposed
    (keys along rows) so P^T and dS^T come out of the matmuls directly. DP_FIRST issues
    dP^T = V dO^T right after S^T, before P and dV's matmul (an instruction order the tuner tries)."""
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_ok = offs_m < n_queries
        q = load_rows(q_rows, start_m, offs_m, q_ok, stride_qn, offs_d, d_ok, MASKED, HEAD_DIM, BLOCK_D, USE_TMA)
        do = load_rows(do_rows, start_m, offs_m, q_ok, stride_don, offs_d, d_ok, MASKED, HEAD_DIM, BLOCK_D, USE_TMA)
        if MASKED:
            lse_log2 = tl.load(l_base + offs_m, mask=q_ok, other=0.0) * 1.4426950408889634  # 1/ln 2
            delta = tl.load(delta_base + offs_m, mask=q_ok, other=0.0)
        else:
            lse_log2 = tl.load(l_base + offs_m) * 1.4426950408889634
            delta = tl.load(delta_base + offs_m)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M), unscaled
        if DP_FIRST:
            dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        p_t = tl.math.exp2(s_t * qk_scale - lse_log2[None, :])
        if MASKED:
            keep = q_ok[None, :]
            if IS_CAUSAL:
                keep = keep & (offs_m[None, :] >= offs_n[:, None])
            p_t = tl.where(keep, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=PRECISION)
        if not DP_FIRST:
            dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


# Lengths specialised (unlike the other kernels): knowing n_queries a multiple of 16 lets Triton load
# the L and Delta rows of every query tile in vectors (their per-batch offsets b * n_queries are then
# aligned), 6-8 % of this pass at the leaderboard shape (docs/decisions/flash-dkdv-dp-first-and-lengths.md); at most three
# binaries per tile choice (a length of 1, a multiple of 16, any other), see lmperf.kernels.flash.warm.
@triton.jit
def flash_bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    L,
    Delta,
    DK,
    DV,
    stride_qb,
    stride_qn,
    stride_kb,
    stride_kn,
    stride_vb,
    stride_vn,
    stride_dob,
    stride_don,
    stride_dkb,
    stride_dkn,
    stride_dvb,
    stride_dvn,
    n_queries,
    n_keys,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,
    DP_FIRST: tl.constexpr,
):
    """Grid (cdiv(n_keys, BLOCK_N), batch); BLOCK_N (keys) a multiple of BLOCK_M (queries). Causal: key
    tile 0 has the most work and is launched first already. USE_TMA: K, V, Q and dO through descriptors."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # float arguments may arrive as fp64 (torch.compile)
    sm_scale = tl.cast(sm_scale, tl.float32)
    b = tl.program_id(1).to(tl.int64)
    start_n = tl.program_id(0) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    k_ok = offs_n < n_keys
    # this program's K and V tiles, read once
    k_rows = streamed_rows(K + b * stride_kb, n_keys, stride_kn, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
    v_rows = streamed_rows(V + b * stride_vb, n_keys, stride_vn, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
    k = load_rows(k_rows, start_n, offs_n, k_ok, stride_kn, offs_d, d_ok, True, HEAD_DIM, BLOCK_D, USE_TMA)
    v = load_rows(v_rows, start_n, offs_n, k_ok, stride_vn, offs_d, d_ok, True, HEAD_DIM, BLOCK_D, USE_TMA)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    l_base = L + b * n_queries
    delta_base = Delta + b * n_queries
    q_rows = streamed_rows(Q + b * stride_qb, n_queries, stride_qn, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
    do_rows = streamed_rows(DO + b * stride_dob, n_queries, stride_don, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)

    n_queries_full = (n_queries // BLOCK_M) * BLOCK_M  # queries in whole tiles
    if IS_CAUSAL:
        # queries [start_n, start_n + BLOCK_N) straddle the diagonal; earlier ones see none
        # of these keys; later ones see all of them
        dk, dv = _dkdv_query_loop(
            dk,
            dv,
            k,
            v,
            q_rows,
            do_rows,
            l_base,
            delta_base,
            stride_qn,
            stride_don,
            offs_n,
            offs_d,
            d_ok,
            start_n,
            tl.minimum(start_n + BLOCK_N, n_queries),
            n_queries,
            qk_scale,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_M,
            True,
            IS_CAUSAL,
            PRECISION,
            USE_TMA,
            DP_FIRST,
        )
        lo_unmasked = start_n + BLOCK_N
    else:
        lo_unmasked = 0
    dk, dv = _dkdv_query_loop(
        dk,
        dv,
        k,
        v,
        q_rows,
        do_rows,
        l_base,
        delta_base,
        stride_qn,
        stride_don,
        offs_n,
        offs_d,
        d_ok,
        lo_unmasked,
        n_queries_full,
        n_queries,
        qk_scale,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_M,
        False,
        IS_CAUSAL,
        PRECISION,
        USE_TMA,
        DP_FIRST,
    )
    dk, dv = _dkdv_query_loop(
        dk,
        dv,
        k,
        v,
        q_rows,
        do_rows,
        l_base,
        delta_base,
        stride_qn,
        stride_don,
        offs_n,
        offs_d,
        d_ok,
        tl.maximum(lo_unmasked, n_queries_full),
        n_queries,
        n_queries,
        qk_scale,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_M,
        True,
        IS_CAUSAL,
        PRECISION,
        USE_TMA,
        DP_FIRST,
    )

    dk = dk * sm_scale
    dk_ptrs = DK + b * stride_dkb + offs_n[:, None] * stride_dkn + offs_d[None, :]
    store_tile(dk_ptrs, dk.to(DK.dtype.element_ty), k_ok, d_ok, HEAD_DIM != BLOCK_D)
    dv_ptrs = DV + b * stride_dvb + offs_n[:, None] * stride_dvn + offs_d[None, :]
    store_tile(dv_ptrs, dv.to(DV.dtype.element_ty), k_ok, d_ok, HEAD_DIM != BLOCK_D)


@triton.jit
def _dq_key_loop(
    dq,
    q,
    do,
    lse_log2,
    delta,
    k_rows,
    v_rows,
    stride_kn,
    stride_vn,
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
    USE_TMA: tl.constexpr,
):
    """Accumulate dQ of one query tile over key tiles [lo, hi)."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        key_ok = offs_n < n_keys
        k = load_rows(k_rows, start_n, offs_n, key_ok, stride_kn, offs_d, d_ok, MASKED, HEAD_DIM, BLOCK_D, USE_TMA)
        v = load_rows(v_rows, start_n, offs_n, key_ok, stride_vn, offs_d, d_ok, MASKED, HEAD_DIM, BLOCK_D, USE_TMA)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N), unscaled
        p = tl.math.exp2(s * qk_scale - lse_log2[:, None])
        if MASKED:
            keep = key_ok[None, :]
            if IS_CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@triton.jit(do_not_specialize=["n_queries", "n_keys"])  # one binary for every length
def flash_bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    L,
    Delta,
    DQ,
    stride_qb,
    stride_qn,
    stride_kb,
    stride_kn,
    stride_vb,
    stride_vn,
    stride_dob,
    stride_don,
    stride_dqb,
    stride_dqn,
    n_queries,
    n_keys,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_TMA: tl.constexpr,
    BATCH_FIRST: tl.constexpr,
):
    """Grid (cdiv(n_queries, BLOCK_M), batch), or transposed with BATCH_FIRST; BLOCK_M (queries) a
    multiple of BLOCK_N (keys). USE_TMA streams K and V through tensor descriptors."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # float arguments may arrive as fp64 (torch.compile)
    sm_scale = tl.cast(sm_scale, tl.float32)
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
    do = load_tile(
        DO + b * stride_dob + offs_m[:, None] * stride_don + offs_d[None, :], q_ok, d_ok, True, HEAD_DIM != BLOCK_D
    )
    lse_log2 = tl.load(L + b * n_queries + offs_m, mask=q_ok, other=0.0) * 1.4426950408889634  # 1/ln 2
    delta = tl.load(Delta + b * n_queries + offs_m, mask=q_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    k_rows = streamed_rows(K + b * stride_kb, n_keys, stride_kn, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)
    v_rows = streamed_rows(V + b * stride_vb, n_keys, stride_vn, HEAD_DIM, BLOCK_N, BLOCK_D, USE_TMA)

    n_keys_full = (n_keys // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        hi_unmasked = tl.minimum(start_m, n_keys_full)
        hi = tl.minimum(start_m + BLOCK_M, n_keys)
    else:
        hi_unmasked = n_keys_full
        hi = n_keys
    for masked in tl.static_range(2):  # the whole tiles below the diagonal unmasked, then the rest masked
        dq = _dq_key_loop(
            dq,
            q,
            do,
            lse_log2,
            delta,
            k_rows,
            v_rows,
            stride_kn,
            stride_vn,
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
            USE_TMA,
        )

    dq = dq * sm_scale
    dq_ptrs = DQ + b * stride_dqb + offs_m[:, None] * stride_dqn + offs_d[None, :]
    store_tile(dq_ptrs, dq.to(DQ.dtype.element_ty), q_ok, d_ok, HEAD_DIM != BLOCK_D)


def launch_delta(o, do, delta) -> None:
    """D = rowsum(O * dO) into `delta` (batch, n_q) float32: the backward's first kernel."""
    batch, n_q, d = o.shape
    flash_bwd_delta_kernel[(triton.cdiv(n_q, DELTA_BLOCK_M), batch)](
        o, do, delta, *strides(o, do), n_q, HEAD_DIM=d, BLOCK_D=block_d(d), BLOCK_M=DELTA_BLOCK_M
    )


def launch_dkdv(q, k, v, do, lse, delta, dk, dv, is_causal: bool, config: dict, precision: str) -> None:
    if config["BLOCK_N"] % config["BLOCK_M"]:
        raise ValueError(f"dK/dV pass: BLOCK_N must be a multiple of BLOCK_M, got {config}")
    config = {"DP_FIRST": False, **use_tma(config, q, k, v, do)}  # descriptors where all four are aligned
    (batch, n_q, d), n_k = q.shape, k.shape[1]
    sm_scale = 1.0 / math.sqrt(d)
    args = (q, k, v, do, lse, delta, dk, dv, *strides(q, k, v, do, dk, dv), n_q, n_k, sm_scale * LOG2E, sm_scale)
    constexprs = dict(HEAD_DIM=d, BLOCK_D=block_d(d), IS_CAUSAL=bool(is_causal), PRECISION=precision)
    flash_bwd_dkdv_kernel[(triton.cdiv(n_k, config["BLOCK_N"]), batch)](*args, **constexprs, **config)


def launch_dq(q, k, v, do, lse, delta, dq, is_causal: bool, config: dict, precision: str) -> None:
    if config["BLOCK_M"] % config["BLOCK_N"]:
        raise ValueError(f"dQ pass: BLOCK_M must be a multiple of BLOCK_N, got {config}")
    config = {"BATCH_FIRST": False, **use_tma(config, k, v)}  # K, V through descriptors where aligned
    batch, n_q, d = q.shape
    sm_scale = 1.0 / math.sqrt(d)
    grid = (triton.cdiv(n_q, config["BLOCK_M"]), batch)
    args = (q, k, v, do, lse, delta, dq, *strides(q, k, v, do, dq), n_q, k.shape[1], sm_scale * LOG2E, sm_scale)
    constexprs = dict(HEAD_DIM=d, BLOCK_D=block_d(d), IS_CAUSAL=bool(is_causal), PRECISION=precision)
    flash_bwd_dq_kernel[grid[::-1] if config["BATCH_FIRST"] else grid](*args, **constexprs, **config)
