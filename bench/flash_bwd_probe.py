"""Probe (issue 12): where our backward's time goes beyond its two kernels, and dK/dV pass variants.

At the leaderboard shape (16 x 16384 x d, causal bf16, d = 64 and 128):

1. **Overhead.** do_bench medians of our forward and backward through autograd (as the leaderboard
   times them), of each of our kernels alone at its tuned tiles, and the CPU time of one call
   without synchronising (launch overhead: if it exceeds the time do_bench's L2 flush keeps the GPU
   busy, the GPU waits for the launch and do_bench counts the wait). torch.profiler's kernel table
   for ours and SDPA's cuDNN backend.
2. **Registers and spills** of our compiled kernels (Triton's n_regs, n_spills).
3. **dK/dV variants** at the tuned tiles, checked against our kernel's output: K and V read
   through tensor descriptors (so the wgmma can take them from shared memory rather than
   registers), and dP = V dO^T issued before dV's matmul.
4. **Sweep** (`--sweep`): the variant over more tiles (BLOCK_M queries may exceed BLOCK_N keys),
   with queries along rows and dK^T, dV^T accumulated (SWAP: K, V, Q and dO all stay wgmma
   operands in shared memory, P and dS go through shared memory as B operands, as
   FlashAttention-3's swapped-operand backward does), then the fastest warp-specialised.

    OUT=/tmp/out python bench/flash_bwd_probe.py           # on an H100 or H200
    OUT=/tmp/out python bench/flash_bwd_probe.py --sweep   # 4.: flash_bwd_sweep.json, written per row
    TRITON_INTERPRET=1 python bench/flash_bwd_probe.py --check-only  # the variants on CPU
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import triton
import triton.language as tl

from lmperf.flash.triton_common import LOG2E, block_d, load_tile, store_tile, streamed_rows

RESULTS: dict = {}


def log(*args) -> None:
    print(*args, flush=True)


@triton.jit
def _variant_query_loop(
    dk,
    dv,
    k,
    v,
    q_desc,
    do_desc,
    l_base,
    delta_base,
    offs_n,
    lo,
    hi,
    n_queries,
    qk_scale,
    BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr,
    DP_FIRST: tl.constexpr,
    NT: tl.constexpr,
    SWAP: tl.constexpr,
    WS: tl.constexpr,
):
    for start_m in tl.range(lo, hi, BLOCK_M, warp_specialize=WS):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_ok = offs_m < n_queries
        q = q_desc.load([start_m, 0])
        do = do_desc.load([start_m, 0])
        lse_log2 = tl.load(l_base + offs_m, mask=q_ok, other=0.0) * 1.4426950408889634
        delta = tl.load(delta_base + offs_m, mask=q_ok, other=0.0)
        if SWAP or NT:  # queries along rows: K and V are the B operands (shared memory)
            s = tl.dot(q, tl.trans(k))
            if DP_FIRST:
                dp = tl.dot(do, tl.trans(v))
            p = tl.math.exp2(s * qk_scale - lse_log2[:, None])
            if MASKED:
                keep = q_ok[:, None] & (offs_m[:, None] >= offs_n[None, :])
                p = tl.where(keep, p, 0.0)
            # SWAP accumulates dV^T = dO^T P and dK^T = Q^T dS: Q, dO stay shared-memory operands and
            # P, dS are staged there as B operands, nothing is transposed in registers; NT transposes
            # P and dS in registers to accumulate dV and dK as they are
            if SWAP:
                dv = tl.dot(tl.trans(do), p.to(do.dtype), dv)
            else:
                dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv)
            if not DP_FIRST:
                dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            if SWAP:
                dk = tl.dot(tl.trans(q), ds.to(q.dtype), dk)
            else:
                dk = tl.dot(tl.trans(ds.to(q.dtype)), q, dk)
        else:  # keys along rows, as lmperf.flash.triton_backward
            s_t = tl.dot(k, tl.trans(q))
            if DP_FIRST:
                dp_t = tl.dot(v, tl.trans(do))
            p_t = tl.math.exp2(s_t * qk_scale - lse_log2[None, :])
            if MASKED:
                keep = q_ok[None, :] & (offs_m[None, :] >= offs_n[:, None])
                p_t = tl.where(keep, p_t, 0.0)
            dv = tl.dot(p_t.to(do.dtype), do, dv)
            if not DP_FIRST:
                dp_t = tl.dot(v, tl.trans(do))
            ds_t = p_t * (dp_t - delta[None, :])
            dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def dkdv_variant_kernel(
    Q,
    K,
    V,
    DO,
    L,
    Delta,
    DK,
    DV,
    stride_b,
    stride_n,
    n_queries,
    n_keys,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KV_TMA: tl.constexpr,
    DP_FIRST: tl.constexpr,
    NT: tl.constexpr,
    SWAP: tl.constexpr,
    WS: tl.constexpr,
    DIAG: tl.constexpr,
    BATCH_MAJOR: tl.constexpr,
):
    """Causal dK/dV pass for contiguous (B, n, HEAD_DIM) inputs, HEAD_DIM a power of two, Q and dO
    through descriptors (as our tuned kernel); KV_TMA reads K and V through descriptors too. SWAP
    accumulates dK^T and dV^T (HEAD_DIM x BLOCK_N); WS warp-specialises the unmasked query loop.
    DIAG = cdiv(BLOCK_N, BLOCK_M) * BLOCK_M: the query tiles from start_n that the diagonal masks
    (BLOCK_M may exceed BLOCK_N). BATCH_MAJOR launches the grid batch-first."""
    qk_scale = tl.cast(qk_scale, tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)
    if BATCH_MAJOR:  # grid (batch, key tiles): every batch element's longest programs first
        b = tl.program_id(0).to(tl.int64)
        start_n = tl.program_id(1) * BLOCK_N
    else:
        b = tl.program_id(1).to(tl.int64)
        start_n = tl.program_id(0) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k_ok = offs_n < n_keys
    if KV_TMA:
        k_desc = tl.make_tensor_descriptor(
            K + b * stride_b, shape=[n_keys, HEAD_DIM], strides=[stride_n, 1], block_shape=[BLOCK_N, HEAD_DIM]
        )
        v_desc = tl.make_tensor_descriptor(
            V + b * stride_b, shape=[n_keys, HEAD_DIM], strides=[stride_n, 1], block_shape=[BLOCK_N, HEAD_DIM]
        )
        k = k_desc.load([start_n, 0])
        v = v_desc.load([start_n, 0])
    else:
        k = load_tile(
            K + b * stride_b + offs_n[:, None] * stride_n + offs_d[None, :], k_ok, offs_d < HEAD_DIM, True, False
        )
        v = load_tile(
            V + b * stride_b + offs_n[:, None] * stride_n + offs_d[None, :], k_ok, offs_d < HEAD_DIM, True, False
        )
    if SWAP:
        dk = tl.zeros([HEAD_DIM, BLOCK_N], dtype=tl.float32)
        dv = tl.zeros([HEAD_DIM, BLOCK_N], dtype=tl.float32)
    else:
        dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    q_desc = streamed_rows(Q + b * stride_b, n_queries, stride_n, HEAD_DIM, BLOCK_M, HEAD_DIM, True)
    do_desc = streamed_rows(DO + b * stride_b, n_queries, stride_n, HEAD_DIM, BLOCK_M, HEAD_DIM, True)
    l_base = L + b * n_queries
    delta_base = Delta + b * n_queries
    lo = start_n + DIAG  # query tiles from here on see no masked key of this tile
    full_hi = lo + (tl.maximum(n_queries - lo, 0) // BLOCK_M) * BLOCK_M  # whole tiles only
    dk, dv = _variant_query_loop(
        dk, dv, k, v, q_desc, do_desc, l_base, delta_base, offs_n, start_n, tl.minimum(lo, n_queries),
        n_queries, qk_scale, BLOCK_M, True, DP_FIRST, NT, SWAP, False,
    )  # fmt: skip
    dk, dv = _variant_query_loop(
        dk, dv, k, v, q_desc, do_desc, l_base, delta_base, offs_n, lo, full_hi, n_queries, qk_scale,
        BLOCK_M, False, DP_FIRST, NT, SWAP, WS,
    )  # fmt: skip
    dk, dv = _variant_query_loop(
        dk, dv, k, v, q_desc, do_desc, l_base, delta_base, offs_n, full_hi, n_queries,
        n_queries, qk_scale, BLOCK_M, True, DP_FIRST, NT, SWAP, False,
    )  # fmt: skip
    if SWAP:
        dk = tl.trans(dk)
        dv = tl.trans(dv)
    d_ok = offs_d < HEAD_DIM
    store_tile(DK + b * stride_b + offs_n[:, None] * stride_n + offs_d[None, :], (dk * sm_scale).to(DK.dtype.element_ty), k_ok, d_ok, False)  # fmt: skip
    store_tile(DV + b * stride_b + offs_n[:, None] * stride_n + offs_d[None, :], dv.to(DV.dtype.element_ty), k_ok, d_ok, False)  # fmt: skip


def launch_variant(q, k, v, do, lse, delta, dk, dv, config: dict) -> None:
    from lmperf.flash.triton_common import set_tma_allocator

    set_tma_allocator(q.device)
    batch, n, d = q.shape
    assert d == block_d(d) and all(t.is_contiguous() for t in (q, k, v, do, dk, dv))
    sm_scale = 1.0 / math.sqrt(d)
    config = {"NT": False, "SWAP": False, "WS": False, "BATCH_MAJOR": False, **config}
    assert not (config["NT"] and config["SWAP"])
    diag = triton.cdiv(config["BLOCK_N"], config["BLOCK_M"]) * config["BLOCK_M"]
    tiles = triton.cdiv(n, config["BLOCK_N"])
    dkdv_variant_kernel[(batch, tiles) if config["BATCH_MAJOR"] else (tiles, batch)](
        q, k, v, do, lse, delta, dk, dv, q.stride(0), q.stride(1), n, n, sm_scale * LOG2E, sm_scale, HEAD_DIM=d,
        DIAG=diag, **config
    )  # fmt: skip


def delta_of(o, do):
    return (o.float() * do.float()).sum(-1)


def check_variants(
    device: str, dtype, shapes, config_base: dict, variant_tiles: list[dict] | None = None, flag_sets=None
) -> list[dict]:
    """Each variant's dK, dV against our dK/dV kernel's (same inputs), at our kernel's tiles or, given
    variant_tiles, at each of those (BLOCK_M may exceed BLOCK_N there: our kernel does not allow it)."""
    from lmperf.flash import flash_forward
    from lmperf.flash.triton_backward import launch_dkdv

    rows = []
    for batch, n, d in shapes:
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v, do = (torch.randn(batch, n, d, generator=g).to(device, dtype) for _ in range(4))
        o, lse = flash_forward(q, k, v, True)
        delta = delta_of(o, do)
        ref_dk, ref_dv = torch.empty_like(k), torch.empty_like(v)
        base = {kk: vv for kk, vv in config_base.items() if kk not in ("KV_TMA", "DP_FIRST")}
        launch_dkdv(q, k, v, do, lse, delta, ref_dk, ref_dv, True, {**base, "USE_TMA": True}, "ieee")
        for tiles in variant_tiles or [base]:
            for flags in flag_sets or VARIANT_FLAGS:
                dk, dv = torch.empty_like(k), torch.empty_like(v)
                launch_variant(q, k, v, do, lse, delta, dk, dv, {**tiles, **flags})
                errs = [
                    float((x.double() - r.double()).norm() / r.double().norm()) for x, r in ((dk, ref_dk), (dv, ref_dv))
                ]
                rows.append(dict(shape=[batch, n, d], **tiles, **flags, errs=errs, ok=max(errs) < 1e-2))
                log(json.dumps(rows[-1]))
    return rows


VARIANT_FLAGS = [
    dict(KV_TMA=kv_tma, DP_FIRST=dp_first, NT=layout == "nt", SWAP=layout == "swap")
    for layout in ("rows", "nt", "swap")
    for kv_tma in (False, True)
    for dp_first in (False, True)
]


def ours_at_leaderboard(d: int):
    """The dK/dV pass's inputs at the leaderboard shape (16 x 16384 x d, causal bf16) and output
    buffers, our tuned tiles, our kernel's dK and dV there (in dk, dv, as it leaves them) and its
    do_bench median (rep 300 ms): ((q, k, v, do, lse, delta), dk, dv, tuned, ms)."""
    from triton.testing import do_bench

    from lmperf.benchmarks import flash as bench
    from lmperf.flash import flash_forward, tuning
    from lmperf.flash.triton_backward import launch_dkdv

    q, k, v, do = (t.detach() for t in bench.make_inputs(16, 16384, d, torch.bfloat16))
    o, lse = flash_forward(q, k, v, True)
    inputs = (q, k, v, do, lse, delta_of(o, do))
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    tuned = tuning.choose("dkdv", q, k, True, "ieee", None, ())
    ms = do_bench(lambda: launch_dkdv(*inputs, dk, dv, True, tuned, "ieee"), rep=300)
    return inputs, dk, dv, tuned, ms


def time_variants(d: int, tiles: list[tuple]) -> list[dict]:
    """Our dK/dV kernel at its tuned tiles, then every variant at each (BLOCK_M, BLOCK_N, warps,
    stages), side by side in this process (do_bench medians, rep 300 ms)."""
    from triton.testing import do_bench

    (q, k, v, do, lse, delta), dk, dv, tuned, ours_ms = ours_at_leaderboard(d)
    ref = dk.clone()
    rows = [dict(d=d, kernel="ours", config=tuned, ms=ours_ms)]
    log(json.dumps(rows[-1]))
    for bm, bn, warps, stages in tiles:
        for flags in VARIANT_FLAGS:
            cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **flags)
            try:
                launch_variant(q, k, v, do, lse, delta, dk, dv, cfg)
                torch.cuda.synchronize()
                err = float((dk.double() - ref.double()).norm() / ref.double().norm())
                ms = do_bench(lambda cfg=cfg: launch_variant(q, k, v, do, lse, delta, dk, dv, cfg), rep=300)
                row = dict(d=d, kernel="variant", config=cfg, ms=ms, dk_rel_diff=err)
            except Exception as e:  # noqa: BLE001 - a variant that fails to compile is a result
                row = dict(d=d, kernel="variant", config=cfg, error=repr(e)[:300])
            rows.append(row)
            log(json.dumps(row))
    return rows


SWEEP_TILES = {  # (BLOCK_M queries, BLOCK_N keys, warps, stages)
    64: [(64, 64, 4, 3), (128, 64, 4, 2), (128, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (64, 128, 8, 3),
         (128, 128, 8, 2), (128, 128, 8, 3)],
    128: [(64, 128, 8, 3), (64, 128, 8, 2), (32, 128, 8, 3), (64, 64, 4, 3), (64, 64, 8, 3), (128, 64, 8, 2),
          (128, 64, 8, 3), (128, 32, 8, 3), (128, 128, 8, 2)],
}  # fmt: skip


def sweep(d: int, path: str, top: int = 3) -> list[dict]:
    """Our dK/dV kernel at its tuned tiles, then the variant at every SWEEP_TILES entry with K and V
    through descriptors, keys or queries along rows (SWAP), dP first or not; then the `top` fastest
    again with the unmasked loop warp-specialised. do_bench medians (rep 300 ms) side by side in this
    process, each checked against our kernel's dK and dV, and the `top` fastest launched batch-first;
    results are written to `path` after every row, so
    a run cut short keeps what it measured."""
    from triton.testing import do_bench

    (q, k, v, do, lse, delta), dk, dv, tuned, ours_ms = ours_at_leaderboard(d)
    ref_dk, ref_dv = dk.clone(), dv.clone()
    rows = RESULTS.setdefault(f"sweep_d{d}", [])
    rows.append(dict(kernel="ours", config=tuned, ms=ours_ms))
    log(d, json.dumps(rows[-1]))

    def run(cfg: dict) -> None:
        t0 = time.perf_counter()
        try:
            launch_variant(q, k, v, do, lse, delta, dk, dv, cfg)
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            err = max(
                float((x.double() - r.double()).norm() / r.double().norm()) for x, r in ((dk, ref_dk), (dv, ref_dv))
            )
            ms = do_bench(lambda: launch_variant(q, k, v, do, lse, delta, dk, dv, cfg), rep=300)
            row = dict(kernel="variant", config=cfg, ms=ms, rel_diff=err, first_call_s=first_s)
        except Exception as e:  # noqa: BLE001 - a variant that fails to compile or run is a result
            row = dict(kernel="variant", config=cfg, error=repr(e)[:300])
        rows.append(row)
        log(d, json.dumps(row))
        with open(path, "w") as f:
            json.dump(RESULTS, f, indent=1)

    for bm, bn, warps, stages in SWEEP_TILES[d]:
        for swap in (False, True):
            for dp_first in (False, True):
                run(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, KV_TMA=True,
                         DP_FIRST=dp_first, SWAP=swap))  # fmt: skip
    ok = sorted((r for r in rows if r["kernel"] == "variant" and "ms" in r and r["rel_diff"] < 1e-2),
                key=lambda r: r["ms"])  # fmt: skip
    for r in ok[:top]:
        run({**r["config"], "WS": True})
    for r in ok[:top]:
        run({**r["config"], "BATCH_MAJOR": True})
    return rows


def kernel_table(prof, iterations: int) -> list[dict]:
    rows = {}
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0)
        if us and e.key and not e.key.startswith("ProfilerStep"):
            rows[e.key] = rows.get(e.key, 0.0) + us
    out = [dict(kernel=k[:90], us_per_iter=v / iterations) for k, v in sorted(rows.items(), key=lambda kv: -kv[1])]
    return [r for r in out if r["us_per_iter"] >= 1.0][:12]


def overhead(d: int) -> dict:
    """Autograd-level timings against kernel-alone timings and CPU launch time, ours and cuDNN."""
    from torch.profiler import ProfilerActivity, profile
    from triton.testing import do_bench

    from lmperf.benchmarks import flash as bench
    from lmperf.flash import tuning
    from lmperf.flash.triton_backward import launch_dkdv, launch_dq

    out: dict = {}
    q, k, v, do = bench.make_inputs(16, 16384, d, torch.bfloat16)
    for impl in ("flash_triton", "sdpa_cudnn"):
        fn = bench.IMPLEMENTATIONS[impl]
        o = fn(q, k, v, True)
        o.backward(do, retain_graph=True)
        torch.cuda.synchronize()
        row: dict = {}

        def forward(fn=fn):
            return fn(q, k, v, True)

        def backward(o=o):
            o.backward(do, retain_graph=True)

        row["forward_ms"] = do_bench(forward, warmup=50, rep=300, return_mode="median")
        row["backward_ms"] = do_bench(backward, warmup=50, rep=300, grad_to_none=[q, k, v], return_mode="median")
        for name, f in (("forward", forward), ("backward", backward)):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(20):
                f()
            row[f"{name}_cpu_us"] = (time.perf_counter() - t) / 20 * 1e6
            torch.cuda.synchronize()
            for t_ in (q, k, v):
                t_.grad = None
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                backward()
                forward()
            torch.cuda.synchronize()
        row["kernels"] = kernel_table(prof, 5)
        out[impl] = row
        log(d, impl, json.dumps({kk: vv for kk, vv in row.items() if kk != "kernels"}))
        for r in row["kernels"]:
            log("   ", f"{r['us_per_iter']:9.1f} us", r["kernel"])
        o = None
    # our kernels alone, at the tiles the tuner chose
    from lmperf.flash import flash_forward

    o, lse = flash_forward(q.detach(), k.detach(), v.detach(), True)
    delta = delta_of(o, do)
    dk, dv, dq = torch.empty_like(k), torch.empty_like(v), torch.empty_like(q)
    configs = {kern: tuning.LAST.get(kern, {}).get("config") for kern in ("fwd", "dkdv", "dq")}
    out["configs"] = configs
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    out["dkdv_alone_ms"] = do_bench(
        lambda: launch_dkdv(qd, kd, vd, do, lse, delta, dk, dv, True, configs["dkdv"], "ieee"), rep=300
    )
    out["dq_alone_ms"] = do_bench(
        lambda: launch_dq(qd, kd, vd, do, lse, delta, dq, True, configs["dq"], "ieee"), rep=300
    )
    out["fwd_alone_ms"] = do_bench(lambda: flash_forward(qd, kd, vd, True), rep=300)
    out["delta_torch_ms"] = do_bench(lambda: delta_of(o, do), rep=300)
    log(d, "alone:", json.dumps({kk: vv for kk, vv in out.items() if kk.endswith("_ms")}), configs)
    # variants of the dK/dV pass at the tuned tiles
    base = {kk: vv for kk, vv in configs["dkdv"].items() if kk != "USE_TMA"}
    out["variants"] = []
    for kv_tma in (False, True):
        for dp_first in (False, True):
            cfg = {**base, "KV_TMA": kv_tma, "DP_FIRST": dp_first}
            try:
                ref_dk = dk.clone()
                launch_variant(qd, kd, vd, do, lse, delta, dk, dv, cfg)
                torch.cuda.synchronize()
                err = float((dk.double() - ref_dk.double()).norm() / ref_dk.double().norm())
                ms = do_bench(lambda cfg=cfg: launch_variant(qd, kd, vd, do, lse, delta, dk, dv, cfg), rep=300)
                row = dict(config=cfg, ms=ms, dk_rel_diff=err)
            except Exception as e:  # noqa: BLE001 - a variant that fails to compile is a result
                row = dict(config=cfg, error=repr(e)[:300])
            out["variants"].append(row)
            log(d, "variant", json.dumps(row))
    return out


def compiled_kernels() -> list[dict]:
    """n_regs / n_spills of every compiled variant of our three kernels in this process."""
    from lmperf.flash.triton_backward import flash_bwd_dkdv_kernel, flash_bwd_dq_kernel
    from lmperf.flash.triton_forward import flash_fwd_kernel

    rows = []
    for name, fn in (
        ("fwd", flash_fwd_kernel),
        ("dkdv", flash_bwd_dkdv_kernel),
        ("dq", flash_bwd_dq_kernel),
        ("variant", dkdv_variant_kernel),
    ):
        for caches in getattr(fn, "device_caches", {}).values():
            cache = caches[0] if isinstance(caches, tuple) else caches
            for kern in cache.values():
                meta = kern.metadata
                rows.append(
                    dict(
                        kernel=name,
                        num_warps=getattr(meta, "num_warps", None),
                        num_stages=getattr(meta, "num_stages", None),
                        shared=getattr(meta, "shared", None),
                        n_regs=getattr(kern, "n_regs", None),
                        n_spills=getattr(kern, "n_spills", None),
                        constants=str(getattr(getattr(kern, "src", None), "constants", ""))[:400],
                    )
                )
                log("compiled", json.dumps(rows[-1]))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--check-only", action="store_true")
    p.add_argument("--variants", action="store_true", help="time the dK/dV variants over a few tile choices")
    p.add_argument("--sweep", action="store_true", help="time the dK/dV variant over SWEEP_TILES (see sweep)")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        tiles = [dict(BLOCK_M=16, BLOCK_N=32), dict(BLOCK_M=32, BLOCK_N=16), dict(BLOCK_M=32, BLOCK_N=32)]
        rows = check_variants("cpu", torch.float16, [(2, 80, 16), (1, 64, 32)], dict(BLOCK_M=16, BLOCK_N=32), tiles)
        return 0 if all(r["ok"] for r in rows) else 1
    t0 = time.time()
    cfg = dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3)
    shapes = [(2, 1000, 64)] if args.variants else [(2, 1000, 64), (1, 777, 128)]
    swept, flag_sets = None, None
    if args.sweep:  # the sweep's flags only, at a tile of each shape kind (ragged lengths: the tail loop)
        swept = [cfg, dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2)]
        flag_sets = [f for f in VARIANT_FLAGS if f["KV_TMA"] and not f["NT"]]
    RESULTS["check"] = check_variants("cuda", torch.bfloat16, shapes, cfg, swept, flag_sets)
    if args.sweep:
        path = os.path.join(os.environ.get("OUT", "."), "flash_bwd_sweep.json")
        for d in args.head_dims:
            sweep(d, path)
            torch.cuda.empty_cache()
        RESULTS["compiled"] = compiled_kernels()
    elif args.variants:
        tiles = {64: [(64, 64, 4, 3), (64, 128, 8, 3)], 128: [(64, 128, 8, 3), (64, 128, 8, 2), (128, 128, 8, 2)]}
        RESULTS["variants"] = [row for d in args.head_dims for row in time_variants(d, tiles[d])]
        RESULTS["compiled"] = compiled_kernels()
    elif not args.check_only:
        for d in args.head_dims:
            RESULTS[f"d{d}"] = overhead(d)
            torch.cuda.empty_cache()
        RESULTS["compiled"] = compiled_kernels()
    RESULTS["wall_s"] = time.time() - t0
    path = os.path.join(os.environ.get("OUT", "."), "flash_bwd_probe.json")
    with open(path, "w") as f:
        json.dump(RESULTS, f, indent=1)
    log("wrote", path, "checks ok:", all(r["ok"] for r in RESULTS["check"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
