"""The course's model: parameter counts, shapes, causality, RMSNorm precision, RoPE, init."""

from __future__ import annotations

import math

import pytest
import torch

from lmperf import attention
from lmperf.model import (
    SIZES,
    Linear,
    RMSNorm,
    RotaryEmbedding,
    TransformerLM,
    config_from_name,
    count_parameters,
    parameter_count,
)

# Counts worked out by hand from the architecture (all parameters, vocab 10,000; e.g. small:
# 12 · (4·768² + 3·768·3072 + 2·768) + 2·10,000·768 + 768), in millions to one decimal.
EXPECTED_MILLIONS = {"small": 128.6, "medium": 423.2, "large": 969.4, "xl": 1998.2, "2.7B": 3406.8}


@pytest.mark.parametrize("name", sorted(EXPECTED_MILLIONS))
def test_parameter_counts_match_the_design(name):
    config = config_from_name(name)
    with torch.device("meta"):  # no memory: shapes only
        model = TransformerLM(config)
    assert count_parameters(model) == parameter_count(config)
    assert round(count_parameters(model) / 1e6, 1) == EXPECTED_MILLIONS[name]


def test_unknown_size_is_rejected():
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        config_from_name("huge")


def test_logits_shape(fresh_seed):
    torch.manual_seed(fresh_seed)
    model = TransformerLM.from_name("tiny", context_length=32)
    tokens = torch.randint(0, 10_000, (3, 17))
    assert model(tokens).shape == (3, 17, 10_000)


@pytest.mark.parametrize("impl", ["plain", "sdpa", "flash"])
def test_future_tokens_do_not_change_earlier_logits(impl, fresh_seed):
    torch.manual_seed(fresh_seed)
    model = TransformerLM.from_name("tiny", context_length=32, attention=impl)
    # float64 where the implementation takes it; flash takes fp32/bf16/fp16 only (its Triton kernels
    # run here when an earlier test switched Triton's interpreter on)
    model = model if impl == "flash" else model.double()
    tokens = torch.randint(0, 10_000, (2, 20))
    changed = tokens.clone()
    changed[:, 12:] = torch.randint(0, 10_000, (2, 8))
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def _reference_attention(q, k, v, causal):
    """Float64 attention written independently of lmperf.attention."""
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.einsum("...id,...jd->...ij", q, k) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = scores.shape[-2:]
        allowed = torch.tril(torch.ones(n_q, n_k, dtype=torch.bool))
        scores = scores.masked_fill(~allowed, -math.inf)
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("impl", ["plain", "sdpa", "flash"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_float64_reference(impl, causal, fresh_seed):
    gen = torch.Generator().manual_seed(fresh_seed)
    q, k, v = (torch.randn(2, 3, 19, 16, generator=gen) for _ in range(3))
    out = attention.get(impl)(q, k, v, is_causal=causal)
    torch.testing.assert_close(out.double(), _reference_attention(q, k, v, causal), rtol=1e-5, atol=1e-5)


def test_unknown_attention_is_rejected():
    with pytest.raises(ValueError, match="unknown attention implementation"):
        attention.get("magic")


def test_rmsnorm_computes_in_fp32_and_returns_input_dtype():
    norm = RMSNorm(8)
    # 300^2 = 90000 overflows fp16 (max 65504): an fp16 computation would give inf/0.
    x = torch.full((2, 8), 300.0, dtype=torch.float16)
    x[0, 0] = 100.0
    out = norm(x)
    assert out.dtype == torch.float16
    assert torch.isfinite(out).all()
    x64 = x.double()
    expected = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(out.double(), expected, rtol=2e-3, atol=2e-3)


def test_rope_preserves_norm_and_depends_on_relative_position(fresh_seed):
    gen = torch.Generator().manual_seed(fresh_seed)
    rope = RotaryEmbedding(d_head=16, max_seq_len=64, theta=10_000.0)
    q, k = torch.randn(16, generator=gen, dtype=torch.float32), torch.randn(16, generator=gen)

    def at(x, pos):
        return rope(x[None, :], torch.tensor([pos]))[0]

    torch.testing.assert_close(at(q, 7).norm(), q.norm())
    # <R_m q, R_n k> depends on m - n only
    torch.testing.assert_close(at(q, 10) @ at(k, 4), at(q, 26) @ at(k, 20), rtol=1e-4, atol=1e-4)
    # adjacent pairs are rotated: position 1 rotates (x0, x1) by angle 1 (inv_freq 1 for pair 0)
    x = torch.zeros(16)
    x[0] = 1.0
    rotated = at(x, 1)
    torch.testing.assert_close(rotated[:2], torch.tensor([math.cos(1.0), math.sin(1.0)]))


def test_linear_init_is_truncated_normal_with_the_course_std():
    torch.manual_seed(0)
    layer = Linear(512, 256)
    std = math.sqrt(2 / (512 + 256))
    w = layer.weight.detach()
    assert w.abs().max() <= 3 * std + 1e-7
    # a normal truncated at ±3σ keeps std ≈ 0.9866σ
    assert abs(w.std().item() / std - 0.9866) < 0.02


def test_registry_sizes_divide_into_heads():
    for name in SIZES:
        c = config_from_name(name)
        assert c.d_model % c.num_heads == 0 and c.d_head % 2 == 0, name
