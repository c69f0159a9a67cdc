"""The autograd.Functions around the Triton FlashAttention-2 kernels.

- `FlashAttention2Triton`: Triton forward and Triton backward (the fast one).
- `FlashAttention2TritonCompiledBackward`: Triton forward, and the course's accepted backward:
  the flash_backward equations in plain PyTorch on whole (n_q, n_k) matrices, wrapped in
  `torch.compile` (`flash_backward_compiled`). It materialises P, so it is memory-hungry.

Both take (batch, seq, d) tensors (more leading dims are folded into batch), return O and
save (L, Q, K, V, O) with L the float32 log-sum-exp of shape (*leading, n_queries).
"""

from __future__ import annotations

import math

import torch

from .inputs import TRITON_HEAD_DIM_RANGE, check_qkv, fold_batch
from .reference import causal_mask
from .triton_backward import flash_backward
from .triton_common import check_device
from .triton_forward import flash_forward


def _triton_forward(ctx, Q, K, V, is_causal):
    check_qkv(Q, K, V, head_dim_range=TRITON_HEAD_DIM_RANGE)
    check_device(Q, K, V)
    o3, lse3 = flash_forward(fold_batch(Q), fold_batch(K), fold_batch(V), bool(is_causal))
    O = o3.reshape(Q.shape)
    L = lse3.reshape(Q.shape[:-1])
    ctx.save_for_backward(L, Q, K, V, O)
    ctx.is_causal = bool(is_causal)
    return O


class FlashAttention2Triton(torch.autograd.Function):
    """apply(Q, K, V, is_causal=False) -> O; Triton forward and Triton backward."""

    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        return _triton_forward(ctx, Q, K, V, is_causal)

    @staticmethod
    def backward(ctx, dO):
        L, Q, K, V, O = ctx.saved_tensors
        dq, dk, dv = flash_backward(
            fold_batch(Q),
            fold_batch(K),
            fold_batch(V),
            fold_batch(O),
            L.reshape(-1, L.shape[-1]),
            fold_batch(dO),
            ctx.is_causal,
        )
        return dq.reshape(Q.shape), dk.reshape(K.shape), dv.reshape(V.shape), None


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


class FlashAttention2TritonCompiledBackward(torch.autograd.Function):
    """apply(Q, K, V, is_causal=False) -> O; Triton forward, torch.compile'd PyTorch backward."""

    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        return _triton_forward(ctx, Q, K, V, is_causal)

    @staticmethod
    def backward(ctx, dO):
        L, Q, K, V, O = ctx.saved_tensors
        dq, dk, dv = flash_backward_compiled(Q, K, V, O, dO, L, ctx.is_causal)
        return dq, dk, dv, None
