"""Probe (issue 12): a one-pass FlashAttention-2 backward with dQ accumulated by atomics.

Our backward (lmperf.flash.triton_backward) runs two passes without atomics: dK/dV per key tile,
then dQ per query tile, recomputing S and dP in both (7 tile matmuls). This probe computes all
three in the key-tile pass (5 matmuls): each query tile's dQ share dS^T K is added into a float32
(batch, n_queries, BLOCK_D) buffer, either with Hopper's TMA bulk reduction (a tensor
descriptor's ``atomic_add``) or with per-element ``tl.atomic_add``; a last elementwise step scales
and casts it. It checks the gradients against float64 and times the backward (do_bench medians)
against ours and SDPA's cuDNN and flash backends, at the leaderboard shape.

v5 (bench/flash_notes.md) measured it with pointer loads. Since then our dK/dV pass gained TMA loads
(v6), dP's matmul first (v7) and lengths specialised for vector loads of L and Delta (v8); the same
choices are here as ``USE_TMA`` (K, V, Q and dO through tensor descriptors, lmperf.flash's
``streamed_rows``/``load_rows``), ``DP_FIRST`` and a kernel specialised on the lengths, so the one-pass
design is compared with our two passes as they are now (v13).

v14 adds Triton's automatic warp specialisation of the query loop (``WARP_SPECIALIZE``), the dQ
addition deferred by one iteration (``DEFER_DQ``) and two timing diagnostics that leave dQ wrong on
purpose: ``PLAIN_STORE`` (dQ's tiles stored, not added) and ``KEEP_DQ`` (summed in registers, stored
once), which tell the reduction's read-modify-write and the per-tile dQ traffic apart from the five
matrix products (bench/flash_notes.md, v14). ``--candidates`` picks the configs timed.

    python bench/flash_bwd_fused.py --head-dims 64 128             # on a GPU
    python bench/flash_bwd_fused.py --head-dims 64 --candidates v14-tiles --no-check
    TRITON_INTERPRET=1 python bench/flash_bwd_fused.py --check-only  # on CPU, small shapes
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time

import torch
import triton
import triton.language as tl

from lmperf.flash.triton_common import LOG2E, block_d, dot_precision, load_rows, store_tile, streamed_rows, use_tma


@triton.jit
def _fused_query_loop(
    dk,
    dv,
    dq_keep,
    k,
    v,
    q_rows,
    do_rows,
    l_base,
    delta_base,
    dq_desc,
    dq_ptr_base,
    row0,
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
    TMA_REDUCE: tl.constexpr,
    USE_TMA: tl.constexpr,
    DP_FIRST: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    PLAIN_STORE: tl.constexpr,
    KEEP_DQ: tl.constexpr,
    DEFER_DQ: tl.constexpr,
):
    # DEFER_DQ (TMA reduction only): each query tile's dQ share is added one iteration later, after the
    # next tile's first matrix product is issued, instead of at the end of its own iteration
    dq_prev = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    prev_row = row0 + lo
    for start_m in tl.range(lo, hi, BLOCK_M, warp_specialize=WARP_SPECIALIZE):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_ok = offs_m < n_queries
        q = load_rows(q_rows, start_m, offs_m, q_ok, stride_qn, offs_d, d_ok, MASKED, HEAD_DIM, BLOCK_D, USE_TMA)
        do = load_rows(do_rows, start_m, offs_m, q_ok, stride_don, offs_d, d_ok, MASKED, HEAD_DIM, BLOCK_D, USE_TMA)
        if MASKED:
            lse_log2 = tl.load(l_base + offs_m, mask=q_ok, other=0.0) * 1.4426950408889634
            delta = tl.load(delta_base + offs_m, mask=q_ok, other=0.0)
        else:
            lse_log2 = tl.load(l_base + offs_m) * 1.4426950408889634
            delta = tl.load(delta_base + offs_m)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)
        if DEFER_DQ:  # the previous tile's share (zeros into this loop's first rows on its first pass)
            dq_desc.atomic_add([prev_row, 0], dq_prev)
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
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)
        dk = tl.dot(ds_t, q, dk, input_precision=PRECISION)
        dq = tl.dot(tl.trans(ds_t), k, input_precision=PRECISION)  # (BLOCK_M, BLOCK_D) float32
        if DEFER_DQ:
            dq_prev = dq
            prev_row = row0 + start_m
        elif KEEP_DQ:  # diagnostic only: dQ's tiles summed in registers, stored once (dQ comes out wrong)
            dq_keep += dq
        elif PLAIN_STORE:  # diagnostic only: the same bytes stored, not added (dQ comes out wrong)
            dq_desc.store([row0 + start_m, 0], dq)
        elif TMA_REDUCE:
            dq_desc.atomic_add([row0 + start_m, 0], dq)
        else:
            ptrs = dq_ptr_base + offs_m[:, None] * BLOCK_D + offs_d[None, :]
            if MASKED:
                tl.atomic_add(ptrs, dq, mask=q_ok[:, None], sem="relaxed")
            else:
                tl.atomic_add(ptrs, dq, sem="relaxed")
    if DEFER_DQ:
        dq_desc.atomic_add([prev_row, 0], dq_prev)
    return dk, dv, dq_keep


@triton.jit  # lengths specialised, as our dK/dV pass (vector loads of L and Delta)
def flash_bwd_fused_kernel(
    Q,
    K,
    V,
    DO,
    L,
    Delta,
    DK,
    DV,
    DQACC,
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
    n_rows,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    TMA_REDUCE: tl.constexpr,
    USE_TMA: tl.constexpr,
    DP_FIRST: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    PLAIN_STORE: tl.constexpr,
    KEEP_DQ: tl.constexpr,
    DEFER_DQ: tl.constexpr,
):
    """Grid (cdiv(n_keys, BLOCK_N), batch). DQACC (batch * n_queries, BLOCK_D) float32, zeroed.

    Rows of a ragged last query tile fall into the next batch's rows (or past the end, where the
    descriptor drops them); their dS is zero, so they add zeros."""
    qk_scale = tl.cast(qk_scale, tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)
    b = tl.program_id(1).to(tl.int64)
    start_n = tl.program_id(0) * BLOCK_N
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
    dq_keep = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    q_rows = streamed_rows(Q + b * stride_qb, n_queries, stride_qn, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
    do_rows = streamed_rows(DO + b * stride_dob, n_queries, stride_don, HEAD_DIM, BLOCK_M, BLOCK_D, USE_TMA)
    l_base = L + b * n_queries
    delta_base = Delta + b * n_queries
    row0 = (b * n_queries).to(tl.int32)
    dq_ptr_base = DQACC + b * n_queries * BLOCK_D
    if TMA_REDUCE:
        dq_desc = tl.make_tensor_descriptor(
            DQACC, shape=[n_rows, BLOCK_D], strides=[BLOCK_D, 1], block_shape=[BLOCK_M, BLOCK_D]
        )
    else:
        dq_desc = DQACC  # unused
    n_queries_full = (n_queries // BLOCK_M) * BLOCK_M
    if IS_CAUSAL:
        dk, dv, dq_keep = _fused_query_loop(
            dk, dv, dq_keep, k, v, q_rows, do_rows, l_base, delta_base, dq_desc, dq_ptr_base, row0, stride_qn, stride_don,
            offs_n, offs_d, d_ok, start_n, tl.minimum(start_n + BLOCK_N, n_queries), n_queries, qk_scale,
            HEAD_DIM, BLOCK_D, BLOCK_M, True, IS_CAUSAL, PRECISION, TMA_REDUCE, USE_TMA, DP_FIRST, False, PLAIN_STORE, KEEP_DQ, DEFER_DQ,
        )  # fmt: skip
        lo_unmasked = start_n + BLOCK_N
    else:
        lo_unmasked = 0
    dk, dv, dq_keep = _fused_query_loop(
        dk, dv, dq_keep, k, v, q_rows, do_rows, l_base, delta_base, dq_desc, dq_ptr_base, row0, stride_qn, stride_don,
        offs_n, offs_d, d_ok, lo_unmasked, n_queries_full, n_queries, qk_scale,
        HEAD_DIM, BLOCK_D, BLOCK_M, False, IS_CAUSAL, PRECISION, TMA_REDUCE, USE_TMA, DP_FIRST, WARP_SPECIALIZE, PLAIN_STORE, KEEP_DQ, DEFER_DQ,
    )  # fmt: skip
    dk, dv, dq_keep = _fused_query_loop(
        dk, dv, dq_keep, k, v, q_rows, do_rows, l_base, delta_base, dq_desc, dq_ptr_base, row0, stride_qn, stride_don,
        offs_n, offs_d, d_ok, tl.maximum(lo_unmasked, n_queries_full), n_queries, n_queries, qk_scale,
        HEAD_DIM, BLOCK_D, BLOCK_M, True, IS_CAUSAL, PRECISION, TMA_REDUCE, USE_TMA, DP_FIRST, False, PLAIN_STORE, KEEP_DQ, DEFER_DQ,
    )  # fmt: skip
    if KEEP_DQ:
        dq_desc.store([row0, 0], dq_keep)
    dk = dk * sm_scale
    store_tile(DK + b * stride_dkb + offs_n[:, None] * stride_dkn + offs_d[None, :], dk.to(DK.dtype.element_ty), k_ok, d_ok, HEAD_DIM != BLOCK_D)  # fmt: skip
    store_tile(DV + b * stride_dvb + offs_n[:, None] * stride_dvn + offs_d[None, :], dv.to(DV.dtype.element_ty), k_ok, d_ok, HEAD_DIM != BLOCK_D)  # fmt: skip


def fused_backward(q, k, v, o, lse, do, is_causal, config, tma_reduce, tf32=None):
    """(dQ, dK, dV) from one key-tile pass; config {BLOCK_M, BLOCK_N, num_warps, num_stages} and
    optionally USE_TMA (loads through descriptors where the inputs are aligned), DP_FIRST,
    WARP_SPECIALIZE (Triton's automatic warp specialisation of the unmasked query loop), DEFER_DQ
    (each tile's dQ added one iteration later, by TMA reduction), and two timing diagnostics that
    leave dQ wrong: PLAIN_STORE (dQ's tiles stored instead of added) and
    KEEP_DQ (dQ's tiles summed in registers and stored once: the pass without any per-tile dQ traffic)."""
    from lmperf.flash.triton_backward import launch_delta
    from lmperf.flash.triton_common import set_tma_allocator

    batch, n_q, d = q.shape
    n_k = k.shape[1]
    bd = block_d(d)
    precision = dot_precision(q.dtype, tf32)
    config = {
        "DP_FIRST": False,
        "WARP_SPECIALIZE": False,
        "PLAIN_STORE": False,
        "KEEP_DQ": False,
        "DEFER_DQ": False,
        **use_tma(config, q, k, v, do),
    }
    delta = torch.empty(batch, n_q, device=q.device, dtype=torch.float32)
    launch_delta(o, do, delta)
    dq_acc = torch.zeros(batch, n_q, bd, device=q.device, dtype=torch.float32)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    # dQ through a tensor descriptor: its TMA reduction, or the diagnostics' and DEFER_DQ's stores/adds
    dq_by_tma = bool(tma_reduce or config["PLAIN_STORE"] or config["KEEP_DQ"] or config["DEFER_DQ"])
    if dq_by_tma:
        set_tma_allocator(q.device)
    sm_scale = 1.0 / math.sqrt(d)
    flash_bwd_fused_kernel[(triton.cdiv(n_k, config["BLOCK_N"]), batch)](
        q, k, v, do, lse, delta, dk, dv, dq_acc,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), do.stride(0), do.stride(1),
        dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), n_q, n_k, batch * n_q, sm_scale * LOG2E, sm_scale,
        HEAD_DIM=d, BLOCK_D=bd, IS_CAUSAL=bool(is_causal), PRECISION=precision, TMA_REDUCE=dq_by_tma, **config,
    )  # fmt: skip
    dq = (dq_acc[..., :d] * sm_scale).to(q.dtype)
    return dq, dk, dv


def reference(q, k, v, do, is_causal):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = q64 @ k64.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).tril().logical_not(), float("-inf"))
    o = torch.softmax(s, -1) @ v64
    o.backward(do.double())
    return q64.grad, k64.grad, v64.grad


def rel_err(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def check(device, dtype, shapes, configs, tma_options):
    from lmperf.flash import flash_backward, flash_forward

    out = []
    for batch, n_q, n_k, d, causal in shapes:
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v, do = (torch.randn(batch, n, d, generator=g).to(device, dtype) for n in (n_q, n_k, n_k, n_q))
        o, lse = flash_forward(q, k, v, causal)
        ref = reference(q, k, v, do, causal)
        ours = flash_backward(q, k, v, o, lse, do, causal)
        base = [rel_err(x, r) for x, r in zip(ours, ref)]
        for config in configs:
            for tma in tma_options:
                row = dict(shape=[batch, n_q, n_k, d, causal], config=config, tma=tma, split_errs=base)
                try:
                    got = fused_backward(q, k, v, o, lse, do, causal, config, tma)
                except Exception as e:  # noqa: BLE001 - a config that does not build is a failed check, with why
                    row.update(error=repr(e)[:300], ok=False)
                else:
                    errs = [rel_err(x, r) for x, r in zip(got, ref)]
                    row.update(errs=errs, ok=all(e <= max(3 * b0, 1e-5) + 1e-3 for e, b0 in zip(errs, base)))
                out.append(row)
                print(json.dumps(row), flush=True)
    return out


def time_backward(d, candidates, batch=16, n=16384):
    """do_bench medians of our two passes and of each (config, tma_reduce) one-pass candidate."""
    from triton.testing import do_bench

    from lmperf.flash import flash_backward, flash_forward

    q, k, v, do = (torch.randn(batch, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse = flash_forward(q, k, v, True)
    rows = []
    t = do_bench(lambda: flash_backward(q, k, v, o, lse, do, True), warmup=100, rep=1000)
    rows.append(dict(d=d, impl="ours_split", ms=t))
    print(json.dumps(rows[-1]), flush=True)
    for config, tma in candidates:
        try:
            fused_backward(q, k, v, o, lse, do, True, config, tma)
            t = do_bench(
                functools.partial(fused_backward, q, k, v, o, lse, do, True, config, tma), warmup=100, rep=1000
            )
        except Exception as e:  # noqa: BLE001 - a config that does not compile is a result
            rows.append(dict(d=d, impl="fused", config=config, tma=tma, error=repr(e)[:300]))
        else:
            rows.append(dict(d=d, impl="fused", config=config, tma=tma, ms=t))
        print(json.dumps(rows[-1]), flush=True)
    # SDPA backends, same inputs as (B, H=1, N, d)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        qs, ks, vs = (x[:, None].detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
            g = do[:, None]
            grads = functools.partial(torch.autograd.grad, out, (qs, ks, vs), g, retain_graph=True)
            t = do_bench(grads, warmup=100, rep=1000)
        rows.append(dict(d=d, impl=name, ms=t))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def candidates(d, which="v14"):
    """(config, TMA reduction) pairs timed at head dim d.

    v13: around our dK/dV pass's tuned tiles (H100 table: d = 64 64 x 64, 4 warps, 3 stages, TMA, dP
    first; d = 128 64 x 128, 8 warps, 3 stages, TMA), with K/V/Q/dO loads through descriptors, plus v5's
    best without them. v14: v13's best at each d, the same with Triton's automatic warp specialisation
    of the unmasked query loop (4 and 8 warps), and the diagnostics PLAIN_STORE (dQ's tiles stored, not
    added: the pass without the reduction's read-modify-write) and KEEP_DQ (no per-tile dQ traffic)."""

    def c(bm, bn, w, s, tma=True, dp_first=False, **extra):
        return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s, USE_TMA=tma, DP_FIRST=dp_first, **extra)

    if which == "v14-defer":  # d = 64 and 128: dQ's reduction one iteration later; more stages
        if d <= 64:
            tiles = [c(64, 64, 4, st, dp_first=True, DEFER_DQ=True) for st in (3, 4, 5)]
            tiles += [c(64, 64, 4, st, dp_first=True) for st in (4, 5, 6)]
            tiles.append(c(64, 64, 4, 5, dp_first=True, KEEP_DQ=True))
        else:
            tiles = [c(64, 128, 8, st, DEFER_DQ=True) for st in (2, 3)]
            tiles += [c(64, 128, 8, 3, tma=False, DEFER_DQ=True), c(64, 128, 8, 3, tma=False)]
        return [(t, True) for t in tiles]
    if which == "v14-tiles":  # d = 64: the reduction's cost against the query tile's height and the stages
        tiles = []
        for bm, bn, w, st in ((128, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 2), (64, 64, 4, 4), (128, 64, 8, 2)):
            tiles += [c(bm, bn, w, st, dp_first=True), c(bm, bn, w, st, dp_first=True, KEEP_DQ=True)]
        tiles.append(c(64, 128, 8, 3, dp_first=True, KEEP_DQ=True))
        return [(t, True) for t in tiles]
    if which == "v13":
        if d <= 64:
            tiles = [c(64, 64, 4, 3, dp_first=True), c(64, 64, 4, 3), c(64, 128, 8, 3), c(32, 128, 4, 3)]
            tiles.append(c(64, 64, 4, 3, tma=False))
        else:
            tiles = [c(64, 128, 8, 3), c(64, 128, 8, 3, dp_first=True), c(64, 64, 4, 3), c(32, 128, 8, 3)]
            tiles.append(c(64, 128, 8, 3, tma=False))
        return [(t, True) for t in tiles]
    if d <= 64:
        best = [c(64, 64, 4, 3, dp_first=True)]
        ws = [
            c(64, 64, 4, 3, dp_first=True, WARP_SPECIALIZE=True),
            c(64, 64, 8, 3, dp_first=True, WARP_SPECIALIZE=True),
        ]
        ws.append(c(64, 128, 8, 2, dp_first=True, WARP_SPECIALIZE=True))
    else:
        best = [c(64, 128, 8, 3, tma=False), c(64, 128, 8, 3)]
        ws = [c(64, 128, 8, 3, WARP_SPECIALIZE=True), c(64, 128, 8, 2, WARP_SPECIALIZE=True)]
        ws.append(c(64, 64, 4, 3, WARP_SPECIALIZE=True))
    plain = [{**t, "PLAIN_STORE": True} for t in best + ws[:1]]
    keep = [{**t, "KEEP_DQ": True} for t in best]
    return [(t, True) for t in best + ws + plain + keep]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--check-only", action="store_true")
    p.add_argument("--no-check", action="store_true", help="time only (the gradients are not checked on the GPU)")
    p.add_argument(
        "--candidates",
        choices=("v13", "v14", "v14-tiles", "v14-defer"),
        default="v14",
        help="which set of one-pass configs to time",
    )
    args = p.parse_args(argv)
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    device = "cpu" if interp else "cuda"
    result = {}
    t0 = time.time()
    if interp:
        shapes = [(2, 40, 40, 16, True), (1, 33, 70, 48, False), (2, 70, 33, 32, True)]
        cfgs = [dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1, DP_FIRST=dp) for dp in (False, True)]
        cfgs.append(dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1, DP_FIRST=False, WARP_SPECIALIZE=True))
        result["check"] = check(device, torch.float32, shapes, cfgs, [False])  # no TMA in the interpreter
        return 0 if all(r["ok"] for r in result["check"]) else 1
    shapes = [(2, 1024, 1024, 64, True), (1, 1531, 1000, 80, True), (3, 777, 2049, 128, False), (2, 300, 300, 64, True)]
    cfgs = [
        dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=2),
        dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, USE_TMA=True, DP_FIRST=True),
        dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, USE_TMA=True, DP_FIRST=True, WARP_SPECIALIZE=True),
        dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3, USE_TMA=True, WARP_SPECIALIZE=True),
        dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=4, USE_TMA=True, DP_FIRST=True, DEFER_DQ=True),
    ]
    result["check"] = (
        []
        if args.no_check
        else (
            check(device, torch.bfloat16, shapes, cfgs[:1], [False])
            + check(device, torch.bfloat16, shapes, cfgs[1:], [True])
        )
    )
    if not args.check_only:
        result["time"] = [row for d in args.head_dims for row in time_backward(d, candidates(d, args.candidates))]
    result["wall_s"] = time.time() - t0
    path = os.path.join(os.environ.get("OUT", "."), "flash_bwd_fused.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", path, "ok:", all(r["ok"] for r in result["check"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
