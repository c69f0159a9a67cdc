"""Probe (issue 12): a causal forward that splits its query tile in two halves (SPLIT = 2).

Each program owns BLOCK_M queries as two halves of BLOCK_M / 2 rows with their own running max,
sum and accumulator. Per key tile it issues both halves' S = Q K^T, then the first half's softmax
and P V, then the second's: Hopper's wgmma runs asynchronously, so one half's softmax can overlap
the other half's matrix products (the intra-warpgroup overlap FlashAttention-3 schedules by hand;
here it is left to Triton's scheduler). SPLIT = 1 is our forward's loop, for comparison in the same
kernel. Power-of-two head dims, n_q == n_k, bf16/fp16, K and V through tensor descriptors.

At the leaderboard shape (16 x 16384 x d, causal bf16, d = 64 and 128), do_bench medians side by
side in one process: our tuned forward, SDPA's cuDNN and flash backends, and the variant over
tiles x SPLIT x warp specialisation, each checked against our forward's output.

    OUT=/tmp/out python bench/flash_fwd_probe.py            # on an H100 or H200: flash_fwd_probe.json
    TRITON_INTERPRET=1 python bench/flash_fwd_probe.py      # the variants on CPU against float64
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

from lmperf.flash.triton_common import LN2, LOG2E

RESULTS: dict = {}


def log(*args) -> None:
    print(*args, flush=True)


@triton.jit
def _softmax_step(s, m_i, l_i, acc, v, offs_m, offs_n, qk_scale, MASKED: tl.constexpr):
    if MASKED:
        s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@triton.jit
def _key_loop(
    q0, q1, m0, l0, acc0, m1, l1, acc1, k_desc, v_desc, offs_m0, offs_m1, lo, hi, qk_scale,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, MASKED: tl.constexpr, WS: tl.constexpr,
):  # fmt: skip
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = k_desc.load([start_n, 0])
        v = v_desc.load([start_n, 0])
        s0 = tl.dot(q0, tl.trans(k))
        if SPLIT == 2:
            s1 = tl.dot(q1, tl.trans(k))  # issued before the first half's softmax
            m0, l0, acc0 = _softmax_step(s0, m0, l0, acc0, v, offs_m0, offs_n, qk_scale, MASKED)
            m1, l1, acc1 = _softmax_step(s1, m1, l1, acc1, v, offs_m1, offs_n, qk_scale, MASKED)
        else:
            m0, l0, acc0 = _softmax_step(s0, m0, l0, acc0, v, offs_m0, offs_n, qk_scale, MASKED)
    return m0, l0, acc0, m1, l1, acc1


@triton.jit
def fwd_variant_kernel(
    Q, K, V, O, L, stride_b, stride_n, n, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, WS: tl.constexpr,
    HALF: tl.constexpr, BATCH_MAJOR: tl.constexpr,
):  # fmt: skip
    """Causal forward for contiguous (B, n, HEAD_DIM) inputs; grid (cdiv(n, BLOCK_M), B), the last
    query tiles first (BATCH_MAJOR: grid (B, tiles)). HALF = BLOCK_M / SPLIT rows per part; needs
    HALF % BLOCK_N == 0."""
    qk_scale = tl.cast(qk_scale, tl.float32)
    if BATCH_MAJOR:  # grid (batch, query tiles): every batch element's longest programs first
        tile_m = tl.num_programs(1) - 1 - tl.program_id(1)
        b = tl.program_id(0).to(tl.int64)
    else:
        tile_m = tl.num_programs(0) - 1 - tl.program_id(0)
        b = tl.program_id(1).to(tl.int64)
    start_m = tile_m * BLOCK_M
    q_desc = tl.make_tensor_descriptor(
        Q + b * stride_b, shape=[n, HEAD_DIM], strides=[stride_n, 1], block_shape=[HALF, HEAD_DIM]
    )
    k_desc = tl.make_tensor_descriptor(
        K + b * stride_b, shape=[n, HEAD_DIM], strides=[stride_n, 1], block_shape=[BLOCK_N, HEAD_DIM]
    )
    v_desc = tl.make_tensor_descriptor(
        V + b * stride_b, shape=[n, HEAD_DIM], strides=[stride_n, 1], block_shape=[BLOCK_N, HEAD_DIM]
    )
    offs_m0 = start_m + tl.arange(0, HALF)
    offs_m1 = offs_m0 + HALF
    q0 = q_desc.load([start_m, 0])
    q1 = q0
    if SPLIT == 2:
        q1 = q_desc.load([start_m + HALF, 0])
    m0 = tl.full([HALF], float("-inf"), dtype=tl.float32)
    l0 = tl.zeros([HALF], dtype=tl.float32)
    acc0 = tl.zeros([HALF, HEAD_DIM], dtype=tl.float32)
    m1, l1, acc1 = m0, l0, acc0
    # keys below start_m are below the diagonal for every row; [start_m, start_m + BLOCK_M) straddle
    # it (masked). Out-of-range keys read as zero and are masked by the diagonal (key > query).
    m0, l0, acc0, m1, l1, acc1 = _key_loop(
        q0, q1, m0, l0, acc0, m1, l1, acc1, k_desc, v_desc, offs_m0, offs_m1, 0, start_m, qk_scale,
        BLOCK_N, SPLIT, False, WS,
    )  # fmt: skip
    m0, l0, acc0, m1, l1, acc1 = _key_loop(
        q0, q1, m0, l0, acc0, m1, l1, acc1, k_desc, v_desc, offs_m0, offs_m1, start_m, tl.minimum(start_m + BLOCK_M, n),
        qk_scale, BLOCK_N, SPLIT, True, False,
    )  # fmt: skip
    offs_d = tl.arange(0, HEAD_DIM)
    o_base = O + b * stride_b
    tl.store(o_base + offs_m0[:, None] * stride_n + offs_d[None, :], (acc0 / l0[:, None]).to(O.dtype.element_ty),
             mask=(offs_m0 < n)[:, None])  # fmt: skip
    tl.store(L + b * n + offs_m0, (m0 + tl.math.log2(l0)) * LN2, mask=offs_m0 < n)
    if SPLIT == 2:
        tl.store(o_base + offs_m1[:, None] * stride_n + offs_d[None, :], (acc1 / l1[:, None]).to(O.dtype.element_ty),
                 mask=(offs_m1 < n)[:, None])  # fmt: skip
        tl.store(L + b * n + offs_m1, (m1 + tl.math.log2(l1)) * LN2, mask=offs_m1 < n)


def launch_variant(q, k, v, o, lse, config: dict) -> None:
    from lmperf.flash.triton_common import set_tma_allocator

    set_tma_allocator(q.device)
    batch, n, d = q.shape
    cfg = {"SPLIT": 1, "WS": False, "BATCH_MAJOR": False, **config}
    assert (cfg["BLOCK_M"] // cfg["SPLIT"]) % cfg["BLOCK_N"] == 0, cfg
    assert all(t.is_contiguous() for t in (q, k, v, o)) and d == triton.next_power_of_2(d)
    tiles = triton.cdiv(n, cfg["BLOCK_M"])
    fwd_variant_kernel[(batch, tiles) if cfg["BATCH_MAJOR"] else (tiles, batch)](
        q, k, v, o, lse, q.stride(0), q.stride(1), n, LOG2E / math.sqrt(d), HEAD_DIM=d, HALF=cfg["BLOCK_M"] // cfg["SPLIT"],
        **cfg,
    )  # fmt: skip


def reference(q, k, v):
    """Causal attention and its logsumexp in float64."""
    qd, kd, vd = (t.double() for t in (q, k, v))
    s = qd @ kd.transpose(1, 2) / math.sqrt(q.shape[-1])
    n = q.shape[1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ vd, torch.logsumexp(s, -1)


def check(device: str, dtype, shapes, configs) -> list[dict]:
    rows = []
    for batch, n, d in shapes:
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v = (torch.randn(batch, n, d, generator=g).to(device, dtype) for _ in range(3))
        ref_o, ref_l = reference(q, k, v)
        for cfg in configs:
            o, lse = torch.empty_like(q), torch.empty(batch, n, device=device, dtype=torch.float32)
            launch_variant(q, k, v, o, lse, cfg)
            err_o = float((o.double() - ref_o).abs().max())
            err_l = float((lse.double() - ref_l).abs().max())
            rows.append(dict(shape=[batch, n, d], config=cfg, err_o=err_o, err_l=err_l, ok=max(err_o, err_l) < 2e-2))
            log(json.dumps(rows[-1]))
    return rows


TILES = {  # (BLOCK_M, BLOCK_N, warps, stages)
    64: [(128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (256, 64, 8, 3), (256, 128, 8, 2), (128, 64, 4, 2)],
    128: [(128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 2), (256, 64, 8, 2), (256, 128, 8, 2), (128, 32, 4, 3)],
}


def sweep(d: int, path: str, top: int = 3, batch: int = 16, n: int = 16384, device: str = "cuda") -> None:
    """Our forward, SDPA's cuDNN and flash backends, then the variant over TILES[d] x SPLIT, then the
    `top` fastest warp-specialised and launched batch-first; results are written to `path` after
    every row."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from lmperf.flash import flash_forward

    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(batch, n, d, generator=g).to(device, torch.bfloat16) for _ in range(3))
    flops = 4 * batch * n**2 * d / 2
    rows = RESULTS.setdefault(f"d{d}", [])

    def add(row: dict) -> None:
        if "ms" in row:
            row["tflops"] = flops / row["ms"] / 1e9
        rows.append(row)
        log(d, json.dumps(row))
        with open(path, "w") as f:
            json.dump(RESULTS, f, indent=1)

    ref_o, _ = flash_forward(q, k, v, True)
    add(dict(kernel="ours", ms=do_bench(lambda: flash_forward(q, k, v, True), rep=300)))
    qh, kh, vh = (t.unsqueeze(1) for t in (q, k, v))  # (B, 1 head, n, d)
    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                ms = do_bench(lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=True), rep=300)
            add(dict(kernel=name, ms=ms))
        except RuntimeError as e:  # a backend this device or dtype lacks
            add(dict(kernel=name, error=repr(e)[:300]))
    o, lse = torch.empty_like(q), torch.empty(batch, n, device=device, dtype=torch.float32)

    def run(cfg: dict) -> None:
        t0 = time.perf_counter()
        try:
            launch_variant(q, k, v, o, lse, cfg)
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            diff = float((o.float() - ref_o.float()).abs().max())
            ms = do_bench(lambda: launch_variant(q, k, v, o, lse, cfg), rep=300)
            add(dict(kernel="variant", config=cfg, ms=ms, max_abs_diff_vs_ours=diff, first_call_s=first_s))
        except Exception as e:  # noqa: BLE001 - a variant that fails to compile or run is a result
            add(dict(kernel="variant", config=cfg, error=repr(e)[:300]))

    for bm, bn, warps, stages in TILES[d]:
        for split in (1, 2):
            if (bm // split) % bn == 0:
                run(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, SPLIT=split))
    ok = sorted((r for r in rows if r.get("kernel") == "variant" and "ms" in r and r["max_abs_diff_vs_ours"] < 2e-2),
                key=lambda r: r["ms"])  # fmt: skip
    for r in ok[:top]:
        run({**r["config"], "WS": True})
    for r in ok[:top]:
        run({**r["config"], "BATCH_MAJOR": True})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        configs = [dict(BLOCK_M=32, BLOCK_N=16, SPLIT=s) for s in (1, 2)] + [dict(BLOCK_M=16, BLOCK_N=16)]
        rows = check("cpu", torch.float16, [(2, 80, 16), (1, 64, 32), (1, 33, 16)], configs)
        return 0 if all(r["ok"] for r in rows) else 1
    t0 = time.time()
    RESULTS["check"] = check(
        "cuda",
        torch.bfloat16,
        [(2, 1000, 64), (1, 777, 128)],
        [dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, SPLIT=s) for s in (1, 2)],
    )
    path = os.path.join(os.environ.get("OUT", "."), "flash_fwd_probe.json")
    for d in args.head_dims:
        sweep(d, path)
        torch.cuda.empty_cache()
    RESULTS["wall_s"] = time.time() - t0
    with open(path, "w") as f:
        json.dump(RESULTS, f, indent=1)
    log("wrote", path, "checks ok:", all(r["ok"] for r in RESULTS["check"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
