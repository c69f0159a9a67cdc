"""Input checks and batch folding shared by every FlashAttention-2 implementation.

Each implementation works on (batch, seq, d) tensors. Callers may pass more leading dimensions
(e.g. (batch, heads, seq, d)); they are folded into one batch dimension here and unfolded on
the way out, so L comes back with shape (*leading, n_queries).
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
    """Raise ValueError naming the first thing wrong with (q, k, v) for attention.

    q: (..., n_queries, d); k, v: (..., n_keys, d), same leading dims, dtype and device.
    `head_dim_range` (lowest, highest) restricts d (the Triton kernels take 16..256).
    """
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
