"""The Triton FlashAttention-2 kernels against a float64 reference.

Without CUDA the kernels run in Triton's interpreter at small sizes: TRITON_INTERPRET is set
here before the kernel modules are imported (triton.jit reads it when it decorates), and the
modules are re-imported if an earlier test file already imported them compiled. With CUDA the
same tests run at full size, plus the autotuned path and the compiled-backward variant.
"""

import importlib
import os
import sys

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    _previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")
_KERNEL_MODULES = ("lmperf.flash.triton_forward", "lmperf.flash.triton_backward",
                   "lmperf.flash.autograd")
if not CUDA:
    for _name in _KERNEL_MODULES:  # imported compiled by an earlier test module: re-decorate
        if _name in sys.modules and not getattr(sys.modules["lmperf.flash.triton_forward"],
                                                "INTERPRETED", False):
            importlib.reload(sys.modules[_name])
    from lmperf.flash import triton_forward as _tf  # noqa: E402
    if _previous is None:  # the decision is made at decoration: leave the environment as found
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = _previous

from lmperf.flash.autograd import (  # noqa: E402
    FlashAttention2Triton, FlashAttention2TritonCompiledBackward, flash_backward_dense)
from lmperf.flash.inputs import TRITON_HEAD_DIMS  # noqa: E402
from lmperf.flash.triton_backward import flash_backward  # noqa: E402
from lmperf.flash.triton_forward import INTERPRETED, flash_forward  # noqa: E402

from test_flash_pytorch import (  # noqa: E402
    assert_close, random_inputs, reference_with_grads, rel_err, rng)  # noqa: F401  (fixture)

DEVICE = "cuda" if CUDA else "cpu"
# sequence lengths drawn in [LO, HI]: several tiles each, ragged, n_q != n_k
LO, HI = (200, 1500) if CUDA else (1, 90)
MAX_BATCH = 4 if CUDA else 2

# (O and L, gradients). On GPU, float32 tl.dot runs in tf32 (10-bit mantissa).
TOLERANCE = {
    torch.float32: (2e-3, 5e-3) if CUDA else (1e-5, 1e-4),
    torch.bfloat16: (2e-2, 3e-2),
    torch.float16: (5e-3, 1e-2),
}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "bf16", "fp16"]

# Fixed tiles for the sweeps (autotuning every dtype x head dim x causal is slow on GPU and
# absent in the interpreter): small enough for float32 at d=128 in shared memory.
# Interpreted, None means the module's single interpreter config.
if CUDA:
    FIXED = [dict(fwd={"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
                  dkdv={"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
                  dq={"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2})]
else:
    FIXED = [dict(fwd=None, dkdv=None, dq=None),
             dict(fwd={"BLOCK_M": 16, "BLOCK_N": 16}, dkdv={"BLOCK_M": 16, "BLOCK_N": 16},
                  dq={"BLOCK_M": 16, "BLOCK_N": 16})]


def inputs(rng, dtype, d, **kw):
    kw.setdefault("batch", int(torch.randint(1, MAX_BATCH + 1, (1,), generator=rng)))
    return [t.to(DEVICE) for t in random_inputs(rng, dtype, d, lo=LO, hi=HI, **kw)]


def run_kernels(q, k, v, do, is_causal, tiles):
    o, lse = flash_forward(q, k, v, is_causal, config=tiles["fwd"])
    dq, dk, dv = flash_backward(q, k, v, o, lse, do, is_causal,
                                dkdv_config=tiles["dkdv"], dq_config=tiles["dq"])
    return o, lse, dq, dk, dv


def test_interpreter_matches_cuda_availability():
    assert INTERPRETED == (not CUDA)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("d", TRITON_HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_kernels_match_float64_reference(rng, dtype, d, is_causal):
    if CUDA and not is_causal and not (d == 64 and dtype != torch.float16):
        pytest.skip("on GPU the non-causal sweep is cut to d=64 (compile time)")
    q, k, v, do = inputs(rng, dtype, d)
    got = run_kernels(q, k, v, do, is_causal, FIXED[0])
    assert got[0].dtype == dtype and got[1].dtype == torch.float32
    assert_close(got, reference_with_grads(q, k, v, do, is_causal), *TOLERANCE[dtype],
                 rng.initial_seed())


@pytest.mark.skipif(len(FIXED) < 2, reason="second tiling only under the interpreter")
@pytest.mark.parametrize("shape", ["more_queries", "more_keys", "one_key"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_square_tiles_and_uneven_lengths(rng, shape, is_causal):
    n_q, n_k = {"more_queries": (75, 21), "more_keys": (21, 75), "one_key": (40, 1)}[shape]
    q, k, v, do = inputs(rng, torch.float32, 32, n_q=n_q, n_k=n_k)
    got = run_kernels(q, k, v, do, is_causal, FIXED[1])
    assert_close(got, reference_with_grads(q, k, v, do, is_causal), *TOLERANCE[torch.float32],
                 rng.initial_seed())


def run_function(fn, q, k, v, do, is_causal):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    o = fn.apply(q, k, v, is_causal)
    saved = o.grad_fn.saved_tensors
    o.backward(do)
    return (o.detach(), saved[0], q.grad, k.grad, v.grad), saved


@pytest.mark.parametrize("is_causal", [False, True])
def test_autograd_function_and_saved_tensors(rng, is_causal):
    dtype = torch.bfloat16
    q, k, v, do = inputs(rng, dtype, 64)
    got, saved = run_function(FlashAttention2Triton, q, k, v, do, is_causal)
    assert_close(got, reference_with_grads(q, k, v, do, is_causal), *TOLERANCE[dtype],
                 rng.initial_seed())
    # the course's contract: save_for_backward(L, Q, K, V, O), L the only (batch, n_q) tensor
    assert len(saved) == 5
    l_like = [t for t in saved if t.shape == q.shape[:2]]
    assert len(l_like) == 1 and l_like[0] is saved[0] and saved[0].dtype == torch.float32
    for t, want in zip(saved[1:], (q, k, v, got[0])):
        assert t.shape == want.shape and torch.equal(t, want)


def test_leading_dims_and_expanded_grad(rng):
    q, k, v, _ = inputs(rng, torch.float32, 32, batch=4)
    q4, k4, v4 = (t.reshape(2, 2, *t.shape[1:]).requires_grad_() for t in (q, k, v))
    o4 = FlashAttention2Triton.apply(q4, k4, v4, True)
    assert o4.shape == q4.shape and o4.grad_fn.saved_tensors[0].shape == q4.shape[:-1]
    o4.sum().backward()  # dO is an expanded (stride 0) tensor
    want = reference_with_grads(q, k, v, torch.ones_like(q), True)
    for g, w in zip((o4, q4.grad, k4.grad, v4.grad), want[:1] + want[2:]):
        assert rel_err(g.reshape(w.shape), w) < TOLERANCE[torch.float32][1]


def test_dense_backward_matches_reference(rng):
    q, k, v, do = inputs(rng, torch.float32, 16)
    o, lse, *want = reference_with_grads(q, k, v, do, True)
    got = flash_backward_dense(q, k, v, o.float(), do, lse.float(), True)
    for g, w in zip(got, want):
        assert rel_err(g, w) < 1e-4, f"seed {rng.initial_seed()}"


@pytest.mark.skipif(not CUDA, reason="torch.compile'd backward is exercised on GPU")
def test_compiled_backward_variant(rng):
    q, k, v, do = inputs(rng, torch.bfloat16, 64, batch=2)
    got, _ = run_function(FlashAttention2TritonCompiledBackward, q, k, v, do, True)
    assert_close(got, reference_with_grads(q, k, v, do, True), *TOLERANCE[torch.bfloat16],
                 rng.initial_seed())


@pytest.mark.skipif(not CUDA, reason="full size needs CUDA")
def test_full_size_leaderboard_shape_autotuned():
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    q, k, v, do = (torch.randn(16, 4096, 64, generator=gen).to(DEVICE, torch.bfloat16)
                   for _ in range(4))
    got, _ = run_function(FlashAttention2Triton, q, k, v, do, True)
    # float32 reference on GPU (float64 at this size is slow); errors are bf16-sized anyway
    want = reference_with_grads(q.float(), k.float(), v.float(), do.float(), True)
    assert_close(got, want, *TOLERANCE[torch.bfloat16], gen.initial_seed())


@pytest.mark.parametrize("case, message", [
    ("head_dim", "head dim"), ("dtype", "dtype"), ("shape", "same shape"),
    ("float64", "unsupported dtype"),
])
def test_bad_inputs_raise_value_error(case, message):
    q, k, v = (torch.randn(2, n, 32, device=DEVICE) for n in (8, 12, 12))
    if case == "head_dim":
        q, k, v = (torch.randn(2, n, 48, device=DEVICE) for n in (8, 12, 12))
    elif case == "dtype":
        v = v.bfloat16()
    elif case == "shape":
        v = v[:, :5]
    elif case == "float64":
        q, k, v = (t.double() for t in (q, k, v))
    with pytest.raises(ValueError, match=message):
        FlashAttention2Triton.apply(q, k, v, False)


def test_cpu_tensors_rejected_when_compiled(monkeypatch):
    from lmperf.flash import triton_forward
    monkeypatch.setattr(triton_forward, "INTERPRETED", False)
    q = torch.randn(1, 8, 16)
    with pytest.raises(ValueError, match="CUDA"):
        FlashAttention2Triton.apply(q, q, q, False)
