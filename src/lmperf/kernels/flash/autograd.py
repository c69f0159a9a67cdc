"""The autograd.Functions around the Triton FlashAttention-2 kernels, on (batch, seq, d) tensors:
``FlashAttention2Triton`` (Triton forward and backward) and ``FlashAttention2TritonCompiledBackward``
(the course's accepted backward: the equations on whole matrices under torch.compile; memory-hungry).
"""

from __future__ import annotations

import math

import torch

from .inputs import TRITON_HEAD_DIM_RANGE, check_qkv, folded_backward, save_folded
from .reference import causal_mask
from .triton_backward import launch_delta, launch_dkdv, launch_dq
from .triton_common import INTERPRETED, check_device, dot_precision
from .triton_forward import flash_forward


@torch.compiler.disable  # the tuner reads and writes files: run eagerly under torch.compile
def flash_backward(
    q,
    k,
    v,
    o,
    lse,
    do,
    is_causal: bool = False,
    dkdv_config: dict | None = None,
    dq_config: dict | None = None,
    tf32: bool | None = None,
):
    """(dQ, dK, dV) for (B, n, d) tensors with head dim stride 1 and L (B, n_q) float32; a config
    ({"BLOCK_M", "BLOCK_N", optional "num_warps", "num_stages"}) bypasses the tuner for its pass."""
    from . import tuning

    check_device(q, k, v, o, do)
    batch, n_q, d = q.shape
    if do.stride(-1) != 1:  # e.g. the expanded ones of o.sum().backward()
        do = do.contiguous()
    is_causal = bool(is_causal)
    precision = dot_precision(q.dtype, tf32)
    default_launch = {"num_warps": 4, "num_stages": 1 if INTERPRETED else 2}

    delta = torch.empty(batch, n_q, device=q.device, dtype=torch.float32)
    launch_delta(o, do, delta)

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if dkdv_config is None:
        launch = lambda c: launch_dkdv(q, k, v, do, lse, delta, dk, dv, is_causal, c, precision)  # noqa: E731
        dkdv_config = tuning.choose("dkdv", q, k, is_causal, precision, launch, outputs=(dk, dv))
    else:
        dkdv_config = {**default_launch, **dkdv_config}
    launch_dkdv(q, k, v, do, lse, delta, dk, dv, is_causal, dkdv_config, precision)
    if dq_config is None:
        launch = lambda c: launch_dq(q, k, v, do, lse, delta, dq, is_causal, c, precision)  # noqa: E731
        dq_config = tuning.choose("dq", q, k, is_causal, precision, launch, outputs=(dq,))
    else:
        dq_config = {**default_launch, **dq_config}
    launch_dq(q, k, v, do, lse, delta, dq, is_causal, dq_config, precision)
    return dq, dk, dv


class FlashAttention2Triton(torch.autograd.Function):
    """apply(Q, K, V, is_causal=False) -> O; Triton forward and Triton backward."""

    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        check_qkv(Q, K, V, head_dim_range=TRITON_HEAD_DIM_RANGE)
        check_device(Q, K, V)
        return save_folded(ctx, flash_forward, Q, K, V, is_causal)

    @staticmethod
    def backward(ctx, dO):
        return folded_backward(ctx, dO, lambda q, k, v, o, do, lse, c: flash_backward(q, k, v, o, lse, do, c))


def flash_backward_dense(Q, K, V, O, dO, L, is_causal: bool):
    """The flash_backward equations on whole matrices, in float32: (dQ, dK, dV).

    D = rowsum(O * dO); P = exp(S - L); dV = P^T dO; dP = dO V^T; dS = P * (dP - D);
    dQ = dS K / sqrt(d); dK = dS^T Q / sqrt(d). Shapes (..., n, d); L (..., n_q).
    """
    scale = 1.0 / math.sqrt(Q.shape[-1])
    q, k, v, o, do = (t.float() for t in (Q, K, V, O, dO))
    delta = (o * do).sum(dim=-1, keepdim=True)  # (..., n_q, 1)
    p = torch.exp(q @ k.transpose(-1, -2) * scale - L.float()[..., None])  # (..., n_q, n_k)
    if is_causal:
        p = p.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), 0.0)
    dv = p.transpose(-1, -2) @ do
    ds = p * (do @ v.transpose(-1, -2) - delta)
    dq = ds @ k * scale
    dk = ds.transpose(-1, -2) @ q * scale
    return dq.to(Q.dtype), dk.to(K.dtype), dv.to(V.dtype)


# compiled lazily, at the first call; is_causal is a Python bool, so one graph per value
flash_backward_compiled = torch.compile(flash_backward_dense, dynamic=False)


class FlashAttention2TritonCompiledBackward(FlashAttention2Triton):
    """apply(Q, K, V, is_causal=False) -> O; Triton forward, torch.compile'd PyTorch backward."""

    @staticmethod
    def backward(ctx, dO):
        return folded_backward(ctx, dO, flash_backward_compiled)
