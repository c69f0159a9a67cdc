"""FlashAttention-2, as the course defines it: ``FlashAttention2PyTorch`` (tiled PyTorch, any device),
``FlashAttention2Triton`` (Triton forward and backward) and ``flash_attention`` (picks one for the
device). Causal masks align at the top-left (query i sees key j iff i >= j). The Triton parts import
lazily: importing this package needs no Triton.
"""

from __future__ import annotations

import importlib

import torch

from .reference import FlashAttention2PyTorch, attention_reference

_TRITON_NAMES = {
    "FlashAttention2Triton": "autograd",
    "FlashAttention2TritonCompiledBackward": "autograd",
    "flash_backward_compiled": "autograd",
    "flash_forward": "triton_forward",
    "flash_backward": "autograd",
}

__all__ = ["FlashAttention2PyTorch", "attention_reference", "flash_attention", *_TRITON_NAMES]


def __getattr__(name):
    if name in _TRITON_NAMES:
        return getattr(importlib.import_module(f".{_TRITON_NAMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v for (..., seq, d) tensors, differentiable: CUDA tensors (any, under
    the Triton interpreter) go to the Triton kernels, the rest to the tiled PyTorch version."""
    if q.dim() == 2:
        return flash_attention(q[None], k[None], v[None], is_causal)[0]
    try:
        from .triton_forward import INTERPRETED
    except ImportError:  # no Triton installed
        INTERPRETED = False
    if q.is_cuda or INTERPRETED:
        from .autograd import FlashAttention2Triton

        return FlashAttention2Triton.apply(q, k, v, is_causal)
    return FlashAttention2PyTorch.apply(q, k, v, is_causal)
