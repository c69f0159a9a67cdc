"""Timing attention on CUDA for flash_benchmarking and the leaderboard, by the names of the one registry
(``lmperf.attention.IMPLEMENTATIONS``; ``plain`` is the baseline, ``flash`` ours). Inputs are
(1, batch, N, d), made before timing: SDPA's fused kernels want 4-D, the others fold it. Each timed
call is a zero-argument closure for ``triton.testing.do_bench`` (CUDA events, median).
"""

from __future__ import annotations

import torch

from lmperf import attention
from lmperf.core.flops import attention_backward_flops, attention_forward_flops

PASSES = ("forward", "backward", "forward_backward")
LEADERBOARD_SHAPE = {"batch": 16, "seq": 16384, "head_dim": 64, "dtype": torch.bfloat16, "causal": True}


def attention_flops(batch: int, seq: int, head_dim: int, causal: bool, pass_name: str) -> float:
    """Forward 4·B·N²·d (half when causal), backward 2.5× that, forward_backward the sum."""
    forward = attention_forward_flops(batch, 1, seq, seq, head_dim, causal)
    backward = attention_backward_flops(batch, 1, seq, seq, head_dim, causal)
    return {"forward": forward, "backward": backward, "forward_backward": forward + backward}[pass_name]


def implementation(name: str, sdpa_backend: str | None = None):
    """The registry's function; ``sdpa`` run under ``sdpa_kernel(sdpa_backend)`` when one is named."""
    fn = attention.get(name)
    if name != "sdpa" or not sdpa_backend:
        return fn

    def pinned(q, k, v, is_causal=False):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, sdpa_backend)):
            return fn(q, k, v, is_causal)

    return pinned


def make_inputs(batch: int, seq: int, head_dim: int, dtype: torch.dtype, seed: int = 0):
    """q, k, v (requiring grad) and dO, each (1, batch, seq, head_dim), on CUDA."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(1, batch, seq, head_dim, device="cuda", dtype=dtype, generator=gen) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do


def _failure(exc: Exception) -> dict:
    """Out of memory or an error as a value, so a sweep goes on."""
    oom = isinstance(exc, torch.OutOfMemoryError)
    return {"status": "oom" if oom else "error", "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500]}


def time_attention(batch, seq, head_dim, dtype, causal, fn, *, warmup_ms, rep_ms) -> dict:
    """Median forward, backward and forward+backward ms of ``fn``; ``status`` ok, oom or error (times NaN
    from the failing pass on). The backward runs on one retained graph; do_bench sets the input grads
    to None before each run, outside the timed region."""
    from triton.testing import do_bench

    result = {f"{p}_ms": float("nan") for p in PASSES} | {"status": "ok", "error": None}
    q = k = v = do = o = None
    try:
        q, k, v, do = make_inputs(batch, seq, head_dim, dtype)
        grads = [q, k, v]
        timing = {"warmup": warmup_ms, "rep": rep_ms, "return_mode": "median"}
        result["forward_ms"] = do_bench(lambda: fn(q, k, v, causal), **timing)
        o = fn(q, k, v, causal)
        result["backward_ms"] = do_bench(lambda: o.backward(do, retain_graph=True), grad_to_none=grads, **timing)
        o = None
        result["forward_backward_ms"] = do_bench(lambda: fn(q, k, v, causal).backward(do), grad_to_none=grads, **timing)
    except Exception as exc:  # noqa: BLE001 - recorded as a value
        result |= _failure(exc)
    finally:
        q = k = v = do = o = None  # the closures hold the names: drop the tensors
        torch.cuda.empty_cache()
    return result


def time_leaderboard(fn, *, compile: bool, warmup_ms: float, rep_ms: float, head_dim: int) -> dict:
    """The course's protocol on LEADERBOARD_SHAPE (``head_dim`` replacing its 64), input grads accumulating
    as in its script: f = torch.compile(fn); do_bench(lambda: f(q, k, v, True).sum().backward()), median."""
    from triton.testing import do_bench

    shape = LEADERBOARD_SHAPE
    result = {"forward_backward_ms_median": float("nan"), "status": "ok", "error": None}
    try:
        q, k, v, _ = make_inputs(shape["batch"], shape["seq"], head_dim, shape["dtype"])
        f = torch.compile(fn) if compile else fn
        times = do_bench(lambda: f(q, k, v, True).sum().backward(), warmup=warmup_ms, rep=rep_ms, return_mode="all")
        times = torch.tensor(times, dtype=torch.float64)
        result.update(forward_backward_ms_median=times.median().item(), forward_backward_ms_mean=times.mean().item())
    except Exception as exc:  # noqa: BLE001 - recorded as a value
        result |= _failure(exc)
    q = k = v = None
    torch.cuda.empty_cache()
    return result
