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

    python bench/flash_bwd_fused.py --head-dims 64 128             # on a GPU
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
):
    for start_m in range(lo, hi, BLOCK_M):
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
        if TMA_REDUCE:
            dq_desc.atomic_add([row0 + start_m, 0], dq)
        else:
            ptrs = dq_ptr_base + offs_m[:, None] * BLOCK_D + offs_d[None, :]
            if MASKED:
                tl.atomic_add(ptrs, dq, mask=q_ok[:, None], sem="relaxed")
            else:
                tl.atomic_add(ptrs, dq, sem="relaxed")
    return dk, dv


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
        dk, dv = _fused_query_loop(
            dk, dv, k, v, q_rows, do_rows, l_base, delta_base, dq_desc, dq_ptr_base, row0, stride_qn, stride_don,
            offs_n, offs_d, d_ok, start_n, tl.minimum(start_n + BLOCK_N, n_queries), n_queries, qk_scale,
            HEAD_DIM, BLOCK_D, BLOCK_M, True, IS_CAUSAL, PRECISION, TMA_REDUCE, USE_TMA, DP_FIRST,
        )  # fmt: skip
        lo_unmasked = start_n + BLOCK_N
    else:
        lo_unmasked = 0
    dk, dv = _fused_query_loop(
        dk, dv, k, v, q_rows, do_rows, l_base, delta_base, dq_desc, dq_ptr_base, row0, stride_qn, stride_don,
        offs_n, offs_d, d_ok, lo_unmasked, n_queries_full, n_queries, qk_scale,
        HEAD_DIM, BLOCK_D, BLOCK_M, False, IS_CAUSAL, PRECISION, TMA_REDUCE, USE_TMA, DP_FIRST,
    )  # fmt: skip
    dk, dv = _fused_query_loop(
        dk, dv, k, v, q_rows, do_rows, l_base, delta_base, dq_desc, dq_ptr_base, row0, stride_qn, stride_don,
        offs_n, offs_d, d_ok, tl.maximum(lo_unmasked, n_queries_full), n_queries, n_queries, qk_scale,
        HEAD_DIM, BLOCK_D, BLOCK_M, True, IS_CAUSAL, PRECISION, TMA_REDUCE, USE_TMA, DP_FIRST,
    )  # fmt: skip
    dk = dk * sm_scale
    store_tile(DK + b * stride_dkb + offs_n[:, None] * stride_dkn + offs_d[None, :], dk.to(DK.dtype.element_ty), k_ok, d_ok, HEAD_DIM != BLOCK_D)  # fmt: skip
    store_tile(DV + b * stride_dvb + offs_n[:, None] * stride_dvn + offs_d[None, :], dv.to(DV.dtype.element_ty), k_ok, d_ok, HEAD_DIM != BLOCK_D)  # fmt: skip


def fused_backward(q, k, v, o, lse, do, is_causal, config, tma_reduce, tf32=None):
    """(dQ, dK, dV) from one key-tile pass; config {BLOCK_M, BLOCK_N, num_warps, num_stages} and
    optionally USE_TMA (loads through descriptors where the inputs are aligned) and DP_FIRST."""
    from lmperf.flash.triton_backward import launch_delta
    from lmperf.flash.triton_common import set_tma_allocator

    batch, n_q, d = q.shape
    n_k = k.shape[1]
    bd = block_d(d)
    precision = dot_precision(q.dtype, tf32)
    config = {"DP_FIRST": False, **use_tma(config, q, k, v, do)}
    delta = torch.empty(batch, n_q, device=q.device, dtype=torch.float32)
    launch_delta(o, do, delta)
    dq_acc = torch.zeros(batch, n_q, bd, device=q.device, dtype=torch.float32)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    if tma_reduce:
        set_tma_allocator(q.device)
    sm_scale = 1.0 / math.sqrt(d)
    flash_bwd_fused_kernel[(triton.cdiv(n_k, config["BLOCK_N"]), batch)](
        q, k, v, do, lse, delta, dk, dv, dq_acc,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), do.stride(0), do.stride(1),
        dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1), n_q, n_k, batch * n_q, sm_scale * LOG2E, sm_scale,
        HEAD_DIM=d, BLOCK_D=bd, IS_CAUSAL=bool(is_causal), PRECISION=precision, TMA_REDUCE=tma_reduce, **config,
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
                got = fused_backward(q, k, v, o, lse, do, causal, config, tma)
                errs = [rel_err(x, r) for x, r in zip(got, ref)]
                ok = all(e <= max(3 * b0, 1e-5) + 1e-3 for e, b0 in zip(errs, base))
                row = dict(
                    shape=[batch, n_q, n_k, d, causal], config=config, tma=tma, errs=errs, split_errs=base, ok=ok
                )
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


def candidates(d):
    """(config, TMA reduction) pairs timed at head dim d: around our dK/dV pass's tuned tiles (H100
    table: d = 64 64 x 64, 4 warps, 3 stages, TMA, dP first; d = 128 64 x 128, 8 warps, 3 stages,
    TMA), with K/V/Q/dO loads through descriptors, plus v5's best without them."""

    def c(bm, bn, w, s, tma=True, dp_first=False):
        return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s, USE_TMA=tma, DP_FIRST=dp_first)

    if d <= 64:
        tiles = [c(64, 64, 4, 3, dp_first=True), c(64, 64, 4, 3), c(64, 128, 8, 3), c(32, 128, 4, 3)]
        tiles.append(c(64, 64, 4, 3, tma=False))
    else:
        tiles = [c(64, 128, 8, 3), c(64, 128, 8, 3, dp_first=True), c(64, 64, 4, 3), c(32, 128, 8, 3)]
        tiles.append(c(64, 128, 8, 3, tma=False))
    return [(t, True) for t in tiles]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--check-only", action="store_true")
    args = p.parse_args(argv)
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    device = "cpu" if interp else "cuda"
    result = {}
    t0 = time.time()
    if interp:
        shapes = [(2, 40, 40, 16, True), (1, 33, 70, 48, False), (2, 70, 33, 32, True)]
        cfgs = [dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1, DP_FIRST=dp) for dp in (False, True)]
        result["check"] = check(device, torch.float32, shapes, cfgs, [False])  # no TMA in the interpreter
        return 0 if all(r["ok"] for r in result["check"]) else 1
    shapes = [(2, 1024, 1024, 64, True), (1, 1531, 1000, 80, True), (3, 777, 2049, 128, False), (2, 300, 300, 64, True)]
    cfgs = [
        dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=2),
        dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, USE_TMA=True, DP_FIRST=True),
    ]
    result["check"] = check(device, torch.bfloat16, shapes, cfgs[:1], [False]) + check(
        device, torch.bfloat16, shapes, cfgs[1:], [True]
    )
    if not args.check_only:
        result["time"] = [row for d in args.head_dims for row in time_backward(d, candidates(d))]
    result["wall_s"] = time.time() - t0
    path = os.path.join(os.environ.get("OUT", "."), "flash_bwd_fused.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", path, "ok:", all(r["ok"] for r in result["check"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
