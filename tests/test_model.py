"""The course's model (lmperf.model) and the attention registry (lmperf.attention): parameter counts,
shapes, causality, every implementation against float64, RMSNorm's precision, RoPE, init."""

from __future__ import annotations

import math

import pytest
import torch

from lmperf import attention
from lmperf.core.sizes import SIZES, config_from_name, parameter_count
from lmperf.model import Linear, RMSNorm, RotaryEmbedding, TransformerLM, count_parameters

# Counts worked out by hand from the architecture (all parameters, vocab 10,000; e.g. small:
# 12 · (4·768² + 3·768·3072 + 2·768) + 2·10,000·768 + 768), in millions to one decimal.
EXPECTED_MILLIONS = {"small": 128.6, "medium": 423.2, "large": 969.4, "xl": 1998.2, "2.7B": 3406.8}


def test_parameter_counts_match_the_design_and_the_closed_form():
    for name, millions in EXPECTED_MILLIONS.items():
        config = config_from_name(name)
        with torch.device("meta"):  # shapes only, no memory
            model = TransformerLM(config)
        assert count_parameters(model) == parameter_count(config), name
        assert round(count_parameters(model) / 1e6, 1) == millions, name
    for name in SIZES:
        c = config_from_name(name)
        assert c.d_model % c.num_heads == 0 and c.d_head % 2 == 0, name  # heads split d; RoPE pairs
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        config_from_name("huge")


@pytest.mark.parametrize("impl", ["plain", "sdpa", "flash"])
def test_logits_have_their_shape_and_future_tokens_do_not_change_earlier_ones(impl, fresh_seed):
    torch.manual_seed(fresh_seed)
    model = TransformerLM.from_name("tiny", context_length=32, attention=impl)
    # float64 where the implementation takes it; flash takes fp32/bf16/fp16 only
    model = model if impl == "flash" else model.double()
    tokens = torch.randint(0, 10_000, (2, 20))
    changed = tokens.clone()
    changed[:, 12:] = torch.randint(0, 10_000, (2, 8))
    a, b = model(tokens), model(changed)
    assert a.shape == (2, 20, 10_000)
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def reference_attention(q, k, v, causal):
    """Float64 attention written independently of lmperf.attention."""
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.einsum("...id,...jd->...ij", q, k) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    return torch.softmax(scores, dim=-1) @ v


@pytest.mark.parametrize("impl", sorted(attention.IMPLEMENTATIONS))
def test_every_attention_matches_float64_or_is_unavailable_here(impl, fresh_seed):
    gen = torch.Generator().manual_seed(fresh_seed)
    q, k, v = (torch.randn(2, 3, 19, 16, generator=gen) for _ in range(3))
    for causal in (False, True):
        try:
            out = attention.get(impl)(q, k, v, is_causal=causal)
        except attention.Unavailable as exc:  # a pinned SDPA backend on a CPU: an answer, naming itself
            assert not q.is_cuda and str(exc).startswith(f"{impl}: ")
            return
        torch.testing.assert_close(out.double(), reference_attention(q, k, v, causal), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unknown attention implementation"):
        attention.get("magic")


def test_rmsnorm_computes_in_fp32_and_returns_the_input_dtype():
    # 300² = 90,000 overflows fp16 (max 65,504): computed in fp16 it would give inf or 0
    x = torch.full((2, 8), 300.0, dtype=torch.float16)
    x[0, 0] = 100.0
    out = RMSNorm(8)(x)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    x64 = x.double()
    torch.testing.assert_close(
        out.double(), x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5), rtol=2e-3, atol=2e-3
    )


def test_rope_keeps_norms_depends_on_relative_position_and_rotates_adjacent_pairs(fresh_seed):
    gen = torch.Generator().manual_seed(fresh_seed)
    rope = RotaryEmbedding(d_head=16, max_seq_len=64, theta=10_000.0)
    q, k = torch.randn(16, generator=gen), torch.randn(16, generator=gen)

    def at(x, pos):
        return rope(x[None, :], torch.tensor([pos]))[0]

    torch.testing.assert_close(at(q, 7).norm(), q.norm())
    torch.testing.assert_close(at(q, 10) @ at(k, 4), at(q, 26) @ at(k, 20), rtol=1e-4, atol=1e-4)  # m - n only
    x = torch.zeros(16)
    x[0] = 1.0  # position 1 rotates (x0, x1) by angle 1 (pair 0's frequency is 1)
    torch.testing.assert_close(at(x, 1)[:2], torch.tensor([math.cos(1.0), math.sin(1.0)]))


def test_linear_init_is_a_truncated_normal_with_the_courses_std():
    torch.manual_seed(0)
    w = Linear(512, 256).weight.detach()
    std = math.sqrt(2 / (512 + 256))
    assert w.abs().max() <= 3 * std + 1e-7
    assert abs(w.std().item() / std - 0.9866) < 0.02  # a normal truncated at ±3σ keeps std ≈ 0.9866σ
