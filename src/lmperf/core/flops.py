"""FLOP counts (matmuls only: 2 FLOPs per MAC): Kaplan et al. 2020 (Table 1) for the Transformer's
forward; FlashAttention-2 (Dao 2023, §4) for attention: 4·B·H·N²·d forward, half when causal,
backward 2.5× forward."""

from __future__ import annotations

from lmperf.core.sizes import ModelConfig


def linear_flops(tokens: int, d_in: int, d_out: int) -> int:
    return 2 * tokens * d_in * d_out


def attention_forward_flops(
    batch: int, heads: int, n_queries: int, n_keys: int, d_head: int, causal: bool = False
) -> float:
    """QK^T and PV matmuls: 2 matmuls × 2·N_q·N_k·d each, per (batch, head); half when causal."""
    flops = 4 * batch * heads * n_queries * n_keys * d_head
    return flops / 2 if causal else flops


def attention_backward_flops(
    batch: int, heads: int, n_queries: int, n_keys: int, d_head: int, causal: bool = False
) -> float:
    """Five matmuls in backward versus two in forward: 2.5× the forward count."""
    return 2.5 * attention_forward_flops(batch, heads, n_queries, n_keys, d_head, causal)


def lm_forward_flops(config: ModelConfig, batch: int, context_length: int) -> float:
    """Forward matmul FLOPs of the LM on (batch, context_length) tokens; attention in full (not halved
    for the causal mask): the course's unfused attention computes every score."""
    tokens = batch * context_length
    d, f = config.d_model, config.d_ff
    per_layer = (
        4 * linear_flops(tokens, d, d)  # q, k, v, output projections
        + attention_forward_flops(batch, config.num_heads, context_length, context_length, config.d_head)
        + 3 * linear_flops(tokens, d, f)  # SwiGLU w1, w3, w2
    )
    return config.num_layers * per_layer + linear_flops(tokens, d, config.vocab_size)


def lm_training_step_flops(config: ModelConfig, batch: int, context_length: int) -> float:
    """Forward plus backward (twice the forward's matmul FLOPs)."""
    return 3 * lm_forward_flops(config, batch, context_length)


def tflops_per_s(flop_count: float, ms: float) -> float:
    """Achieved TFLOP/s of ``flop_count`` FLOPs done in ``ms`` milliseconds."""
    return flop_count / (ms / 1e3) / 1e12
