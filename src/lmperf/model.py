"""The course's decoder-only Transformer LM (CS336 assignment 1; sizes: ``lmperf.core.sizes``): pre-norm
blocks ``x = x + attn(rmsnorm(x)); x = x + ffn(rmsnorm(x))``, final RMSNorm, untied output projection;
no biases or dropout, RoPE on q and k, SwiGLU. The attention is chosen once, by name (``lmperf.attention``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lmperf import attention as attention_impls
from lmperf.core.sizes import SIZES, ModelConfig, config_from_name, parameter_count  # noqa: F401 (re-exported)


def _trunc_normal_(weight: torch.Tensor, std: float) -> torch.Tensor:
    return nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-3 * std, b=3 * std)


class Linear(nn.Module):
    """y = x W^T with W of shape (d_out, d_in), no bias."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        _trunc_normal_(self.weight, std=math.sqrt(2.0 / (d_in + d_out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, d_model))
        _trunc_normal_(self.weight, std=1.0)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.weight[token_ids]


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 and cast back to the input dtype (the course's recipe)."""

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x32 = x.to(torch.float32)
        rms = torch.sqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x32 / rms * self.weight).to(in_dtype)


class RotaryEmbedding(nn.Module):
    """RoPE rotating adjacent pairs (x[2i], x[2i+1]) by angle pos * theta^(-2i/d)."""

    def __init__(self, d_head: int, max_seq_len: int, theta: float):
        super().__init__()
        inv_freq = theta ** (-torch.arange(0, d_head, 2, dtype=torch.float32) / d_head)
        angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)  # (T_max, d/2)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos = self.cos[positions].to(x.dtype)  # (T, d/2)
        sin = self.sin[positions].to(x.dtype)
        x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (..., T, d/2)
        rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
        return rotated.flatten(-2)  # (..., T, d)


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d = config.d_model
        self.num_heads = config.num_heads
        self.q_proj, self.k_proj = Linear(d, d), Linear(d, d)
        self.v_proj, self.output_proj = Linear(d, d), Linear(d, d)
        self.rope = RotaryEmbedding(config.d_head, config.context_length, config.rope_theta)
        self.attend = attention_impls.get(config.attention)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        H = self.num_heads

        def split_heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, T, H, D // H).transpose(1, 2)  # (B, H, T, d)

        q, k, v = split_heads(self.q_proj(x)), split_heads(self.k_proj(x)), split_heads(self.v_proj(x))
        positions = torch.arange(T, device=x.device)
        q, k = self.rope(q, positions), self.rope(k, positions)
        out = self.attend(q, k, v, is_causal=True)  # (B, H, T, d)
        return self.output_proj(out.transpose(1, 2).reshape(B, T, D))  # (B, T, D)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1, self.w2, self.w3 = Linear(d_model, d_ff), Linear(d_ff, d_model), Linear(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ln1, self.ln2 = RMSNorm(config.d_model), RMSNorm(config.d_model)
        self.attn = MultiHeadSelfAttention(config)
        self.ffn = SwiGLU(config.d_model, config.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.token_embeddings = Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.num_layers))
        self.ln_final = RMSNorm(config.d_model)
        self.lm_head = Linear(config.d_model, config.vocab_size)

    @classmethod
    def from_name(cls, name: str, **overrides) -> TransformerLM:
        return cls(config_from_name(name, **overrides))

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids (B, T) -> logits (B, T, vocab)."""
        x = self.token_embeddings(token_ids)  # (B, T, D)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
