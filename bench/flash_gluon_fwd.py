"""Probe (issue 12): a causal attention forward in Gluon with FlashAttention-3's in-warpgroup overlap.

Triton 3.6's `tl.dot` waits for every matrix product before the softmax that follows it, and its
scheduler does not overlap the two (bench/flash_notes.md, v8: the split forward). Gluon, Triton's
lower-level dialect, lets a kernel issue Hopper's asynchronous warpgroup MMAs itself and wait for
them where it chooses. This probe writes the forward that way: while the tensor cores compute
O += P_(j-1) V_(j-1), the warps run the softmax of S_j = Q K_j^T, issued just before; K and V come
through TMA into a ring of `STAGES` shared-memory buffers, each loaded as soon as its previous tile
is consumed. Causal masking runs only on the diagonal tiles; query tiles are launched longest first.

A second kernel is FlashAttention-3's shape (`gluon_attn_fwd_ws_kernel`): warp-specialised, a producer
warp issuing the TMA loads and two consumer warpgroups of 64 query rows each sharing every key/value
tile, each running the overlap above, optionally taking turns at issuing their products (ping-pong).
Results: bench/flash_notes.md, v11.

Only what the probe needs: bf16, (batch, n, d) inputs with n a multiple of BLOCK_M and d in
{64, 128}, equal query and key lengths. Its outputs (O and the natural-log log-sum-exp L, our kernels'
contract) are checked against our Triton forward, then timed beside it and SDPA's cuDNN backend at
the leaderboard's inputs (16 x 16384 x d, causal bf16; do_bench medians).

    python bench/flash_gluon_fwd.py                   # on a Hopper GPU; writes $OUT/flash_gluon_fwd.json
    python bench/flash_gluon_fwd.py --head-dims 64 --out /tmp/g64.json
    python bench/flash_gluon_fwd.py --compile-only    # sm_90 build on any machine: registers, spills
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

# The TMA copies were renamed after Triton 3.6 (async_load / async_store): the probe builds with either.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@gluon.jit
def _issue_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, row0, j, n_tiles, STAGES: gl.constexpr):
    """TMA loads of key/value tile j into stage j % STAGES (nothing past the last tile)."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    s = j % STAGES
    pred = j < n_tiles
    mbarrier.expect(k_bars.index(s), k_desc.block_type.nbytes, pred=pred)
    _tma_load(k_desc, [row0 + j * BLOCK_N, 0], k_bars.index(s), k_smem.index(s), pred=pred)
    mbarrier.expect(v_bars.index(s), v_desc.block_type.nbytes, pred=pred)
    _tma_load(v_desc, [row0 + j * BLOCK_N, 0], v_bars.index(s), v_smem.index(s), pred=pred)


@gluon.jit
def _softmax_tile(s, m_i, l_i, qk_scale, masked, off_m, off_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """One online-softmax step in base 2: (P as float32, new max, new sum, rescale of the old). The
    maximum is taken over the unscaled scores, so scaling and subtracting it is one FMA per score."""
    s_layout: gl.constexpr = s.type.layout
    if masked:
        rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where(rows[:, None] >= cols[None, :], s, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    p = gl.exp2(gl.fma(s, qk_scale, -m_new[:, None]))
    alpha = gl.exp2(m_i - m_new)
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, m_new, l_new, alpha


@gluon.jit
def gluon_attn_fwd_kernel(
    q_desc,
    k_desc,
    v_desc,
    o_desc,
    L,
    qk_scale,
    n_ctx,
    CAUSAL: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    dtype: gl.constexpr = q_desc.dtype

    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)  # longest causal tiles first
    bid = gl.program_id(1)
    row0 = bid * n_ctx
    off_m = pid_m * BLOCK_M

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)

    if CAUSAL:
        n_tiles = (off_m + BLOCK_M) // BLOCK_N
        n_full = off_m // BLOCK_N  # tiles wholly below the diagonal: no mask
    else:
        n_tiles = n_ctx // BLOCK_N
        n_full = n_tiles

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    _tma_load(q_desc, [row0 + off_m, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _issue_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, row0, i, n_tiles, STAGES)

    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

    # tile 0: S_0, its softmax
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s_tok = warpgroup_mma(
        q_smem,
        k_smem.index(0).permute((1, 0)),
        gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
        use_acc=False,
        is_async=True,
    )
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, n_full == 0, off_m, 0, BLOCK_M, BLOCK_N)
    p_prev = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_tiles):
        stage = j % STAGES
        prev = (j - 1) % STAGES
        # S_j on the tensor cores, then O += P_(j-1) V_(j-1) behind it
        mbarrier.wait(k_bars.index(stage), (j // STAGES) & 1)
        s_tok = warpgroup_mma(
            q_smem,
            k_smem.index(stage).permute((1, 0)),
            gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
            use_acc=False,
            is_async=True,
        )
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p_prev, v_smem.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        # the softmax of S_j while P_(j-1) V_(j-1) runs
        p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, j >= n_full, off_m, j * BLOCK_N, BLOCK_M, BLOCK_N)
        acc, p_prev = warpgroup_mma_wait(0, deps=(o_tok, p_prev))
        # stage `prev` is free: load the tile STAGES ahead into it
        _issue_kv(k_desc, v_desc, k_smem, v_smem, k_bars, v_bars, row0, j - 1 + STAGES, n_tiles, STAGES)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        p_prev = gl.convert_layout(p.to(dtype), p_layout)

    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_bars.index(last), ((n_tiles - 1) // STAGES) & 1)
    o_tok = warpgroup_mma(p_prev, v_smem.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(o_tok,))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    l_o = gl.convert_layout(l_i, row_o)
    out = (acc / l_o[:, None]).to(dtype)
    rows = off_m + gl.arange(0, BLOCK_M, layout=row_s)
    gl.store(L + row0 + rows, (m_i + gl.log2(l_i)) * 0.6931471805599453)
    q_smem.store(out)  # Q is no longer needed: its buffer stages O for the TMA store
    fence_async_shared()
    _tma_store(o_desc, [row0 + off_m, 0], q_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def _ws_loader(
    q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, empty_bars, row0, off_m, n_tiles
):
    """Producer warp: both query halves, then key/value tiles into the ring as consumers free stages."""
    BLOCK_H: gl.constexpr = q_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    STAGES: gl.constexpr = k_smem.type.shape[0]
    for h in gl.static_range(2):
        mbarrier.expect(q_bars.index(h), q_desc.block_type.nbytes)
        _tma_load(q_desc, [row0 + off_m + h * BLOCK_H, 0], q_bars.index(h), q_smem.index(h))
    for j in range(n_tiles):
        s = j % STAGES
        # a fresh mbarrier counts as having completed the phase before its first: the first round passes
        mbarrier.wait(empty_bars.index(s), ((j // STAGES) & 1) ^ 1)
        mbarrier.expect(k_bars.index(s), k_desc.block_type.nbytes)
        _tma_load(k_desc, [row0 + j * BLOCK_N, 0], k_bars.index(s), k_smem.index(s))
        mbarrier.expect(v_bars.index(s), v_desc.block_type.nbytes)
        _tma_load(v_desc, [row0 + j * BLOCK_N, 0], v_bars.index(s), v_smem.index(s))


@gluon.jit
def _ws_consume(
    q, q_bar, k_smem, v_smem, k_bars, v_bars, empty_bars, o_desc, L, qk_scale, row0, r0, n_tiles, my_turn, their_turn,
    PINGPONG: gl.constexpr,
):  # fmt: skip
    """One consumer warpgroup: 64 query rows from r0 (their tile in `q`), with in-warpgroup overlap
    (S_j on the tensor cores, then P_(j-1) V_(j-1) behind it, the softmax of S_j while that runs).
    It frees a ring stage once both of its matrix products have read it. PINGPONG: FlashAttention-3's
    schedule across warpgroups, each issuing its matrix products only after the other has issued its
    own (turns passed through the `my_turn` / `their_turn` mbarriers), so one warpgroup's products run
    while the other computes its softmax."""
    BLOCK_H: gl.constexpr = q.type.shape[0]
    HEAD_DIM: gl.constexpr = q.type.shape[1]
    BLOCK_N: gl.constexpr = k_smem.type.shape[1]
    STAGES: gl.constexpr = k_smem.type.shape[0]
    dtype: gl.constexpr = q.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    n_full = r0 // BLOCK_N  # key tiles wholly below every row of this half: no mask
    m_i = gl.full([BLOCK_H], -float("inf"), gl.float32, row_s)
    l_i = gl.zeros([BLOCK_H], gl.float32, row_s)
    acc = gl.zeros([BLOCK_H, HEAD_DIM], gl.float32, o_layout)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    if PINGPONG:
        mbarrier.wait(my_turn, 0)
    s_tok = warpgroup_mma(
        q, k_smem.index(0).permute((1, 0)), gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout),
        use_acc=False, is_async=True,
    )  # fmt: skip
    if PINGPONG:
        mbarrier.arrive(their_turn, count=1)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, n_full == 0, r0, 0, BLOCK_H, BLOCK_N)
    p_prev = gl.convert_layout(p.to(dtype), p_layout)
    for j in range(1, n_tiles):
        stage = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bars.index(stage), (j // STAGES) & 1)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        if PINGPONG:
            mbarrier.wait(my_turn, j & 1)
        s_tok = warpgroup_mma(
            q, k_smem.index(stage).permute((1, 0)), gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout),
            use_acc=False, is_async=True,
        )  # fmt: skip
        o_tok = warpgroup_mma(p_prev, v_smem.index(prev), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(their_turn, count=1)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        p, m_i, l_i, alpha = _softmax_tile(s, m_i, l_i, qk_scale, j >= n_full, r0, j * BLOCK_N, BLOCK_H, BLOCK_N)
        acc, p_prev = warpgroup_mma_wait(0, deps=(o_tok, p_prev))
        mbarrier.arrive(empty_bars.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        p_prev = gl.convert_layout(p.to(dtype), p_layout)
    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_bars.index(last), ((n_tiles - 1) // STAGES) & 1)
    if PINGPONG:
        mbarrier.wait(my_turn, n_tiles & 1)
    o_tok = warpgroup_mma(p_prev, v_smem.index(last), acc, is_async=True)
    if PINGPONG:
        mbarrier.arrive(their_turn, count=1)
    acc = warpgroup_mma_wait(0, deps=(o_tok,))

    l_o = gl.convert_layout(l_i, row_o)
    out = (acc / l_o[:, None]).to(dtype)
    rows = r0 + gl.arange(0, BLOCK_H, layout=row_s)
    gl.store(L + row0 + rows, (m_i + gl.log2(l_i)) * 0.6931471805599453)
    q.store(out)  # this half's queries are no longer needed: the buffer stages O for the TMA store
    fence_async_shared()
    _tma_store(o_desc, [row0 + r0, 0], q)
    tma.store_wait(pendings=0)


@gluon.jit
def _ws_consumer(
    q, q_bar, k_smem, v_smem, k_bars, v_bars, empty_bars, o_desc, L, qk_scale, row0, r0, n_tiles, my_turn, their_turn
):
    """A worker partition takes no constexpr argument in Triton 3.6: one wrapper per PINGPONG value."""
    _ws_consume(
        q,
        q_bar,
        k_smem,
        v_smem,
        k_bars,
        v_bars,
        empty_bars,
        o_desc,
        L,
        qk_scale,
        row0,
        r0,
        n_tiles,
        my_turn,
        their_turn,
        False,
    )


@gluon.jit
def _ws_consumer_pingpong(
    q, q_bar, k_smem, v_smem, k_bars, v_bars, empty_bars, o_desc, L, qk_scale, row0, r0, n_tiles, my_turn, their_turn
):
    _ws_consume(
        q,
        q_bar,
        k_smem,
        v_smem,
        k_bars,
        v_bars,
        empty_bars,
        o_desc,
        L,
        qk_scale,
        row0,
        r0,
        n_tiles,
        my_turn,
        their_turn,
        True,
    )


@gluon.jit
def gluon_attn_fwd_ws_kernel(
    q_desc, k_desc, v_desc, o_desc, L, qk_scale, n_ctx,
    CAUSAL: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, PINGPONG: gl.constexpr,
    num_warps: gl.constexpr,
):  # fmt: skip
    """FlashAttention-3's forward shape: a producer warp issues the TMA loads; two consumer warpgroups
    (the default partition and one worker, 64 query rows each) share every key/value tile, so one
    warpgroup's softmax can run while the other's matrix products keep the tensor cores busy; with
    PINGPONG they take turns at issuing their products."""
    BLOCK_H: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    BLOCK_M: gl.constexpr = 2 * BLOCK_H
    dtype: gl.constexpr = q_desc.dtype

    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)  # longest causal tiles first
    row0 = gl.program_id(1) * n_ctx
    off_m = pid_m * BLOCK_M
    if CAUSAL:
        n_tiles = (off_m + BLOCK_M) // BLOCK_N
    else:
        n_tiles = n_ctx // BLOCK_N

    q_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_H, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(turn_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=2)  # both consumer warpgroups release a stage

    bufs = (q_smem, k_smem, v_smem, q_bars, k_bars, v_bars, empty_bars)
    ring = (k_smem, v_smem, k_bars, v_bars, empty_bars)
    out = (o_desc, L, qk_scale, row0)
    first = (q_smem.index(0), q_bars.index(0)) + ring + out + (off_m, n_tiles, turn_bars.index(0), turn_bars.index(1))
    second = (q_smem.index(1), q_bars.index(1)) + ring + out + (off_m + BLOCK_H, n_tiles, turn_bars.index(1))
    second = second + (turn_bars.index(0),)
    loader = (q_desc, k_desc, v_desc) + bufs + (row0, off_m, n_tiles)
    if PINGPONG:
        mbarrier.arrive(turn_bars.index(0), count=1)  # the first warpgroup has the first turn
        gl.warp_specialize(
            [(_ws_consumer_pingpong, first), (_ws_consumer_pingpong, second), (_ws_loader, loader)],
            [4, 1],
            [CONSUMER_REGS, 24],
        )
    else:
        gl.warp_specialize(
            [(_ws_consumer, first), (_ws_consumer, second), (_ws_loader, loader)], [4, 1], [CONSUMER_REGS, 24]
        )


def _layouts(block_m: int, block_n: int, head_dim: int):
    return (
        gl.NVMMASharedLayout.get_default_for([block_m, head_dim], gl.bfloat16),
        gl.NVMMASharedLayout.get_default_for([block_n, head_dim], gl.bfloat16),
    )


def attention_forward(q, k, v, causal: bool, *, block_m=128, block_n=128, stages=2, num_warps=8):
    """(O, L) of (batch, n, d) bf16 tensors, as our Triton forward returns them."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    batch, n, d = q.shape
    if q.dtype != torch.bfloat16 or n % block_m or n % block_n or d not in (64, 128) or k.shape != q.shape:
        raise ValueError(f"probe limits: bf16, n a multiple of the tiles, d 64 or 128, equal lengths; got {q.shape}")
    if block_m % block_n:
        # the kernel counts whole key tiles up to the diagonal: a query tile narrower than a key tile
        # would have none in its first tile and wait for a load never issued
        raise ValueError(f"probe limits: block_m ({block_m}) must be a multiple of block_n ({block_n})")
    q2, k2, v2 = (t.reshape(batch * n, d) for t in (q, k, v))
    o = torch.empty_like(q)
    lse = torch.empty(batch, n, device=q.device, dtype=torch.float32)
    q_layout, kv_layout = _layouts(block_m, block_n, d)
    q_desc = TensorDescriptor.from_tensor(q2, [block_m, d], q_layout)
    o_desc = TensorDescriptor.from_tensor(o.view(batch * n, d), [block_m, d], q_layout)
    k_desc = TensorDescriptor.from_tensor(k2, [block_n, d], kv_layout)
    v_desc = TensorDescriptor.from_tensor(v2, [block_n, d], kv_layout)
    qk_scale = LOG2E / math.sqrt(d)
    gluon_attn_fwd_kernel[(n // block_m, batch)](
        q_desc, k_desc, v_desc, o_desc, lse, qk_scale, n, CAUSAL=causal, STAGES=stages, num_warps=num_warps
    )
    return o, lse


def attention_forward_ws(q, k, v, causal: bool, *, block_n=128, stages=2, consumer_regs=240, pingpong=False):
    """(O, L) from the warp-specialised kernel: 128 query rows per CTA, two consumer warpgroups."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    batch, n, d = q.shape
    block_m = 128
    if q.dtype != torch.bfloat16 or n % block_m or n % block_n or d not in (64, 128) or k.shape != q.shape:
        raise ValueError(f"probe limits: bf16, n a multiple of the tiles, d 64 or 128, equal lengths; got {q.shape}")
    if block_m % block_n:
        raise ValueError(f"probe limits: 128 query rows must be a multiple of block_n ({block_n})")
    q2, k2, v2 = (t.reshape(batch * n, d) for t in (q, k, v))
    o = torch.empty_like(q)
    lse = torch.empty(batch, n, device=q.device, dtype=torch.float32)
    h_layout, kv_layout = _layouts(block_m // 2, block_n, d)
    q_desc = TensorDescriptor.from_tensor(q2, [block_m // 2, d], h_layout)
    o_desc = TensorDescriptor.from_tensor(o.view(batch * n, d), [block_m // 2, d], h_layout)
    k_desc = TensorDescriptor.from_tensor(k2, [block_n, d], kv_layout)
    v_desc = TensorDescriptor.from_tensor(v2, [block_n, d], kv_layout)
    gluon_attn_fwd_ws_kernel[(n // block_m, batch)](
        q_desc, k_desc, v_desc, o_desc, lse, LOG2E / math.sqrt(d), n,
        CAUSAL=causal, STAGES=stages, CONSUMER_REGS=consumer_regs, PINGPONG=pingpong, num_warps=4,
        maxnreg=ws_maxnreg(consumer_regs),
    )  # fmt: skip
    return o, lse


def ws_maxnreg(consumer_regs: int) -> int:
    """The kernel-wide register limit that leaves `consumer_regs` to each consumer warpgroup: Hopper
    reallocates registers per warpgroup (setmaxnreg), and the loader's warp takes a warpgroup of 24."""
    return -(-(2 * consumer_regs + 24) // 24) * 8


def compile_only(
    head_dim: int, block_n: int, stages: int, *, block_m=128, num_warps=8, consumer_regs=None, pingpong=False
):
    """Build a kernel for sm_90 without a GPU: registers and stack (spills) per thread, shared bytes.
    `consumer_regs` set: the warp-specialised kernel (its query halves are 64 rows)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    ws = consumer_regs is not None
    q_rows = 64 if ws else block_m
    q_layout, kv_layout = _layouts(q_rows, block_n, head_dim)
    signature = {
        "q_desc": f"tensordesc<bf16[{q_rows}, {head_dim}],{q_layout!r}>",
        "k_desc": f"tensordesc<bf16[{block_n}, {head_dim}],{kv_layout!r}>",
        "v_desc": f"tensordesc<bf16[{block_n}, {head_dim}],{kv_layout!r}>",
        "o_desc": f"tensordesc<bf16[{q_rows}, {head_dim}],{q_layout!r}>",
        "L": "*fp32",
        "qk_scale": "fp32",
        "n_ctx": "i32",
        "CAUSAL": "constexpr",
        "STAGES": "constexpr",
    }
    constexprs = {"CAUSAL": True, "STAGES": stages}
    options = dict(num_warps=4 if ws else num_warps)
    if ws:
        signature["CONSUMER_REGS"] = signature["PINGPONG"] = "constexpr"
        constexprs.update(CONSUMER_REGS=consumer_regs, PINGPONG=pingpong)
        options["maxnreg"] = ws_maxnreg(consumer_regs)
    signature["num_warps"] = "constexpr"
    constexprs["num_warps"] = options["num_warps"]
    kernel_fn = gluon_attn_fwd_ws_kernel if ws else gluon_attn_fwd_kernel
    source = GluonASTSource(kernel_fn, signature, constexprs=constexprs, attrs={(4,): [["tt.divisibility", 16]]})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from flash_probe_aot import resources

    return resources(kernel)


CONFIGS = [  # (block_m, block_n, stages, num_warps): one CTA of 128 rows per SM, or two or more of 64 rows
    (128, 128, 2, 8),
    (128, 64, 3, 8),
    (128, 128, 3, 8),
    (128, 64, 2, 8),
    (64, 64, 2, 4),
    (64, 64, 3, 4),
]
WS_CONFIGS = {  # head dim: (block_n, stages, ping-pong) of the warp-specialised kernel
    64: [(128, 3, False), (128, 3, True), (128, 2, True), (128, 4, True), (64, 3, True)],
    128: [(64, 3, False), (64, 3, True), (64, 4, True), (128, 2, True), (128, 2, False)],
}
WS_CONSUMER_REGS = 240


def _variants(d: int):
    """(name, row of settings, function of (q, k, v)) for every Gluon kernel configuration timed at d."""
    for bn, stages, pingpong in WS_CONFIGS[d]:
        name = f"gluon ws{' pingpong' if pingpong else ''} 128x{bn} s{stages}"
        row = dict(block_m=128, block_n=bn, stages=stages, warp_specialized=True, pingpong=pingpong)
        row["consumer_regs"] = WS_CONSUMER_REGS
        kernel = functools.partial(
            attention_forward_ws, block_n=bn, stages=stages, consumer_regs=WS_CONSUMER_REGS, pingpong=pingpong
        )
        yield name, row, kernel
    for bm, bn, stages, warps in CONFIGS:
        name = f"gluon {bm}x{bn} s{stages} w{warps}"
        row = {"block_m": bm, "block_n": bn, "stages": stages, "num_warps": warps, "warp_specialized": False}
        yield name, row, functools.partial(attention_forward, block_m=bm, block_n=bn, stages=stages, num_warps=warps)


def run_gpu(rep_ms: int, out_path: str, head_dims=(64, 128)) -> dict:
    import torch
    from triton.testing import do_bench

    from lmperf.benchmarks.flash import IMPLEMENTATIONS, make_inputs
    from lmperf.flash.triton_forward import flash_forward

    results = {"device": torch.cuda.get_device_name(), "rows": []}
    batch, n = 16, 16384
    for d in head_dims:
        q, k, v, _ = make_inputs(batch, n, d, torch.bfloat16)
        q, k, v = (t.detach() for t in (q, k, v))
        flops = 4 * batch * n * n * d / 2
        o_ref, l_ref = flash_forward(q, k, v, True)
        for name, fn in (
            ("ours_triton", functools.partial(flash_forward, q, k, v, True)),
            ("sdpa_cudnn", functools.partial(IMPLEMENTATIONS["sdpa_cudnn"], q, k, v, True)),
        ):
            ms = do_bench(fn, warmup=200, rep=rep_ms, return_mode="median")
            results["rows"].append({"impl": name, "head_dim": d, "ms": ms, "tflops": flops / ms / 1e9})
            print(f"d={d:3d} {name:28s} {ms:.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s", flush=True)
        for name, settings, forward in _variants(d):
            row = {"impl": name, "head_dim": d, **settings}
            try:
                o, lse = forward(q, k, v, True)
                torch.cuda.synchronize()
                row["o_rel_diff"] = ((o.float() - o_ref.float()).norm() / o_ref.float().norm()).item()
                row["l_max_abs_diff"] = (lse - l_ref.reshape(lse.shape)).abs().max().item()
                ms = do_bench(functools.partial(forward, q, k, v, True), warmup=200, rep=rep_ms, return_mode="median")
                row.update(ms=ms, tflops=flops / ms / 1e9)
                print(
                    f"d={d:3d} {name:28s} {ms:.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s  "
                    f"O rel diff {row['o_rel_diff']:.2e}  L max diff {row['l_max_abs_diff']:.2e}",
                    flush=True,
                )
            except Exception as e:  # a config that does not build or fit is a result of the probe
                row["error"] = f"{type(e).__name__}: {e}"[:400]
                print(f"d={d:3d} {name:28s} ERROR {row['error']}", flush=True)
            results["rows"].append(row)
            with open(out_path, "w") as fh:
                json.dump(results, fh, indent=1)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--rep-ms", type=int, default=500)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "flash_gluon_fwd.json"))
    args = parser.parse_args(argv)
    if args.compile_only:
        for d in (64, 128):
            builds = [((bn, st), dict(consumer_regs=WS_CONSUMER_REGS, pingpong=pp)) for bn, st, pp in WS_CONFIGS[d]]
            builds += [((bn, st), dict(block_m=bm, num_warps=w)) for bm, bn, st, w in CONFIGS]
            for args_, kwargs in builds:
                try:
                    print(d, args_, kwargs, compile_only(d, *args_, **kwargs), flush=True)
                except Exception as e:
                    print(d, args_, kwargs, "ERROR", type(e).__name__, str(e)[:2000], flush=True)
        return
    run_gpu(args.rep_ms, args.out, [int(d) for d in args.head_dims.split(",")])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
