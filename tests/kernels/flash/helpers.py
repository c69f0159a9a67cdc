"""Shared by the flash kernel tests: random draws, the five outputs of an autograd.Function, and how
far plain attention in the inputs' own precision is from float64.

Random lengths sometimes draw an ill-conditioned case (a causal row with two keys, whose gradient is
a difference of nearly equal numbers): there any low-precision computation, PyTorch's own included,
misses float64 by more than the fixed tolerance. A kernel then passes if it is within
LOW_PRECISION_FACTOR of that error, as FlashAttention's own tests judge theirs against PyTorch.
"""

from __future__ import annotations

import math

import torch

from lmperf.kernels.flash.reference import causal_mask, relative_error

# ours may be this many times further from float64 than naive attention in the same precision
LOW_PRECISION_FACTOR = 3.0
NAMES = ("O", "L", "dQ", "dK", "dV")


def draw(rng: torch.Generator, lo: int, hi: int) -> int:
    """An integer in [lo, hi] from ``rng`` (so the test's seed reproduces every choice)."""
    return int(torch.randint(lo, hi + 1, (1,), generator=rng))


def run_function(fn, q, k, v, do, is_causal):
    """O, L (the first saved tensor), dQ, dK, dV of an autograd.Function."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    o = fn.apply(q, k, v, is_causal)
    lse = o.grad_fn.saved_tensors[0]
    o.backward(do)
    return o.detach(), lse, q.grad, k.grad, v.grad


def naive_attention(q, k, v, is_causal):
    """Attention as a PyTorch user writes it, in the inputs' dtype: softmax(QK^T / sqrt(d)) V, and
    L = logsumexp of the scores (FlashAttention's tests judge their kernels against the same)."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        s = s.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def low_precision_errors(q, k, v, do, is_causal, want) -> tuple[float, ...]:
    """Relative errors (O, L, dQ, dK, dV) against ``want`` (the float64 reference) of
    naive_attention computed in the inputs' dtype."""
    qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o, lse = naive_attention(qq, kk, vv, is_causal)
    o.backward(do)
    got = (o.detach(), lse.detach(), qq.grad, kk.grad, vv.grad)
    return tuple(relative_error(g, w) for g, w in zip(got, want))


def assert_close(got, want, tol_o, tol_grad, seed, inputs=None):
    """Each of (O, L, dQ, dK, dV) within its tolerance of float64; with ``inputs`` (q, k, v, dO,
    is_causal), the tolerance rises to LOW_PRECISION_FACTOR x naive attention's own error."""
    floor = low_precision_errors(*inputs, want) if inputs is not None else (0.0,) * len(NAMES)
    for name, g, w, tol, low in zip(NAMES, got, want, (tol_o, tol_o, tol_grad, tol_grad, tol_grad), floor):
        assert g.shape == w.shape, f"{name}: shape {tuple(g.shape)} != {tuple(w.shape)}"
        err = relative_error(g, w)
        allowed = max(tol, LOW_PRECISION_FACTOR * low)
        assert err < allowed, (
            f"{name}: relative error {err:.2e} >= {allowed:.1e} (tolerance {tol:.0e}; naive attention in "
            f"this precision: {low:.2e}) (seed {seed})"
        )
