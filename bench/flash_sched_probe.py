"""Probe (issue 12): persistent scheduling and register limits for our three FlashAttention-2 passes.

Issue 12 names five things Hopper offers through Triton. Three were measured (bench/flash_notes.md:
TMA descriptors, warp specialisation, exp2 scaling); two never were:

- **Persistent scheduling.** Our kernels launch one program per tile (2,048 forward programs at the
  leaderboard's 16 x 16384 with 128-query tiles) and let the hardware hand each SM the next one. Here
  the forward, dQ and dK/dV passes run as persistent kernels instead: as many programs as the SMs hold
  (`waves` per SM), each looping over tiles, longest causal tiles first, either in a fixed order
  (`stride`: item pid, pid + P, ...; `zigzag`: the same with every second round mirrored, so a program
  that took a long tile in one round takes a short one in the next) or `dynamic` (a global counter
  handed out with an atomic add: the next free program takes the next longest tile). Each tile is the
  same computation as our kernel's (our loops, imported from lmperf.flash), so outputs must match ours
  exactly.
- **Register limits** (`maxnreg`, PTX's .maxnreg): our tuned configs with each thread capped at fewer
  registers, so more programs can share an SM where shared memory allows (our d = 64 dK/dV tiles use
  about 182 registers at 4 warps: 2 programs per SM; 168 gives 3, 128 gives 4), at the risk of spills.

Everything at the leaderboard's inputs (16 x 16384 x d, causal, bf16), our tuned tiles (the committed
table of the running device) for every variant. Every candidate's output is checked against our
kernel's (relative difference below MAX_REL_DIFF) before it is timed; candidates are timed in
`--rounds` interleaved rounds (do_bench medians, rep `--rep-ms`), the order reversed every second
round. The registers and spills of every binary built are recorded. Kernels are compiled first in
`--workers` processes side by side (Triton's on-disk cache then serves the timed process).

    python bench/flash_sched_probe.py --head-dims 64 128             # on a GPU; writes $OUT/flash_sched.json
    python bench/flash_sched_probe.py --leaderboard 200              # the course's protocol, with and without
    TRITON_INTERPRET=1 python bench/flash_sched_probe.py --check-only  # on CPU: small ragged shapes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

from lmperf.flash.triton_backward import _dkdv_query_loop, _dq_key_loop
from lmperf.flash.triton_common import (
    LN2,
    LOG2E,
    block_d,
    dot_precision,
    load_rows,
    load_tile,
    store_tile,
    streamed_rows,
    use_tma,
)
from lmperf.flash.triton_forward import _fwd_key_loop

SHAPE = (16, 16384)  # batch, length: the leaderboard's
SCHEDULES = {"stride": 0, "zigzag": 1, "dynamic": 2}
WAVES = (1, 2)  # persistent programs per SM
MAXNREG = (200, 168, 128)
# the largest relative difference (norm) from our kernels' outputs for a candidate to be timed
MAX_REL_DIFF = 5e-3


# ---------------------------------------------------------------------------------------------------
# Scheduling: which work item a program takes next.


@triton.jit
def _static_item(i, pid, n_prog, total, SCHEDULE: tl.constexpr):
    """The item a program takes at its i-th turn: pid + i * n_prog, every second full round mirrored
    for `zigzag`."""
    item = i * n_prog + pid
    if SCHEDULE == 1:
        if (i % 2 == 1) & ((i + 1) * n_prog <= total):
            item = i * n_prog + (n_prog - 1 - pid)
    return item


# ---------------------------------------------------------------------------------------------------
# One tile of each pass: the body of our kernels (lmperf.flash.triton_forward, triton_backward), for a
# given (batch element, tile) instead of program ids. Copied, not shared: moving our kernels' bodies into
# such helpers changes their code version, which re-measures every record of our kernels on both devices;
# that belongs with a change that wins. The loops inside are ours, imported.


@triton.jit
def _fwd_tile(
    Q, K, V, O, L, b, tile_m,
    stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn, stride_ob, stride_on,
    n_queries, n_keys, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
):  # fmt: skip
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
    n_keys_full = (n_keys // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        hi_unmasked = tl.minimum(start_m, n_keys_full)
        hi = tl.minimum(start_m + BLOCK_M, n_keys)
    else:
        hi_unmasked = n_keys_full
        hi = n_keys
    acc, l_i, m_i = _fwd_key_loop(
        acc, l_i, m_i, q, stride_kn, stride_vn, k_rows, v_rows, offs_m, offs_d, d_ok, 0, hi_unmasked, n_keys,
        qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, False, IS_CAUSAL, PRECISION, False, USE_TMA,
    )  # fmt: skip
    acc, l_i, m_i = _fwd_key_loop(
        acc, l_i, m_i, q, stride_kn, stride_vn, k_rows, v_rows, offs_m, offs_d, d_ok, hi_unmasked, hi, n_keys,
        qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, True, IS_CAUSAL, PRECISION, False, USE_TMA,
    )  # fmt: skip
    o = acc / l_i[:, None]
    lse = (m_i + tl.math.log2(l_i)) * LN2
    store_tile(O + b * stride_ob + offs_m[:, None] * stride_on + offs_d[None, :], o.to(O.dtype.element_ty), q_ok, d_ok, HEAD_DIM != BLOCK_D)  # fmt: skip
    tl.store(L + b * n_queries + offs_m, lse, mask=q_ok)


@triton.jit
def _dq_tile(
    Q, K, V, DO, L, Delta, DQ, b, tile_m,
    stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn, stride_dob, stride_don, stride_dqb, stride_dqn,
    n_queries, n_keys, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, USE_TMA: tl.constexpr,
):  # fmt: skip
    start_m = tile_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q_ok = offs_m < n_queries
    q = load_tile(
        Q + b * stride_qb + offs_m[:, None] * stride_qn + offs_d[None, :], q_ok, d_ok, True, HEAD_DIM != BLOCK_D
    )
    do = load_tile(DO + b * stride_dob + offs_m[:, None] * stride_don + offs_d[None, :], q_ok, d_ok, True, HEAD_DIM != BLOCK_D)  # fmt: skip
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
    dq = _dq_key_loop(
        dq, q, do, lse_log2, delta, k_rows, v_rows, stride_kn, stride_vn, offs_m, offs_d, d_ok, 0, hi_unmasked,
        n_keys, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, False, IS_CAUSAL, PRECISION, USE_TMA,
    )  # fmt: skip
    dq = _dq_key_loop(
        dq, q, do, lse_log2, delta, k_rows, v_rows, stride_kn, stride_vn, offs_m, offs_d, d_ok, hi_unmasked, hi,
        n_keys, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, True, IS_CAUSAL, PRECISION, USE_TMA,
    )  # fmt: skip
    dq = dq * sm_scale
    store_tile(DQ + b * stride_dqb + offs_m[:, None] * stride_dqn + offs_d[None, :], dq.to(DQ.dtype.element_ty), q_ok, d_ok, HEAD_DIM != BLOCK_D)  # fmt: skip


@triton.jit
def _dkdv_tile(
    Q, K, V, DO, L, Delta, DK, DV, b, tile_n,
    stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn, stride_dob, stride_don,
    stride_dkb, stride_dkn, stride_dvb, stride_dvn,
    n_queries, n_keys, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, USE_TMA: tl.constexpr, DP_FIRST: tl.constexpr,
):  # fmt: skip
    start_n = tile_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    k_ok = offs_n < n_keys
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
    n_queries_full = (n_queries // BLOCK_M) * BLOCK_M
    if IS_CAUSAL:
        dk, dv = _dkdv_query_loop(
            dk, dv, k, v, q_rows, do_rows, l_base, delta_base, stride_qn, stride_don, offs_n, offs_d, d_ok,
            start_n, tl.minimum(start_n + BLOCK_N, n_queries), n_queries, qk_scale,
            HEAD_DIM, BLOCK_D, BLOCK_M, True, IS_CAUSAL, PRECISION, USE_TMA, DP_FIRST,
        )  # fmt: skip
        lo_unmasked = start_n + BLOCK_N
    else:
        lo_unmasked = 0
    dk, dv = _dkdv_query_loop(
        dk, dv, k, v, q_rows, do_rows, l_base, delta_base, stride_qn, stride_don, offs_n, offs_d, d_ok,
        lo_unmasked, n_queries_full, n_queries, qk_scale,
        HEAD_DIM, BLOCK_D, BLOCK_M, False, IS_CAUSAL, PRECISION, USE_TMA, DP_FIRST,
    )  # fmt: skip
    dk, dv = _dkdv_query_loop(
        dk, dv, k, v, q_rows, do_rows, l_base, delta_base, stride_qn, stride_don, offs_n, offs_d, d_ok,
        tl.maximum(lo_unmasked, n_queries_full), n_queries, n_queries, qk_scale,
        HEAD_DIM, BLOCK_D, BLOCK_M, True, IS_CAUSAL, PRECISION, USE_TMA, DP_FIRST,
    )  # fmt: skip
    dk = dk * sm_scale
    store_tile(DK + b * stride_dkb + offs_n[:, None] * stride_dkn + offs_d[None, :], dk.to(DK.dtype.element_ty), k_ok, d_ok, HEAD_DIM != BLOCK_D)  # fmt: skip
    store_tile(DV + b * stride_dvb + offs_n[:, None] * stride_dvn + offs_d[None, :], dv.to(DV.dtype.element_ty), k_ok, d_ok, HEAD_DIM != BLOCK_D)  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# The persistent kernels. Work item -> (batch element, tile), longest causal tiles first: for the
# forward and dQ the last query tiles, for dK/dV the first key tiles. Items of one rank are the batch's.


@triton.jit
def _tile_of(item, batch, n_tiles, LAST_FIRST: tl.constexpr):
    rank = item // batch
    b = (item % batch).to(tl.int64)
    tile = n_tiles - 1 - rank if LAST_FIRST else rank
    return b, tile


@triton.jit(do_not_specialize=["n_queries", "n_keys", "batch"])
def fwd_persistent_kernel(
    Q, K, V, O, L, Counter,
    stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn, stride_ob, stride_on,
    n_queries, n_keys, batch, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, USE_TMA: tl.constexpr, SCHEDULE: tl.constexpr,
):  # fmt: skip
    """Grid (programs,); Counter: one int32, zero (SCHEDULE 2 only)."""
    qk_scale = tl.cast(qk_scale, tl.float32)
    n_tiles = tl.cdiv(n_queries, BLOCK_M)
    total = n_tiles * batch
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    if SCHEDULE == 2:
        item = pid
        while item < total:
            b, tile_m = _tile_of(item, batch, n_tiles, IS_CAUSAL)
            _fwd_tile(
                Q, K, V, O, L, b, tile_m, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
                stride_ob, stride_on, n_queries, n_keys, qk_scale,
                HEAD_DIM, BLOCK_D, IS_CAUSAL, BLOCK_M, BLOCK_N, PRECISION, USE_TMA,
            )  # fmt: skip
            item = tl.atomic_add(Counter, 1) + n_prog
    else:
        for i in range(0, tl.cdiv(total - pid, n_prog)):
            b, tile_m = _tile_of(_static_item(i, pid, n_prog, total, SCHEDULE), batch, n_tiles, IS_CAUSAL)
            _fwd_tile(
                Q, K, V, O, L, b, tile_m, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn,
                stride_ob, stride_on, n_queries, n_keys, qk_scale,
                HEAD_DIM, BLOCK_D, IS_CAUSAL, BLOCK_M, BLOCK_N, PRECISION, USE_TMA,
            )  # fmt: skip


@triton.jit(do_not_specialize=["n_queries", "n_keys", "batch"])
def dq_persistent_kernel(
    Q, K, V, DO, L, Delta, DQ, Counter,
    stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn, stride_dob, stride_don, stride_dqb, stride_dqn,
    n_queries, n_keys, batch, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, USE_TMA: tl.constexpr, SCHEDULE: tl.constexpr,
):  # fmt: skip
    qk_scale = tl.cast(qk_scale, tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)
    n_tiles = tl.cdiv(n_queries, BLOCK_M)
    total = n_tiles * batch
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    if SCHEDULE == 2:
        item = pid
        while item < total:
            b, tile_m = _tile_of(item, batch, n_tiles, IS_CAUSAL)
            _dq_tile(
                Q, K, V, DO, L, Delta, DQ, b, tile_m, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb,
                stride_vn, stride_dob, stride_don, stride_dqb, stride_dqn, n_queries, n_keys, qk_scale, sm_scale,
                HEAD_DIM, BLOCK_D, IS_CAUSAL, BLOCK_M, BLOCK_N, PRECISION, USE_TMA,
            )  # fmt: skip
            item = tl.atomic_add(Counter, 1) + n_prog
    else:
        for i in range(0, tl.cdiv(total - pid, n_prog)):
            b, tile_m = _tile_of(_static_item(i, pid, n_prog, total, SCHEDULE), batch, n_tiles, IS_CAUSAL)
            _dq_tile(
                Q, K, V, DO, L, Delta, DQ, b, tile_m, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb,
                stride_vn, stride_dob, stride_don, stride_dqb, stride_dqn, n_queries, n_keys, qk_scale, sm_scale,
                HEAD_DIM, BLOCK_D, IS_CAUSAL, BLOCK_M, BLOCK_N, PRECISION, USE_TMA,
            )  # fmt: skip


@triton.jit(do_not_specialize=["batch"])
def dkdv_persistent_kernel(
    Q, K, V, DO, L, Delta, DK, DV, Counter,
    stride_qb, stride_qn, stride_kb, stride_kn, stride_vb, stride_vn, stride_dob, stride_don,
    stride_dkb, stride_dkn, stride_dvb, stride_dvn,
    n_queries, n_keys, batch, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, USE_TMA: tl.constexpr, DP_FIRST: tl.constexpr,
    SCHEDULE: tl.constexpr,
):  # fmt: skip
    """Lengths specialised, as our dK/dV kernel's."""
    qk_scale = tl.cast(qk_scale, tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)
    n_tiles = tl.cdiv(n_keys, BLOCK_N)
    total = n_tiles * batch
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    if SCHEDULE == 2:
        item = pid
        while item < total:
            b, tile_n = _tile_of(item, batch, n_tiles, False)
            _dkdv_tile(
                Q, K, V, DO, L, Delta, DK, DV, b, tile_n, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb,
                stride_vn, stride_dob, stride_don, stride_dkb, stride_dkn, stride_dvb, stride_dvn,
                n_queries, n_keys, qk_scale, sm_scale,
                HEAD_DIM, BLOCK_D, IS_CAUSAL, BLOCK_M, BLOCK_N, PRECISION, USE_TMA, DP_FIRST,
            )  # fmt: skip
            item = tl.atomic_add(Counter, 1) + n_prog
    else:
        for i in range(0, tl.cdiv(total - pid, n_prog)):
            b, tile_n = _tile_of(_static_item(i, pid, n_prog, total, SCHEDULE), batch, n_tiles, False)
            _dkdv_tile(
                Q, K, V, DO, L, Delta, DK, DV, b, tile_n, stride_qb, stride_qn, stride_kb, stride_kn, stride_vb,
                stride_vn, stride_dob, stride_don, stride_dkb, stride_dkn, stride_dvb, stride_dvn,
                n_queries, n_keys, qk_scale, sm_scale,
                HEAD_DIM, BLOCK_D, IS_CAUSAL, BLOCK_M, BLOCK_N, PRECISION, USE_TMA, DP_FIRST,
            )  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# Launchers


def _persistent_config(config: dict, tensors) -> tuple[dict, int, int]:
    """(launch config without the probe's own keys, schedule, waves)."""
    config = dict(config)
    schedule = SCHEDULES[config.pop("SCHEDULE")]
    waves = config.pop("WAVES")
    config.pop("BATCH_FIRST", None)  # the persistent order already takes every batch's longest tiles first
    config.pop("WARP_SPECIALIZE", None)  # not in the persistent forward (the H200's d = 128 table has it)
    return use_tma(config, *tensors), schedule, waves


# Every persistent launch zeroes a fresh work counter (one small memset, a few microseconds of the 1-4 ms
# timed, for the static schedules too), as a real launch would have to.


def _programs(total: int, waves: int, device) -> int:
    if device.type != "cuda":
        return min(total, 3)  # interpreter: a few programs, each with several items
    return min(total, waves * torch.cuda.get_device_properties(device).multi_processor_count)


def launch_fwd_persistent(q, k, v, o, lse, is_causal: bool, config: dict, precision: str):
    config, schedule, waves = _persistent_config(config, (k, v))
    batch, n_q, d = q.shape
    total = triton.cdiv(n_q, config["BLOCK_M"]) * batch
    counter = torch.zeros(1, dtype=torch.int32, device=q.device)
    return fwd_persistent_kernel[(_programs(total, waves, q.device),)](
        q, k, v, o, lse, counter, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        o.stride(0), o.stride(1), n_q, k.shape[1], batch, LOG2E / math.sqrt(d),
        HEAD_DIM=d, BLOCK_D=block_d(d), IS_CAUSAL=bool(is_causal), PRECISION=precision, SCHEDULE=schedule, **config,
    )  # fmt: skip


def launch_dq_persistent(q, k, v, do, lse, delta, dq, is_causal: bool, config: dict, precision: str):
    config, schedule, waves = _persistent_config(config, (k, v))
    batch, n_q, d = q.shape
    total = triton.cdiv(n_q, config["BLOCK_M"]) * batch
    counter = torch.zeros(1, dtype=torch.int32, device=q.device)
    sm_scale = 1.0 / math.sqrt(d)
    return dq_persistent_kernel[(_programs(total, waves, q.device),)](
        q, k, v, do, lse, delta, dq, counter, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), do.stride(0), do.stride(1), dq.stride(0), dq.stride(1), n_q, k.shape[1], batch,
        sm_scale * LOG2E, sm_scale,
        HEAD_DIM=d, BLOCK_D=block_d(d), IS_CAUSAL=bool(is_causal), PRECISION=precision, SCHEDULE=schedule, **config,
    )  # fmt: skip


def launch_dkdv_persistent(q, k, v, do, lse, delta, dk, dv, is_causal: bool, config: dict, precision: str):
    config, schedule, waves = _persistent_config(config, (q, k, v, do))
    config.setdefault("DP_FIRST", False)
    batch, n_q, d = q.shape
    n_k = k.shape[1]
    total = triton.cdiv(n_k, config["BLOCK_N"]) * batch
    counter = torch.zeros(1, dtype=torch.int32, device=q.device)
    sm_scale = 1.0 / math.sqrt(d)
    return dkdv_persistent_kernel[(_programs(total, waves, q.device),)](
        q, k, v, do, lse, delta, dk, dv, counter, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), do.stride(0), do.stride(1), dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
        n_q, n_k, batch, sm_scale * LOG2E, sm_scale,
        HEAD_DIM=d, BLOCK_D=block_d(d), IS_CAUSAL=bool(is_causal), PRECISION=precision, SCHEDULE=schedule, **config,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------------
# Candidates


def variants(configs: dict, maxnreg=MAXNREG, schedules=tuple(SCHEDULES), waves=WAVES) -> list[tuple[str, str, dict]]:
    """(pass, label, config) of every candidate: each pass's tuned config as it is, with each register
    limit, with one pipeline stage fewer (less shared memory, so another program may fit beside it) with
    and without the two lowest limits, and persistent with each schedule and number of programs per SM."""
    out = []
    for part in ("fwd", "dq", "dkdv"):
        tuned = configs[part]
        out.append((part, "ours", dict(tuned)))
        out += [(part, f"maxnreg {r}", {**tuned, "maxnreg": r}) for r in maxnreg]
        if maxnreg and tuned["num_stages"] > 2:
            fewer = {**tuned, "num_stages": tuned["num_stages"] - 1}
            out.append((part, f"{fewer['num_stages']} stages", fewer))
            out += [(part, f"{fewer['num_stages']} stages, maxnreg {r}", {**fewer, "maxnreg": r}) for r in maxnreg[-2:]]
        out += [(part, f"persistent {s} x{w}", {**tuned, "SCHEDULE": s, "WAVES": w}) for s in schedules for w in waves]
    return out


class Inputs:
    """The leaderboard's inputs (or small ones on CPU), our kernels' outputs as references, buffers."""

    def __init__(
        self, batch: int, n_q: int, n_k: int, d: int, device: str, dtype=torch.bfloat16, seed: int = 0, reference=True
    ):
        from lmperf.flash import flash_forward
        from lmperf.flash.triton_backward import flash_backward, launch_delta

        g = torch.Generator(device="cpu").manual_seed(seed)
        self.q = torch.randn(batch, n_q, d, generator=g).to(device, dtype)
        self.k, self.v = (torch.randn(batch, n_k, d, generator=g).to(device, dtype) for _ in range(2))
        self.do = torch.randn(batch, n_q, d, generator=g).to(device, dtype)
        self.precision = dot_precision(dtype)
        if reference:
            self.o, self.lse = flash_forward(self.q, self.k, self.v, True)
        else:  # only to build the candidates' binaries: any finite statistics do
            self.o, self.lse = torch.randn_like(self.q), torch.zeros(batch, n_q, device=device)
        self.delta = torch.empty(batch, n_q, device=device, dtype=torch.float32)  # D = rowsum(O * dO), as ours
        launch_delta(self.o, self.do, self.delta)
        if reference:
            self.ref = {"fwd": (self.o, self.lse)}
            dq, dk, dv = flash_backward(self.q, self.k, self.v, self.o, self.lse, self.do, True)
            self.ref["dq"], self.ref["dkdv"] = (dq,), (dk, dv)
        self.out = {
            "fwd": (torch.empty_like(self.o), torch.empty_like(self.lse)),
            "dq": (torch.empty_like(self.q),),
            "dkdv": (torch.empty_like(self.k), torch.empty_like(self.v)),
        }

    def launcher(self, part: str, config: dict):
        """A zero-argument callable launching one candidate into self.out[part]; returns the kernel."""
        from lmperf.flash import triton_backward as tb
        from lmperf.flash import triton_forward as tf

        q, k, v, do, lse, delta, precision = self.q, self.k, self.v, self.do, self.lse, self.delta, self.precision
        persistent = "SCHEDULE" in config
        if part == "fwd":
            o, lse_out = self.out["fwd"]
            launch = launch_fwd_persistent if persistent else tf.launch_forward
            return lambda: launch(q, k, v, o, lse_out, True, config, precision)
        if part == "dq":
            (dq,) = self.out["dq"]
            launch = launch_dq_persistent if persistent else tb.launch_dq
            return lambda: launch(q, k, v, do, lse, delta, dq, True, config, precision)
        dk, dv = self.out["dkdv"]
        launch = launch_dkdv_persistent if persistent else tb.launch_dkdv
        return lambda: launch(q, k, v, do, lse, delta, dk, dv, True, config, precision)

    def rel_diff(self, part: str) -> float:
        """The largest relative Frobenius difference of this pass's outputs from our kernels'."""
        return max(
            float((x.double() - r.double()).norm() / r.double().norm()) for x, r in zip(self.out[part], self.ref[part])
        )

    def clear(self, part: str) -> None:
        for t in self.out[part]:
            t.fill_(float("nan"))


def tuned_configs(inputs: Inputs) -> dict:
    from lmperf.flash import tuning

    return {
        part: tuning.choose(part, inputs.q, inputs.k, True, inputs.precision, None, ())
        for part in ("fwd", "dq", "dkdv")
    }


def resources(jit_fns) -> list[dict]:
    """Registers, spills and shared memory of every binary the given kernels have built."""
    rows = []
    for fn in jit_fns:
        for device_cache in getattr(fn, "device_caches", {}).values():
            for kernel in device_cache[0].values():
                meta = kernel.metadata
                rows.append(
                    {
                        "kernel": fn.__name__,
                        "constants": {
                            (fn.arg_names[k[0]] if isinstance(k, tuple) else str(k)): v
                            for k, v in getattr(getattr(kernel, "src", None), "constants", {}).items()
                            if isinstance(v, (int, bool, str))
                        },
                        "num_warps": meta.num_warps,
                        "num_stages": meta.num_stages,
                        "maxnreg": getattr(meta, "maxnreg", None),
                        "shared_bytes": meta.shared,
                        "registers": getattr(kernel, "n_regs", None),
                        "spills": getattr(kernel, "n_spills", None),
                    }
                )
    return rows


def _warm(args) -> None:
    """In a worker process: build (and run once) the given (pass, label, config) candidates on small
    inputs of the same specialisation (batch 16, lengths multiples of 16), so Triton's cache holds their
    binaries."""
    d, candidates = args
    inputs = Inputs(SHAPE[0], 256, 256, d, "cuda", reference=False)
    for part, label, config in candidates:
        try:
            inputs.launcher(part, config)()
        except Exception as exc:  # the timed process records the error
            print(f"warm {part} {label}: {type(exc).__name__}: {exc}", file=sys.stderr)
    torch.cuda.synchronize()


def run(
    d: int, rounds: int, rep_ms: int, workers: int, path: str, results: dict, device="cuda", batch=SHAPE[0], n=SHAPE[1]
) -> dict:
    from triton.testing import do_bench

    from lmperf.flash import triton_backward as tb
    from lmperf.flash import triton_forward as tf

    t0 = time.time()
    inputs = Inputs(batch, n, n, d, device)
    configs = tuned_configs(inputs)
    cands = variants(configs)
    entry = results.setdefault(f"d{d}", {"configs": configs})
    if workers > 1:
        chunks = [cands[i::workers] for i in range(workers)]
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            pool.map(_warm, [(d, chunk) for chunk in chunks if chunk])
    entry["warm_s"] = time.time() - t0
    timed, entry["rel_diff"], entry["errors"] = {}, {}, {}
    for part, label, config in cands:
        name = f"{part} {label}"
        try:
            fn = inputs.launcher(part, config)
            inputs.clear(part)
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # a candidate that does not build or launch is a result
            entry["errors"][name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            continue
        entry["rel_diff"][name] = inputs.rel_diff(part)
        if entry["rel_diff"][name] <= MAX_REL_DIFF:
            timed[name] = fn
    entry["compile_s"] = time.time() - t0 - entry["warm_s"]
    entry["resources"] = resources(
        [
            tf.flash_fwd_kernel,
            tb.flash_bwd_dq_kernel,
            tb.flash_bwd_dkdv_kernel,
            fwd_persistent_kernel,
            dq_persistent_kernel,
            dkdv_persistent_kernel,
        ]
    )
    entry["ms"] = {name: [] for name in timed}
    for r in range(rounds):
        names = list(timed)[:: -1 if r % 2 else 1]
        for name in names:
            entry["ms"][name].append(do_bench(timed[name], rep=rep_ms))
        entry["median_ms"] = {name: statistics.median(ms) for name, ms in entry["ms"].items()}
        entry["wall_s"] = time.time() - t0
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        print(f"d={d} round {r}", json.dumps({k: round(v, 4) for k, v in entry["median_ms"].items()}), flush=True)
    return entry


@contextlib.contextmanager
def register_limit(maxnreg: int | None, parts=("fwd", "dq")):
    """Inside the block, the tuner's choice for the given passes carries `maxnreg` (None: unchanged)."""
    from lmperf.flash import tuning

    original = tuning.choose

    def choose(kernel, *args, **kwargs):
        config = original(kernel, *args, **kwargs)
        return {**config, "maxnreg": maxnreg} if maxnreg and kernel in parts else config

    tuning.choose = choose
    try:
        yield
    finally:
        tuning.choose = original


def leaderboard(d: int, maxnreg: int, rounds: int, rep_ms: int, path: str, results: dict) -> dict:
    """The course's leaderboard protocol (torch.compile'd, forward+backward) at head dim d: SDPA's cuDNN
    backend, ours, and ours with the forward and dQ passes capped at `maxnreg`, interleaved."""
    from lmperf.benchmarks import flash as bench

    def ours(limit):
        with register_limit(limit):
            return bench.time_leaderboard("flash_triton", rep_ms=rep_ms, warmup_ms=500, head_dim=d)

    impls = {
        "sdpa_cudnn": lambda: bench.time_leaderboard("sdpa_cudnn", rep_ms=rep_ms, warmup_ms=500, head_dim=d),
        "ours": lambda: ours(None),
        f"ours, fwd and dq maxnreg {maxnreg}": lambda: ours(maxnreg),
    }
    entry = results.setdefault(f"leaderboard_d{d}", {"ms": {name: [] for name in impls}})
    for r in range(rounds):
        for name in list(impls)[:: -1 if r % 2 else 1]:
            out = impls[name]()
            if out["status"] != "ok":
                raise RuntimeError(f"{name}: {out['error']}")
            entry["ms"][name].append(out["forward_backward_ms_median"])
        entry["median_ms"] = {name: statistics.median(ms) for name, ms in entry["ms"].items()}
        entry["ratio_to_cudnn"] = {
            name: ms / entry["median_ms"]["sdpa_cudnn"] for name, ms in entry["median_ms"].items()
        }
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        print(f"leaderboard d={d} round {r}", json.dumps(entry["median_ms"]), flush=True)
    return entry


def check_only() -> list[dict]:
    """CPU interpreter: every schedule of every pass against our kernels, on small ragged shapes; the
    same arithmetic per tile, so the outputs must be equal."""
    rows = []
    small = {
        "fwd": {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
        "dq": {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
        "dkdv": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
    }
    for batch, n_q, n_k, d in ((3, 96, 96, 16), (2, 77, 77, 32)):
        inputs = Inputs(batch, n_q, n_k, d, "cpu", dtype=torch.float32, seed=batch)
        for part, label, config in variants(small, maxnreg=(), waves=(1,)):
            if label == "ours":
                continue
            inputs.clear(part)
            inputs.launcher(part, config)()
            err = inputs.rel_diff(part)
            row = {"shape": [batch, n_q, n_k, d], "pass": part, "variant": label, "rel_diff": err, "ok": err == 0.0}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep-ms", type=int, default=200)
    parser.add_argument("--workers", type=int, default=min(15, (os.cpu_count() or 2) - 1))
    parser.add_argument("--check-only", action="store_true", help="CPU interpreter check of every schedule")
    parser.add_argument(
        "--leaderboard",
        type=int,
        metavar="MAXNREG",
        help="instead: the leaderboard protocol, ours with and without the forward and dQ capped at MAXNREG",
    )
    parser.add_argument("--leaderboard-rep-ms", type=int, default=2000)
    args = parser.parse_args(argv)
    if args.check_only:
        return 0 if all(row["ok"] for row in check_only()) else 1
    name = "flash_sched_leaderboard.json" if args.leaderboard else "flash_sched.json"
    path = os.path.join(os.environ.get("OUT", "."), name)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    for d in args.head_dims:
        if args.leaderboard:
            leaderboard(d, args.leaderboard, args.rounds, args.leaderboard_rep_ms, path, results)
        else:
            run(d, args.rounds, args.rep_ms, args.workers, path, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
