"""Input checks and batch folding shared by every FlashAttention-2 implementation.

Each works on (batch, seq, d) tensors; more leading dims (batch, heads, …) are folded into one batch
dim here and unfolded on the way out, so L comes back with shape (*leading, n_queries).
"""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TRITON_HEAD_DIM_RANGE = (16, 256)  # any value in between: the kernels pad tiles to a power of two


def check_qkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    head_dim_range: tuple[int, int] | None = None,
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES,
) -> None:
    """Raise ValueError naming the first thing wrong with q (..., n_queries, d), k and v (..., n_keys, d)."""
    for name, t in (("Q", q), ("K", k), ("V", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 3:
            raise ValueError(
                f"{name} must have shape (batch, seq, d) (more leading dims allowed), got {tuple(t.shape)}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"Q, K, V must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in dtypes:
        raise ValueError(f"unsupported dtype {q.dtype}; supported: {', '.join(map(str, dtypes))}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"Q, K, V must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"K and V must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"Q and K must have the same leading (batch) dims, got {tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"Q and K must have the same head dim, got {q.shape[-1]} and {k.shape[-1]}")
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        raise ValueError(f"need at least one query and one key, got n_queries={q.shape[-2]}, n_keys={k.shape[-2]}")
    if head_dim_range is not None and not head_dim_range[0] <= q.shape[-1] <= head_dim_range[1]:
        raise ValueError(f"unsupported head dim {q.shape[-1]}; supported: {head_dim_range[0]} to {head_dim_range[1]}")


def fold_batch(t: torch.Tensor) -> torch.Tensor:
    """(..., seq, d) -> (batch, seq, d) with the head dim contiguous (stride 1)."""
    t = t.reshape(-1, t.shape[-2], t.shape[-1])
    return t if t.stride(-1) == 1 else t.contiguous()


def save_folded(ctx, forward, Q, K, V, is_causal) -> torch.Tensor:
    """O of ``forward(q, k, v, causal) -> (O, L)`` on the folded inputs, unfolded; saves (L, Q, K, V, O)."""
    o, lse = forward(fold_batch(Q), fold_batch(K), fold_batch(V), bool(is_causal))
    O = o.reshape(Q.shape)
    ctx.save_for_backward(lse.reshape(Q.shape[:-1]), Q, K, V, O)
    ctx.is_causal = bool(is_causal)
    return O


def folded_backward(ctx, dO, backward) -> tuple:
    """The gradients of ``backward(q, k, v, o, do, lse, causal) -> (dq, dk, dv)`` on the folded saved
    tensors, unfolded (and None for is_causal)."""
    L, Q, K, V, O = ctx.saved_tensors
    dq, dk, dv = backward(*map(fold_batch, (Q, K, V, O, dO)), L.reshape(-1, L.shape[-1]), ctx.is_causal)
    return dq.reshape(Q.shape), dk.reshape(K.shape), dv.reshape(V.shape), None
