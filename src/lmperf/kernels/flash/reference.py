"""FlashAttention-2 in plain PyTorch: ``attention_reference`` (the whole score matrix; on float64 inputs
the tests' reference) and ``FlashAttention2PyTorch`` (the course's tiled algorithm, flash_forward (a),
with the tiled backward that recomputes P from L). Causal: query i sees key j iff i >= j (top-left).
"""

from __future__ import annotations

import math

import torch

from .inputs import check_qkv, folded_backward, save_folded

PYTORCH_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def causal_mask(n_queries: int, n_keys: int, device=None) -> torch.Tensor:
    """(n_queries, n_keys) bool, True where query i may attend key j (top-left: i >= j)."""
    q_idx = torch.arange(n_queries, device=device)[:, None]
    k_idx = torch.arange(n_keys, device=device)[None, :]
    return q_idx >= k_idx


def attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive attention in q's dtype: returns O (..., n_q, d) and L (..., n_q) = logsumexp(S)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-1, -2) * scale  # (..., n_q, n_k)
    if is_causal:
        s = s.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.exp(s - lse[..., None]) @ v
    return o, lse


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class FlashAttention2PyTorch(torch.autograd.Function):
    """apply(Q, K, V, is_causal=False) -> O, tiled in PyTorch (float32 state; float64 for float64
    inputs). Subclass and change the tile sizes to exercise other tilings."""

    q_tile_size = 32
    k_tile_size = 32

    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        check_qkv(Q, K, V, dtypes=PYTORCH_DTYPES)
        # the concrete subclass (ctx is its backward node), so overridden tile sizes apply
        cls = getattr(ctx, "_forward_cls", FlashAttention2PyTorch)
        ctx.tiles = (cls.q_tile_size, cls.k_tile_size)
        return save_folded(ctx, lambda q, k, v, causal: _forward_tiled(q, k, v, causal, *ctx.tiles), Q, K, V, is_causal)

    @staticmethod
    def backward(ctx, dO):
        return folded_backward(ctx, dO, lambda *tensors_and_causal: _backward_tiled(*tensors_and_causal, *ctx.tiles))


def _forward_tiled(q, k, v, is_causal, q_tile, k_tile):
    """(B, n_q, d) inputs -> O (B, n_q, d) in q's dtype, L (B, n_q) in the accumulation dtype."""
    batch, n_q, d = q.shape
    n_k = k.shape[1]
    acc_dtype = _accumulation_dtype(q.dtype)
    scale = 1.0 / math.sqrt(d)
    o = torch.empty_like(q)
    lse = torch.empty(batch, n_q, dtype=acc_dtype, device=q.device)
    for qs in range(0, n_q, q_tile):
        qe = min(qs + q_tile, n_q)
        q_i = q[:, qs:qe].to(acc_dtype)
        m_i = torch.full((batch, qe - qs), float("-inf"), dtype=acc_dtype, device=q.device)
        l_i = torch.zeros(batch, qe - qs, dtype=acc_dtype, device=q.device)
        acc = torch.zeros(batch, qe - qs, d, dtype=acc_dtype, device=q.device)
        for ks in range(0, min(n_k, qe) if is_causal else n_k, k_tile):  # causal: keys j <= i < qe
            ke = min(ks + k_tile, n_k)
            s = q_i @ k[:, ks:ke].to(acc_dtype).transpose(1, 2) * scale  # (B, tq, tk)
            if is_causal and ke - 1 > qs:  # tile touches the diagonal
                keep = torch.arange(qs, qe, device=q.device)[:, None] >= torch.arange(ks, ke, device=q.device)[None, :]
                s = s.masked_fill(~keep, float("-inf"))
            m_new = torch.maximum(m_i, s.amax(dim=-1))
            p = torch.exp(s - m_new[..., None])
            alpha = torch.exp(m_i - m_new)
            l_i = alpha * l_i + p.sum(dim=-1)
            # P is cast to V's dtype before the second matmul, as in the Triton kernel
            acc = alpha[..., None] * acc + (p.to(v.dtype) @ v[:, ks:ke]).to(acc_dtype)
            m_i = m_new
        o[:, qs:qe] = (acc / l_i[..., None]).to(q.dtype)
        lse[:, qs:qe] = m_i + torch.log(l_i)
    return o, lse


def _backward_tiled(q, k, v, o, do, lse, is_causal, q_tile, k_tile):
    """Tiled backward: outer loop over key tiles (dK, dV), inner over query tiles (dQ)."""
    batch, n_q, d = q.shape
    n_k = k.shape[1]
    acc_dtype = _accumulation_dtype(q.dtype)
    scale = 1.0 / math.sqrt(d)
    delta = (o.to(acc_dtype) * do.to(acc_dtype)).sum(dim=-1)  # D = rowsum(O * dO), (B, n_q)
    lse = lse.to(acc_dtype)
    dq = torch.zeros(batch, n_q, d, dtype=acc_dtype, device=q.device)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    for ks in range(0, n_k, k_tile):
        ke = min(ks + k_tile, n_k)
        k_j, v_j = k[:, ks:ke].to(acc_dtype), v[:, ks:ke].to(acc_dtype)
        dk_j = torch.zeros(batch, ke - ks, d, dtype=acc_dtype, device=q.device)
        dv_j = torch.zeros_like(dk_j)
        first_q = ks if is_causal else 0  # causal: queries i >= ks only
        for qs in range(first_q - first_q % q_tile, n_q, q_tile):
            qe = min(qs + q_tile, n_q)
            q_i, do_i = q[:, qs:qe].to(acc_dtype), do[:, qs:qe].to(acc_dtype)
            s = q_i @ k_j.transpose(1, 2) * scale  # (B, tq, tk)
            p = torch.exp(s - lse[:, qs:qe, None])
            if is_causal and ke - 1 > qs:
                keep = torch.arange(qs, qe, device=q.device)[:, None] >= torch.arange(ks, ke, device=q.device)[None, :]
                p = p.masked_fill(~keep, 0.0)
            dv_j += p.transpose(1, 2) @ do_i
            dp = do_i @ v_j.transpose(1, 2)
            ds = p * (dp - delta[:, qs:qe, None])
            dq[:, qs:qe] += ds @ k_j * scale
            dk_j += ds.transpose(1, 2) @ q_i * scale
        dk[:, ks:ke] = dk_j.to(k.dtype)
        dv[:, ks:ke] = dv_j.to(v.dtype)
    return dq.to(q.dtype), dk, dv


def reference_with_grads(q, k, v, do, is_causal: bool = False):
    """(O, L, dQ, dK, dV) of attention_reference in float64, from the same (rounded) inputs."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, lse = attention_reference(q64, k64, v64, is_causal)
    o.backward(do.double())
    return o.detach(), lse.detach(), q64.grad, k64.grad, v64.grad


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref||_F / ||ref||_F, computed in float64."""
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-300)).item()
