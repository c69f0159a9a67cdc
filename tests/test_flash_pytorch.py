"""The tiled PyTorch FlashAttention-2 (and the float64 reference itself), on CPU.

Every test draws fresh random shapes and values; the seed is in each failure message.
Errors are relative Frobenius norms against a float64 computation on the same (rounded) inputs.
"""

import os

import pytest
import torch
import torch.nn.functional as F
from flash_helpers import assert_close

from lmperf.kernels.flash import FlashAttention2PyTorch, attention_reference
from lmperf.kernels.flash.reference import reference_with_grads
from lmperf.kernels.flash.reference import relative_error as rel_err

# (O and L, gradients): relative Frobenius error allowed per input dtype
TOLERANCE = {
    torch.float32: (1e-5, 1e-4),
    torch.bfloat16: (2e-2, 3e-2),
    torch.float16: (5e-3, 5e-3),
}


@pytest.fixture
def rng():
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    return gen


def random_inputs(gen, dtype, d, batch=None, n_q=None, n_k=None, lo=2, hi=130):
    """q (B, n_q, d), k, v (B, n_k, d), dO; lengths ragged and independent unless given
    (at least 2: with one key dQ and dK are exactly zero and relative errors undefined)."""

    def draw(a, b):
        return int(torch.randint(a, b + 1, (1,), generator=gen))

    batch = batch or draw(1, 3)
    n_q = n_q or draw(lo, hi)
    n_k = n_k or draw(lo, hi)
    q, k, v, do = (torch.randn(batch, n, d, generator=gen).to(dtype) for n in (n_q, n_k, n_k, n_q))
    return q, k, v, do


def run_function(fn, q, k, v, do, is_causal):
    """O, L (from the saved tensors), dQ, dK, dV from an autograd.Function."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    o = fn.apply(q, k, v, is_causal)
    lse = o.grad_fn.saved_tensors[0]
    o.backward(do)
    return o.detach(), lse, q.grad, k.grad, v.grad


@pytest.mark.parametrize("is_causal", [False, True])
def test_reference_matches_sdpa(rng, is_causal):
    q, k, v, _ = random_inputs(rng, torch.float64, 32)
    o, lse = attention_reference(q, k, v, is_causal)
    # an independent mask: top-left causal is the lower triangle of the (n_q, n_k) ones
    mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).tril() if is_causal else None
    o_sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert rel_err(o, o_sdpa) < 1e-12, f"seed {rng.initial_seed()}"
    s = q @ k.transpose(1, 2) / 32**0.5
    if is_causal:
        s = s.masked_fill(~mask, float("-inf"))
    want_lse = torch.log(torch.exp(s - s.amax(-1, keepdim=True)).sum(-1)) + s.amax(-1)
    assert rel_err(lse, want_lse) < 1e-12


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("d", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_matches_float64_reference(rng, dtype, d, is_causal):
    q, k, v, do = random_inputs(rng, dtype, d)
    got = run_function(FlashAttention2PyTorch, q, k, v, do, is_causal)
    want = reference_with_grads(q, k, v, do, is_causal)
    assert got[1].dtype == torch.float32
    assert_close(got, want, *TOLERANCE[dtype], rng.initial_seed(), inputs=(q, k, v, do, is_causal))


class _Tiles16x48(FlashAttention2PyTorch):
    q_tile_size = 16
    k_tile_size = 48


class _Tiles64x16(FlashAttention2PyTorch):
    q_tile_size = 64
    k_tile_size = 16


@pytest.mark.parametrize("fn", [_Tiles16x48, _Tiles64x16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_other_tilings_exact_in_float64(rng, fn, is_causal):
    q, k, v, do = random_inputs(rng, torch.float64, 16)
    got = run_function(fn, q, k, v, do, is_causal)
    want = reference_with_grads(q, k, v, do, is_causal)
    assert_close(got, want, 1e-12, 1e-12, rng.initial_seed())


@pytest.mark.parametrize("is_causal", [False, True])
def test_gradcheck_float64(rng, is_causal):
    q, k, v, _ = random_inputs(rng, torch.float64, 16, batch=1, lo=17, hi=40)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(
        lambda a, b, c: FlashAttention2PyTorch.apply(a, b, c, is_causal), (q, k, v), eps=1e-6, atol=1e-6
    )


def test_saved_tensors_contract(rng):
    q, k, v, _ = random_inputs(rng, torch.bfloat16, 32)
    q.requires_grad_()
    o = FlashAttention2PyTorch.apply(q, k, v, True)
    saved = o.grad_fn.saved_tensors
    assert len(saved) == 5
    batch, n_q = q.shape[:2]
    l_like = [t for t in saved if t.shape == (batch, n_q)]
    assert len(l_like) == 1 and l_like[0] is saved[0] and l_like[0].dtype == torch.float32
    for t, want in zip(saved[1:], (q, k, v, o)):
        assert t.shape == want.shape and torch.equal(t, want)


def test_leading_dims_are_folded(rng):
    q, k, v, do = random_inputs(rng, torch.float32, 16, batch=6)
    shape4 = lambda t: t.reshape(2, 3, *t.shape[1:])  # noqa: E731  (batch, heads, n, d)
    got = run_function(FlashAttention2PyTorch, *map(shape4, (q, k, v, do)), True)
    want = run_function(FlashAttention2PyTorch, q, k, v, do, True)
    assert got[1].shape == (2, 3, q.shape[1])
    for g, w in zip(got, want):
        assert torch.allclose(g.reshape(w.shape), w, rtol=0, atol=1e-6)


def test_causal_is_top_left_aligned(rng):
    # more queries than keys: queries past the last key see every key, as without the mask
    q, k, v, _ = random_inputs(rng, torch.float64, 16, n_q=70, n_k=30)
    causal = FlashAttention2PyTorch.apply(q, k, v, True)
    full = FlashAttention2PyTorch.apply(q, k, v, False)
    assert torch.allclose(causal[:, 29:], full[:, 29:], atol=1e-12)
    assert not torch.allclose(causal[:, :29], full[:, :29])
    assert torch.allclose(causal[:, 0], v[:, 0], atol=1e-12)  # query 0 sees only key 0
    # more keys than queries: keys past the last query are never seen
    q, k, v, do = random_inputs(rng, torch.float64, 16, n_q=30, n_k=70)
    _, _, _, dk, dv = run_function(FlashAttention2PyTorch, q, k, v, do, True)
    assert dk[:, 30:].abs().max() == 0 and dv[:, 30:].abs().max() == 0
    assert dv[:, :30].abs().min() > 0


@pytest.mark.parametrize(
    "case, message",
    [
        ("2d", "shape"),
        ("dtype", "dtype"),
        ("kv_shape", "same shape"),
        ("batch", "leading"),
        ("head_dim", "head dim"),
        ("empty", "at least one"),
        ("device", "device"),
        ("int", "dtype"),
    ],
)
def test_bad_inputs_raise_value_error(case, message):
    q, k, v = torch.randn(2, 8, 16), torch.randn(2, 12, 16), torch.randn(2, 12, 16)
    if case == "2d":
        q = q[0]
    elif case == "dtype":
        k = k.half()
    elif case == "kv_shape":
        v = v[:, :5]
    elif case == "batch":
        q = torch.randn(3, 8, 16)
    elif case == "head_dim":
        q = torch.randn(2, 8, 32)
    elif case == "empty":
        k, v = k[:, :0], v[:, :0]
    elif case == "device":
        k = k.to("meta")
    elif case == "int":
        q, k, v = (t.long() for t in (q, k, v))
    with pytest.raises(ValueError, match=message):
        FlashAttention2PyTorch.apply(q, k, v, False)
