"""FlashAttention-2: a tiled PyTorch version and Triton kernels, as the course defines them.

    FlashAttention2PyTorch.apply(Q, K, V, is_causal=False)   tiled PyTorch, any device
    FlashAttention2Triton.apply(Q, K, V, is_causal=False)    Triton forward and backward
    flash_attention(q, k, v, is_causal=False)                 picks one for the device

Causal masks align at the top-left (query i sees key j iff i >= j), see reference.py.
The Triton parts import lazily, so importing this package needs no Triton; see
triton_forward.py for how the interpreter (TRITON_INTERPRET=1) is chosen.
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
    "flash_backward": "triton_backward",
}

__all__ = ["FlashAttention2PyTorch", "attention_reference", "flash_attention", *_TRITON_NAMES]


def __getattr__(name):
    if name in _TRITON_NAMES:
        return getattr(importlib.import_module(f".{_TRITON_NAMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v for (..., seq, d) tensors, differentiable.

    CUDA tensors (or any tensors when the Triton interpreter is on) go to the Triton kernels;
    anything else to the tiled PyTorch version. A 2-D (seq, d) input is treated as batch 1.
    """
    if q.dim() == 2:
        return flash_attention(q[None], k[None], v[None], is_causal)[0]
    if q.is_cuda:
        from .autograd import FlashAttention2Triton

        return FlashAttention2Triton.apply(q, k, v, is_causal)
    try:
        from .triton_forward import INTERPRETED
    except ImportError:  # no Triton installed
        INTERPRETED = False
    if INTERPRETED:
        from .autograd import FlashAttention2Triton

        return FlashAttention2Triton.apply(q, k, v, is_causal)
    return FlashAttention2PyTorch.apply(q, k, v, is_causal)
