"""Probe (issue 12): the backward's dK/dV pass in Gluon, warp-specialised as the forward of v11.

Our dK/dV pass (Triton) is register-bound at d = 128 (bench/flash_notes.md, v7): each program holds K,
V and both accumulators. Here one CTA owns 128 keys: a producer warp loads its K and V once and then
streams query tiles (Q and dO, 64 rows each) through a ring of `STAGES` shared-memory buffers; two
consumer warpgroups (64 keys each, 240 registers each) share every query tile and free a ring stage
once both have read it. Each consumer keeps K and V in shared memory as wgmma operands and computes,
per query tile, S^T = K Q^T and dP^T = V dO^T (both operands from shared memory), then
P^T = exp2(S^T * scale - L), dS^T = P^T (dP^T - Delta), dV += P^T dO and dK += dS^T Q (P^T, dS^T from
registers). Causal masking runs only on the tiles that cross the diagonal.

Only what the probe needs: bf16, (batch, n, d) inputs with n a multiple of 128, d in {64, 128}, equal
query and key lengths, causal. Its dK and dV are checked against our Triton dK/dV pass, then timed beside
it at the leaderboard's inputs (16 x 16384 x d, do_bench medians).

    python bench/flash_gluon_bwd.py                   # on a Hopper GPU; writes $OUT/flash_gluon_bwd.json
    python bench/flash_gluon_bwd.py --compile-only    # sm_90 build on any machine: registers, spills
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flash_gluon_fwd import _tma_load, _tma_store, ws_maxnreg  # noqa: E402

LOG2E = 1.4426950408889634
BLOCK_Q = 64  # query rows per ring stage
KEYS_PER_WG = 64


@gluon.jit
def _dkdv_loader(
    q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, kv_bar, q_smem, do_smem, q_bars, do_bars, empty_bars,
    row0, k0, q_start, n_q_tiles,
):  # fmt: skip
    """Producer warp: the CTA's K and V halves once, then Q and dO tiles into the ring."""
    BQ: gl.constexpr = q_desc.block_type.shape[0]
    STAGES: gl.constexpr = q_smem.type.shape[0]
    mbarrier.expect(kv_bar, 4 * k_desc.block_type.nbytes)
    for h in gl.static_range(2):
        _tma_load(k_desc, [row0 + k0 + h * BQ, 0], kv_bar, k_smem.index(h))
        _tma_load(v_desc, [row0 + k0 + h * BQ, 0], kv_bar, v_smem.index(h))
    for i in range(n_q_tiles):
        s = i % STAGES
        mbarrier.wait(empty_bars.index(s), ((i // STAGES) & 1) ^ 1)
        q0 = (q_start + i) * BQ
        mbarrier.expect(q_bars.index(s), q_desc.block_type.nbytes)
        _tma_load(q_desc, [row0 + q0, 0], q_bars.index(s), q_smem.index(s))
        mbarrier.expect(do_bars.index(s), do_desc.block_type.nbytes)
        _tma_load(do_desc, [row0 + q0, 0], do_bars.index(s), do_smem.index(s))


@gluon.jit
def _dkdv_consumer(
    k, v, kv_bar, q_smem, do_smem, q_bars, do_bars, empty_bars, dk_desc, dv_desc, L, Delta, qk_scale, sm_scale,
    row0, kr0, q_start, n_q_tiles,
):  # fmt: skip
    """One consumer warpgroup: dK and dV of the 64 keys from kr0 (K, V in `k`, `v`)."""
    NK: gl.constexpr = k.type.shape[0]
    HEAD_DIM: gl.constexpr = k.type.shape[1]
    BQ: gl.constexpr = q_smem.type.shape[1]
    STAGES: gl.constexpr = q_smem.type.shape[0]
    dtype: gl.constexpr = k.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BQ, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)

    keys = kr0 + gl.arange(0, NK, layout=row_s)
    dk = gl.zeros([NK, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([NK, HEAD_DIM], gl.float32, acc_layout)
    mbarrier.wait(kv_bar, 0)
    for i in range(n_q_tiles):
        s = i % STAGES
        phase = (i // STAGES) & 1
        q0 = (q_start + i) * BQ
        cols = q0 + gl.arange(0, BQ, layout=col_s)
        lse2 = gl.load(L + row0 + cols) * 1.4426950408889634
        delta = gl.load(Delta + row0 + cols)
        q = q_smem.index(s)
        do = do_smem.index(s)
        zeros = gl.zeros([NK, BQ], gl.float32, s_layout)
        mbarrier.wait(q_bars.index(s), phase)
        st_tok = warpgroup_mma(k, q.permute((1, 0)), zeros, use_acc=False, is_async=True)
        mbarrier.wait(do_bars.index(s), phase)
        dpt_tok = warpgroup_mma(v, do.permute((1, 0)), zeros, use_acc=False, is_async=True)
        st = warpgroup_mma_wait(1, deps=(st_tok,))
        pt = gl.exp2(st * qk_scale - lse2[None, :])
        if q0 < kr0 + NK:  # the tile crosses the diagonal: queries before a key do not see it
            pt = gl.where(cols[None, :] >= keys[:, None], pt, 0.0)
        pt_a = gl.convert_layout(pt.to(dtype), a_layout)
        dv_tok = warpgroup_mma(pt_a, do, dv, is_async=True)
        dpt = warpgroup_mma_wait(1, deps=(dpt_tok,))
        dst = pt * (dpt - delta[None, :])
        dst_a = gl.convert_layout(dst.to(dtype), a_layout)
        dk_tok = warpgroup_mma(dst_a, q, dk, is_async=True)
        dv, dk, pt_a, dst_a = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, pt_a, dst_a))
        mbarrier.arrive(empty_bars.index(s), count=1)

    # K and V are no longer needed: their buffers stage dK and dV for the TMA stores
    k.store((dk * sm_scale).to(dtype))
    v.store(dv.to(dtype))
    fence_async_shared()
    _tma_store(dk_desc, [row0 + kr0, 0], k)
    _tma_store(dv_desc, [row0 + kr0, 0], v)
    tma.store_wait(pendings=0)


@gluon.jit
def gluon_dkdv_ws_kernel(
    q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, L, Delta, qk_scale, sm_scale, n_ctx,
    STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """Causal dK/dV: one CTA per 128 keys, longest query range first; a producer warp and two consumer
    warpgroups (the default partition and one worker, 64 keys each)."""
    BQ: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    dtype: gl.constexpr = q_desc.dtype
    k0 = gl.program_id(0) * (2 * BQ)
    row0 = gl.program_id(1) * n_ctx
    q_start = k0 // BQ  # the first query tile that sees any of these keys
    n_q_tiles = n_ctx // BQ - q_start

    k_smem = gl.allocate_shared_memory(dtype, [2, BQ, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, BQ, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BQ, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BQ, HEAD_DIM], do_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(do_bars.index(i), count=1)
        mbarrier.init(empty_bars.index(i), count=2)  # both consumer warpgroups release a stage

    ring = (q_smem, do_smem, q_bars, do_bars, empty_bars)
    out = (dk_desc, dv_desc, L, Delta, qk_scale, sm_scale, row0)
    first = (k_smem.index(0), v_smem.index(0), kv_bar) + ring + out + (k0, q_start, n_q_tiles)
    second = (k_smem.index(1), v_smem.index(1), kv_bar) + ring + out + (k0 + BQ, q_start, n_q_tiles)
    loader = (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, kv_bar) + ring + (row0, k0, q_start, n_q_tiles)
    gl.warp_specialize(
        [(_dkdv_consumer, first), (_dkdv_consumer, second), (_dkdv_loader, loader)], [4, 1], [CONSUMER_REGS, 24]
    )


def _layout(head_dim: int):
    return gl.NVMMASharedLayout.get_default_for([BLOCK_Q, head_dim], gl.bfloat16)


def dkdv(q, k, v, do, lse, delta, *, stages=2, consumer_regs=240):
    """(dK, dV) of causal attention for (batch, n, d) bf16 tensors; lse (natural log) and delta
    (rowsum(dO * O)) of shape (batch, n), float32, as our kernels keep them."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    batch, n, d = q.shape
    bf16 = all(t.dtype == torch.bfloat16 for t in (q, k, v, do))
    if not bf16 or n % 128 or d not in (64, 128) or not (q.shape == k.shape == v.shape == do.shape):
        raise ValueError(f"probe limits: bf16, n a multiple of 128, d 64 or 128, equal shapes; got {q.shape}")
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    layout = _layout(d)
    descs = [TensorDescriptor.from_tensor(t.reshape(batch * n, d), [BLOCK_Q, d], layout) for t in (q, k, v, do, dk, dv)]
    sm_scale = 1.0 / math.sqrt(d)
    gluon_dkdv_ws_kernel[(n // 128, batch)](
        *descs, lse.contiguous(), delta.contiguous(), sm_scale * LOG2E, sm_scale, n,
        STAGES=stages, CONSUMER_REGS=consumer_regs, num_warps=4, maxnreg=ws_maxnreg(consumer_regs),
    )  # fmt: skip
    return dk, dv


def compile_only(head_dim: int, stages: int, consumer_regs: int = 240) -> dict:
    """Build the kernel for sm_90 without a GPU: registers and stack (spills) per thread, shared bytes."""
    from flash_probe_aot import resources
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    desc = f"tensordesc<bf16[{BLOCK_Q}, {head_dim}],{_layout(head_dim)!r}>"
    signature = {name: desc for name in ("q_desc", "k_desc", "v_desc", "do_desc", "dk_desc", "dv_desc")}
    signature.update(L="*fp32", Delta="*fp32", qk_scale="fp32", sm_scale="fp32", n_ctx="i32")
    signature.update(STAGES="constexpr", CONSUMER_REGS="constexpr", num_warps="constexpr")
    constexprs = dict(STAGES=stages, CONSUMER_REGS=consumer_regs, num_warps=4)
    source = GluonASTSource(
        gluon_dkdv_ws_kernel, signature, constexprs=constexprs, attrs={(6,): [["tt.divisibility", 16]]}
    )
    options = dict(num_warps=4, maxnreg=ws_maxnreg(consumer_regs))
    return resources(triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options))


CONFIGS = {64: [(2, 240), (3, 240), (4, 240)], 128: [(2, 240), (3, 240)]}  # (stages, consumer registers)


def run_gpu(rep_ms: int, out_path: str, head_dims=(64, 128)) -> dict:
    import torch
    from flash_bwd_probe import ours_at_leaderboard
    from triton.testing import do_bench

    from lmperf.flash.triton_backward import launch_dkdv

    results = {"device": torch.cuda.get_device_name(), "rows": []}
    for d in head_dims:
        (q, k, v, do, lse, delta), dk_ref, dv_ref, tuned, _ = ours_at_leaderboard(d)
        dk_ours, dv_ours = torch.empty_like(k), torch.empty_like(v)
        ours = functools.partial(launch_dkdv, q, k, v, do, lse, delta, dk_ours, dv_ours, True, tuned, "ieee")
        ms = do_bench(ours, warmup=200, rep=rep_ms, return_mode="median")
        results["rows"].append({"impl": "ours_triton_dkdv", "head_dim": d, "config": tuned, "ms": ms})
        print(f"d={d:3d} ours dK/dV {ms:.3f} ms  {tuned}", flush=True)
        for stages, regs in CONFIGS[d]:
            name = f"gluon ws dkdv s{stages} r{regs}"
            row = {"impl": name, "head_dim": d, "stages": stages, "consumer_regs": regs}
            try:
                dk, dv = dkdv(q, k, v, do, lse, delta, stages=stages, consumer_regs=regs)
                torch.cuda.synchronize()
                for name_, x, ref in (("dk", dk, dk_ref), ("dv", dv, dv_ref)):
                    row[f"{name_}_rel_diff"] = ((x.float() - ref.float()).norm() / ref.float().norm()).item()
                run = functools.partial(dkdv, q, k, v, do, lse, delta, stages=stages, consumer_regs=regs)
                row["ms"] = do_bench(run, warmup=200, rep=rep_ms, return_mode="median")
                print(
                    f"d={d:3d} {name:24s} {row['ms']:.3f} ms  dK rel diff {row['dk_rel_diff']:.2e}  "
                    f"dV rel diff {row['dv_rel_diff']:.2e}",
                    flush=True,
                )
            except Exception as e:  # a config that does not build or fit is a result of the probe
                row["error"] = f"{type(e).__name__}: {e}"[:400]
                print(f"d={d:3d} {name:24s} ERROR {row['error']}", flush=True)
            results["rows"].append(row)
            with open(out_path, "w") as fh:
                json.dump(results, fh, indent=1)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--rep-ms", type=int, default=500)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "flash_gluon_bwd.json"))
    args = parser.parse_args(argv)
    if args.compile_only:
        for d in (64, 128):
            for stages, regs in CONFIGS[d]:
                try:
                    print(d, stages, regs, compile_only(d, stages, regs), flush=True)
                except Exception as e:
                    print(d, stages, regs, "ERROR", type(e).__name__, str(e)[:3000], flush=True)
        return
    run_gpu(args.rep_ms, args.out, [int(d) for d in args.head_dims.split(",")])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
