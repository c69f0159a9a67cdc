"""FlashAttention-2 backward pass as Triton kernels (flash_backward), without atomics.

P is recomputed from L instead of stored. Three launches:
1. `flash_bwd_delta_kernel`: D = rowsum(O * dO), float32, one value per query.
2. `flash_bwd_dkdv_kernel`, grid (key tiles, batch): each program owns one K/V tile, loops
   over query tiles and accumulates dV = P^T dO and dK = dS^T Q * sm_scale.
3. `flash_bwd_dq_kernel`, grid (query tiles, batch): each program owns one Q tile, loops over
   key tiles and accumulates dQ = dS K * sm_scale.
with dP = dO V^T and dS = P * (dP - D). Every output tile has exactly one writer, at the cost
of recomputing S and dP in both passes (7 tile matmuls instead of 5).

Causal tiles are split as in the forward kernel: off-diagonal tiles run unmasked, the tiles on
the diagonal and the ragged last tile run the masked variant of the same loop.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .triton_forward import AUTOTUNE_KEY, INTERPRETED, LOG2E


@triton.jit
def flash_bwd_delta_kernel(O, DO, Delta, stride_ob, stride_on, stride_dob, stride_don,
                           n_queries, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """Delta (batch, n_queries) float32 = rowsum(O * dO); grid (cdiv(n_queries, BLOCK_M), batch)."""
    b = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = offs_m < n_queries
    o = tl.load(O + b * stride_ob + offs_m[:, None] * stride_on + offs_d[None, :],
                mask=ok[:, None], other=0.0)
    do = tl.load(DO + b * stride_dob + offs_m[:, None] * stride_don + offs_d[None, :],
                 mask=ok[:, None], other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(Delta + b * n_queries + offs_m, delta, mask=ok)


@triton.jit
def _dkdv_query_loop(dk, dv, k, v, q_base, do_base, l_base, delta_base, stride_qn, stride_don,
                     offs_n, offs_d, lo, hi, n_queries, qk_scale,
                     BLOCK_M: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """Accumulate (dK, dV) of one key tile over query tiles [lo, hi); works transposed
    (keys along rows) so P^T and dS^T come out of the matmuls directly."""
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_ptrs = q_base + offs_m[:, None] * stride_qn + offs_d[None, :]
        do_ptrs = do_base + offs_m[:, None] * stride_don + offs_d[None, :]
        if MASKED:
            q_ok = offs_m < n_queries
            q = tl.load(q_ptrs, mask=q_ok[:, None], other=0.0)
            do = tl.load(do_ptrs, mask=q_ok[:, None], other=0.0)
            lse = tl.load(l_base + offs_m, mask=q_ok, other=0.0)
            delta = tl.load(delta_base + offs_m, mask=q_ok, other=0.0)
        else:
            q = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
            lse = tl.load(l_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        s_t = tl.dot(k, tl.trans(q)) * qk_scale  # (BLOCK_N, BLOCK_M), log2 units
        p_t = tl.math.exp2(s_t - (lse * 1.4426950408889634)[None, :])  # L to log2 units (1/ln 2)
        if MASKED:
            keep = q_ok[None, :]
            if IS_CAUSAL:
                keep = keep & (offs_m[None, :] >= offs_n[:, None])
            p_t = tl.where(keep, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def flash_bwd_dkdv_kernel(Q, K, V, DO, L, Delta, DK, DV,
                          stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
                          stride_dob, stride_don, stride_dkb, stride_dkn, stride_dvb, stride_dvn,
                          n_queries, n_keys, batch, qk_scale, sm_scale,
                          HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (cdiv(n_keys, BLOCK_N), batch); BLOCK_N (keys) a multiple of BLOCK_M (queries).

    Causal: key tile 0 has the most work and is launched first already.
    """
    qk_scale = tl.cast(qk_scale, tl.float32)  # float arguments may arrive as fp64 (torch.compile)
    sm_scale = tl.cast(sm_scale, tl.float32)
    b = tl.program_id(1).to(tl.int64)
    start_n = tl.program_id(0) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k_ok = offs_n < n_keys
    k = tl.load(K + b * stride_kb + offs_n[:, None] * stride_kn + offs_d[None, :],
                mask=k_ok[:, None], other=0.0)
    v = tl.load(V + b * stride_vb + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=k_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    q_base = Q + b * stride_qb
    do_base = DO + b * stride_dob
    l_base = L + b * n_queries
    delta_base = Delta + b * n_queries

    n_queries_full = (n_queries // BLOCK_M) * BLOCK_M  # queries in whole tiles
    if IS_CAUSAL:
        # queries [start_n, start_n + BLOCK_N) straddle the diagonal; earlier ones see none
        # of these keys; later ones see all of them
        dk, dv = _dkdv_query_loop(dk, dv, k, v, q_base, do_base, l_base, delta_base,
                                  stride_qn, stride_don, offs_n, offs_d,
                                  start_n, tl.minimum(start_n + BLOCK_N, n_queries), n_queries,
                                  qk_scale, BLOCK_M, True, IS_CAUSAL)
        lo_unmasked = start_n + BLOCK_N
    else:
        lo_unmasked = 0
    dk, dv = _dkdv_query_loop(dk, dv, k, v, q_base, do_base, l_base, delta_base,
                              stride_qn, stride_don, offs_n, offs_d,
                              lo_unmasked, n_queries_full, n_queries, qk_scale,
                              BLOCK_M, False, IS_CAUSAL)
    dk, dv = _dkdv_query_loop(dk, dv, k, v, q_base, do_base, l_base, delta_base,
                              stride_qn, stride_don, offs_n, offs_d,
                              tl.maximum(lo_unmasked, n_queries_full), n_queries, n_queries,
                              qk_scale, BLOCK_M, True, IS_CAUSAL)

    dk = dk * sm_scale
    tl.store(DK + b * stride_dkb + offs_n[:, None] * stride_dkn + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=k_ok[:, None])
    tl.store(DV + b * stride_dvb + offs_n[:, None] * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=k_ok[:, None])


@triton.jit
def _dq_key_loop(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_vn,
                 offs_m, offs_d, lo, hi, n_keys, qk_scale,
                 BLOCK_N: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """Accumulate dQ of one query tile over key tiles [lo, hi)."""
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
        p = tl.math.exp2(s - lse_log2[:, None])
        if MASKED:
            keep = key_ok[None, :]
            if IS_CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def flash_bwd_dq_kernel(Q, K, V, DO, L, Delta, DQ,
                        stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
                        stride_dob, stride_don, stride_dqb, stride_dqn,
                        n_queries, n_keys, batch, qk_scale, sm_scale,
                        HEAD_DIM: tl.constexpr, IS_CAUSAL: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (cdiv(n_queries, BLOCK_M), batch); BLOCK_M (queries) a multiple of BLOCK_N (keys)."""
    qk_scale = tl.cast(qk_scale, tl.float32)  # float arguments may arrive as fp64 (torch.compile)
    sm_scale = tl.cast(sm_scale, tl.float32)
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
    do = tl.load(DO + b * stride_dob + offs_m[:, None] * stride_don + offs_d[None, :],
                 mask=q_ok[:, None], other=0.0)
    lse_log2 = tl.load(L + b * n_queries + offs_m, mask=q_ok, other=0.0) * 1.4426950408889634  # 1/ln 2
    delta = tl.load(Delta + b * n_queries + offs_m, mask=q_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    k_base = K + b * stride_kb
    v_base = V + b * stride_vb

    n_keys_full = (n_keys // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        hi_unmasked = tl.minimum(start_m, n_keys_full)
        hi = tl.minimum(start_m + BLOCK_M, n_keys)
    else:
        hi_unmasked = n_keys_full
        hi = n_keys
    dq = _dq_key_loop(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_vn,
                      offs_m, offs_d, 0, hi_unmasked, n_keys, qk_scale, BLOCK_N, False, IS_CAUSAL)
    dq = _dq_key_loop(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_vn,
                      offs_m, offs_d, hi_unmasked, hi, n_keys, qk_scale, BLOCK_N, True, IS_CAUSAL)

    dq = dq * sm_scale
    tl.store(DQ + b * stride_dqb + offs_m[:, None] * stride_dqn + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=q_ok[:, None])


# Interpreter tiles: the dK/dV pass owns 32 keys and steps 16 queries at a time; the dQ pass
# the other way round, so both causal diagonals span two inner tiles.
INTERPRETER_DKDV_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 32}
INTERPRETER_DQ_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 16}
DELTA_BLOCK_M = 64


# Candidates kept after a full sweep of 24 per pass on an H200 (bench/flash_notes.md); each
# list keeps one two-stage config with small tiles that fits shared memory for float32, d=128.
def _keep_dkdv(config: triton.Config) -> bool:
    bm, bn, s = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_stages  # bm queries
    if bn % bm or bn // bm > 2:  # the causal split needs BLOCK_M | BLOCK_N
        return False
    return s >= 3 or (bm, bn) == (32, 64)


def _keep_dq(config: triton.Config) -> bool:
    bm, bn, w, s = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps, config.num_stages
    if bm % bn or (w == 8 and bm != 128):  # the causal split needs BLOCK_N | BLOCK_M
        return False
    if bn == 32:
        return bm == 64 and w == 4 and s == 2
    return s >= 3


if INTERPRETED:
    DKDV_CONFIGS = [triton.Config(INTERPRETER_DKDV_CONFIG, num_warps=4, num_stages=1)]
    DQ_CONFIGS = [triton.Config(INTERPRETER_DQ_CONFIG, num_warps=4, num_stages=1)]
else:
    DKDV_CONFIGS = list(filter(_keep_dkdv, [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=4, num_stages=s)
        for bm in (32, 64) for bn in (64, 128) for s in (2, 3, 4, 5)]))
    DQ_CONFIGS = list(filter(_keep_dq, [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
        for bm in (64, 128) for bn in (32, 64) for w in (4, 8) for s in (2, 3, 4, 5)]))

flash_bwd_dkdv_kernel_tuned = triton.autotune(configs=DKDV_CONFIGS, key=AUTOTUNE_KEY)(
    flash_bwd_dkdv_kernel)
flash_bwd_dq_kernel_tuned = triton.autotune(configs=DQ_CONFIGS, key=AUTOTUNE_KEY)(
    flash_bwd_dq_kernel)


def flash_backward(q, k, v, o, lse, do, is_causal: bool = False,
                   dkdv_config: dict | None = None, dq_config: dict | None = None):
    """(dQ, dK, dV) for (B, n, d) tensors with head dim stride 1 and L (B, n_q) float32.

    The configs ({"BLOCK_M", "BLOCK_N", optional "num_warps", "num_stages"}) bypass
    autotuning for their pass.
    """
    batch, n_q, d = q.shape
    n_k = k.shape[1]
    if do.stride(-1) != 1:  # e.g. the expanded ones of o.sum().backward()
        do = do.contiguous()
    is_causal = bool(is_causal)
    sm_scale = 1.0 / math.sqrt(d)
    qk_scale = sm_scale * LOG2E

    delta = torch.empty(batch, n_q, device=q.device, dtype=torch.float32)
    flash_bwd_delta_kernel[(triton.cdiv(n_q, DELTA_BLOCK_M), batch)](
        o, do, delta, o.stride(0), o.stride(1), do.stride(0), do.stride(1), n_q,
        HEAD_DIM=d, BLOCK_M=DELTA_BLOCK_M)

    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    common = (q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
              do.stride(0), do.stride(1))

    dkdv_args = (q, k, v, do, lse, delta, dk, dv, *common,
                 dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
                 n_q, n_k, batch, qk_scale, sm_scale)
    if dkdv_config is None:
        def dkdv_grid(meta):
            return (triton.cdiv(n_k, meta["BLOCK_N"]), batch)
        flash_bwd_dkdv_kernel_tuned[dkdv_grid](*dkdv_args, HEAD_DIM=d, IS_CAUSAL=is_causal)
    else:
        if dkdv_config["BLOCK_N"] % dkdv_config["BLOCK_M"]:
            raise ValueError(f"dK/dV pass: BLOCK_N must be a multiple of BLOCK_M, got {dkdv_config}")
        flash_bwd_dkdv_kernel[(triton.cdiv(n_k, dkdv_config["BLOCK_N"]), batch)](
            *dkdv_args, HEAD_DIM=d, IS_CAUSAL=is_causal, **dkdv_config)

    dq_args = (q, k, v, do, lse, delta, dq, *common, dq.stride(0), dq.stride(1),
               n_q, n_k, batch, qk_scale, sm_scale)
    if dq_config is None:
        def dq_grid(meta):
            return (triton.cdiv(n_q, meta["BLOCK_M"]), batch)
        flash_bwd_dq_kernel_tuned[dq_grid](*dq_args, HEAD_DIM=d, IS_CAUSAL=is_causal)
    else:
        if dq_config["BLOCK_M"] % dq_config["BLOCK_N"]:
            raise ValueError(f"dQ pass: BLOCK_M must be a multiple of BLOCK_N, got {dq_config}")
        flash_bwd_dq_kernel[(triton.cdiv(n_q, dq_config["BLOCK_M"]), batch)](
            *dq_args, HEAD_DIM=d, IS_CAUSAL=is_causal, **dq_config)
    return dq, dk, dv
