"""The tiled PyTorch FlashAttention-2 (and the float64 reference itself), on CPU.

Every test draws fresh random shapes and values (head dims, lengths, batch); the seed is in each
failure message. Errors are relative Frobenius norms against a float64 computation on the same
(rounded) inputs.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmperf.kernels.flash import FlashAttention2PyTorch, attention_reference
from lmperf.kernels.flash.reference import reference_with_grads
from lmperf.kernels.flash.reference import relative_error as rel_err

from .helpers import assert_close, draw, run_function

# (O and L, gradients): relative Frobenius error allowed per input dtype
TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (2e-2, 3e-2), torch.float16: (5e-3, 5e-3)}
HEAD_DIMS = (16, 32, 48, 64, 80, 128)


def random_inputs(rng, dtype, d, batch=None, n_q=None, n_k=None, lo=2, hi=130):
    """q (B, n_q, d), k, v (B, n_k, d), dO; lengths ragged and independent unless given (at least 2:
    with one key dQ and dK are exactly zero and relative errors undefined)."""
    batch, n_q, n_k = batch or draw(rng, 1, 3), n_q or draw(rng, lo, hi), n_k or draw(rng, lo, hi)
    return [torch.randn(batch, n, d, generator=rng).to(dtype) for n in (n_q, n_k, n_k, n_q)]


@pytest.mark.parametrize("is_causal", [False, True])
def test_the_reference_matches_sdpa_and_a_logsumexp_by_hand(rng, is_causal):
    q, k, v, _ = random_inputs(rng, torch.float64, 32)
    o, lse = attention_reference(q, k, v, is_causal)
    # an independent mask: top-left causal is the lower triangle of the (n_q, n_k) ones
    mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).tril() if is_causal else None
    assert rel_err(o, F.scaled_dot_product_attention(q, k, v, attn_mask=mask)) < 1e-12, f"seed {rng.initial_seed()}"
    s = q @ k.transpose(1, 2) / 32**0.5
    if is_causal:
        s = s.masked_fill(~mask, float("-inf"))
    assert rel_err(lse, torch.log(torch.exp(s - s.amax(-1, keepdim=True)).sum(-1)) + s.amax(-1)) < 1e-12


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_matches_the_float64_reference(rng, dtype, is_causal):
    q, k, v, do = random_inputs(rng, dtype, HEAD_DIMS[draw(rng, 0, len(HEAD_DIMS) - 1)])
    got = run_function(FlashAttention2PyTorch, q, k, v, do, is_causal)
    assert got[1].dtype == torch.float32
    want = reference_with_grads(q, k, v, do, is_causal)
    assert_close(got, want, *TOLERANCE[dtype], rng.initial_seed(), inputs=(q, k, v, do, is_causal))


class Tiles16x48(FlashAttention2PyTorch):
    q_tile_size, k_tile_size = 16, 48


class Tiles64x16(FlashAttention2PyTorch):
    q_tile_size, k_tile_size = 64, 16


@pytest.mark.parametrize("fn", [Tiles16x48, Tiles64x16])
def test_other_tilings_are_exact_in_float64(rng, fn):
    for is_causal in (False, True):
        q, k, v, do = random_inputs(rng, torch.float64, 16)
        assert_close(
            run_function(fn, q, k, v, do, is_causal),
            reference_with_grads(q, k, v, do, is_causal),
            1e-12,
            1e-12,
            rng.initial_seed(),
        )


def test_gradcheck_in_float64_across_tiles(rng):
    is_causal = bool(draw(rng, 0, 1))
    q, k, v, _ = random_inputs(rng, torch.float64, 8, batch=1, lo=17, hi=30)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(
        lambda a, b, c: Tiles16x48.apply(a, b, c, is_causal), (q, k, v), eps=1e-6, atol=1e-6
    )


def test_the_saved_tensors_are_the_courses_and_leading_dims_fold(rng):
    q, k, v, do = random_inputs(rng, torch.bfloat16, 32, batch=6)
    o = FlashAttention2PyTorch.apply(q.clone().requires_grad_(), k, v, True)
    saved = o.grad_fn.saved_tensors
    assert len(saved) == 5 and saved[0].shape == q.shape[:2] and saved[0].dtype == torch.float32
    assert [t.shape for t in saved if t.shape == q.shape[:2]] == [q.shape[:2]]  # L: the only (batch, n_q) tensor
    for t, want in zip(saved[1:], (q, k, v, o)):
        assert torch.equal(t, want)
    shape4 = lambda t: t.float().reshape(2, 3, *t.shape[1:])  # noqa: E731  (batch, heads, n, d)
    got = run_function(FlashAttention2PyTorch, *map(shape4, (q, k, v, do)), True)
    want = run_function(FlashAttention2PyTorch, *(t.float() for t in (q, k, v, do)), True)
    assert got[1].shape == (2, 3, q.shape[1])
    for g, w in zip(got, want):
        assert torch.allclose(g.reshape(w.shape), w, rtol=0, atol=1e-6)


def test_causal_is_top_left_aligned(rng):
    # more queries than keys: queries past the last key see every key, as without the mask
    q, k, v, _ = random_inputs(rng, torch.float64, 16, n_q=70, n_k=30)
    causal, full = (FlashAttention2PyTorch.apply(q, k, v, c) for c in (True, False))
    assert torch.allclose(causal[:, 29:], full[:, 29:], atol=1e-12) and not torch.allclose(causal[:, :29], full[:, :29])
    assert torch.allclose(causal[:, 0], v[:, 0], atol=1e-12)  # query 0 sees only key 0
    # more keys than queries: keys past the last query are never seen
    q, k, v, do = random_inputs(rng, torch.float64, 16, n_q=30, n_k=70)
    _, _, _, dk, dv = run_function(FlashAttention2PyTorch, q, k, v, do, True)
    assert dk[:, 30:].abs().max() == 0 and dv[:, 30:].abs().max() == 0 and dv[:, :30].abs().min() > 0


def test_bad_inputs_raise_value_errors_naming_the_problem():
    q, k, v = torch.randn(2, 8, 16), torch.randn(2, 12, 16), torch.randn(2, 12, 16)
    cases = {
        "shape": (q[0], k, v),
        "dtype": (q, k.half(), v),
        "same shape": (q, k, v[:, :5]),
        "leading": (torch.randn(3, 8, 16), k, v),
        "head dim": (torch.randn(2, 8, 32), k, v),
        "at least one": (q, k[:, :0], v[:, :0]),
        "device": (q, k.to("meta"), v),
        "unsupported dtype": (q.long(), k.long(), v.long()),
    }
    for message, args in cases.items():
        with pytest.raises(ValueError, match=message):
            FlashAttention2PyTorch.apply(*args, False)
