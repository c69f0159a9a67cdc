"""FlashAttention-2 in plain PyTorch: a naive reference and the tiled autograd.Function.

`attention_reference` materialises the whole score matrix; run it on float64 inputs to get
the numbers the tests compare every implementation against (O and L = logsumexp of the
scaled scores per query row).

`FlashAttention2PyTorch` is the course's tiled algorithm (flash_forward (a)): query tiles of
`q_tile_size` rows, an inner loop over key tiles of `k_tile_size` rows keeping the running
max m, running sum l and unnormalised output in float32 (float64 for float64 inputs), and the
tiled backward (flash_backward) that recomputes P from L. It is meant for checking and
teaching, not speed: the tile loops run in Python.

Causal convention (all implementations in this package): query i sees key j iff i >= j,
aligned at the top-left corner like the course's `q_idx >= k_idx` mask and
`F.scaled_dot_product_attention(is_causal=True)`. With n_queries > n_keys the last queries
see every key; with n_queries < n_keys the keys past n_queries are never seen (their dK, dV
are zero). Every query sees key 0, so no row is empty.
"""

from __future__ import annotations

import math

import torch

from .inputs import check_qkv, fold_batch

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
    """Tiled FlashAttention-2, forward and backward, in PyTorch.

    apply(Q, K, V, is_causal=False) on (batch, seq, d) tensors (more leading dims allowed);
    returns O and saves (L, Q, K, V, O) with L the float32 log-sum-exp of shape
    (batch, n_queries) (float64 for float64 inputs). Subclass and change the tile sizes to
    exercise other tilings.
    """

    q_tile_size = 32
    k_tile_size = 32

    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        check_qkv(Q, K, V, dtypes=PYTORCH_DTYPES)
        # the concrete subclass (ctx is its backward node), so overridden tile sizes apply
        cls = getattr(ctx, "_forward_cls", FlashAttention2PyTorch)
        q3, k3, v3 = fold_batch(Q), fold_batch(K), fold_batch(V)
        o3, lse3 = _forward_tiled(q3, k3, v3, bool(is_causal), cls.q_tile_size, cls.k_tile_size)
        O = o3.reshape(Q.shape)
        L = lse3.reshape(Q.shape[:-1])
        ctx.save_for_backward(L, Q, K, V, O)
        ctx.is_causal = bool(is_causal)
        ctx.tiles = (cls.q_tile_size, cls.k_tile_size)
        return O

    @staticmethod
    def backward(ctx, dO):
        L, Q, K, V, O = ctx.saved_tensors
        dq, dk, dv = _backward_tiled(
            fold_batch(Q),
            fold_batch(K),
            fold_batch(V),
            fold_batch(O),
            fold_batch(dO),
            L.reshape(-1, L.shape[-1]),
            ctx.is_causal,
            *ctx.tiles,
        )
        return dq.reshape(Q.shape), dk.reshape(K.shape), dv.reshape(V.shape), None


def _key_tile_range(q_start: int, q_end: int, n_keys: int, k_tile: int, is_causal: bool):
    """Start offsets of the key tiles a query tile [q_start, q_end) needs."""
    k_end = min(n_keys, q_end) if is_causal else n_keys  # causal: keys j <= i < q_end
    return range(0, k_end, k_tile)


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
        for ks in _key_tile_range(qs, qe, n_k, k_tile, is_causal):
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
