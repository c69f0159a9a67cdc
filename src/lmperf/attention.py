"""Attention implementations chosen by name: ``plain`` (the course's, with the three NVTX ranges of
nsys_profile), ``sdpa``, ``sdpa_cudnn``, ``sdpa_flash``, ``flash``: (..., T, d) q, k, v and ``is_causal``
-> (..., T, d). One that cannot run here raises ``Unavailable`` (an ``unsupported`` record).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch

from lmperf import nvtx

AttentionFn = Callable[..., torch.Tensor]


class Unavailable(RuntimeError):
    """This implementation cannot run here (e.g. cuDNN attention on a CPU): an answer, not a bug."""


def causal_mask(n_queries: int, n_keys: int, device=None) -> torch.Tensor:
    """Boolean (n_queries, n_keys) mask, True where query i may attend to key j (j <= i)."""
    q_idx = torch.arange(n_queries, device=device)[:, None]
    k_idx = torch.arange(n_keys, device=device)[None, :]
    return q_idx >= k_idx


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax with max subtraction, as the course writes it."""
    x = x - x.amax(dim=dim, keepdim=True)
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """The course's unfused scaled dot-product attention."""
    d = q.shape[-1]
    with nvtx.range("computing attention scores"):
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (..., Tq, Tk)
        if is_causal:
            mask = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
            scores = scores.masked_fill(~mask, float("-inf"))
    with nvtx.range("computing softmax"):
        probs = softmax(scores, dim=-1)
    with nvtx.range("final matmul"):
        return probs @ v  # (..., Tq, d)


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """PyTorch's fused scaled_dot_product_attention (backend picked by PyTorch)."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def _pinned_sdpa(q, k, v, is_causal: bool, name: str, backend: str, what: str) -> torch.Tensor:
    """scaled_dot_product_attention restricted to one backend (CUDA, 4-D inputs); ``Unavailable`` where
    that backend does not take the inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not q.is_cuda:
        raise Unavailable(f"{name}: PyTorch's {what} needs CUDA tensors; these are on {q.device.type}")
    try:
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    except RuntimeError as exc:  # PyTorch's words when no allowed backend takes the inputs
        if "No available kernel" not in str(exc):
            raise
        version = f" (cuDNN {torch.backends.cudnn.version()})" if backend == "CUDNN_ATTENTION" else ""
        raise Unavailable(
            f"{name}: {what} does not take {q.dtype} {tuple(q.shape)} here{version}: {str(exc).splitlines()[0]}"
        ) from exc


def sdpa_cudnn_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """scaled_dot_product_attention restricted to its cuDNN backend (CUDA, cuDNN attention: fp16/bf16, 4-D)."""
    return _pinned_sdpa(q, k, v, is_causal, "sdpa_cudnn", "CUDNN_ATTENTION", "cuDNN attention")


def sdpa_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """scaled_dot_product_attention restricted to its FlashAttention-2 backend (CUDA, fp16/bf16, 4-D):
    the fused kernel the course's leaderboard compares ours with."""
    return _pinned_sdpa(q, k, v, is_causal, "sdpa_flash", "FLASH_ATTENTION", "flash attention")


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """Our FlashAttention-2 Triton kernels (imported lazily: Triton is optional on CPU)."""
    from lmperf.kernels.flash import flash_attention as _flash

    return _flash(q, k, v, is_causal=is_causal)


IMPLEMENTATIONS: dict[str, AttentionFn] = {
    "plain": plain_attention,
    "sdpa": sdpa_attention,
    "sdpa_cudnn": sdpa_cudnn_attention,
    "sdpa_flash": sdpa_flash_attention,
    "flash": flash_attention,
}


def get(name: str) -> AttentionFn:
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"unknown attention implementation {name!r}; known: {sorted(IMPLEMENTATIONS)}")
    return IMPLEMENTATIONS[name]


@contextlib.contextmanager
def as_unsupported():
    """An implementation that cannot run here (``Unavailable``) ends a cell as an ``unsupported``
    record, with the implementation's reason."""
    from lmperf.core.record import Unsupported

    try:
        yield
    except Unavailable as exc:
        raise Unsupported(str(exc)) from exc
