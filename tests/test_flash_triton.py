"""The Triton FlashAttention-2 kernels against a float64 reference.

Without CUDA the kernels run in Triton's interpreter at small sizes. Triton reads
TRITON_INTERPRET when it is imported (its own tl.* helpers are decorated then) and when our
kernels are decorated, so this file sets it before the first import of triton and leaves it
set for the session (on a machine without CUDA nothing else can run Triton kernels anyway).
If an earlier test file already imported triton without it, this file re-runs itself in a
subprocess with TRITON_INTERPRET=1 instead. With CUDA the same tests run at full size, plus
the tuning cache (tuning on a miss, remembered per bucket) and the compiled-backward variant.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

CUDA = torch.cuda.is_available()
# triton was imported earlier in this process, compiled: the interpreter cannot be switched on
RERUN_IN_SUBPROCESS = not CUDA and "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
if not CUDA and not RERUN_IN_SUBPROCESS:
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

from flash_helpers import assert_close  # noqa: E402

from lmperf.kernels.flash import tuning  # noqa: E402
from lmperf.kernels.flash.autograd import (  # noqa: E402
    FlashAttention2Triton,
    FlashAttention2TritonCompiledBackward,
    flash_backward_dense,
)
from lmperf.kernels.flash.reference import reference_with_grads  # noqa: E402
from lmperf.kernels.flash.reference import relative_error as rel_err  # noqa: E402
from lmperf.kernels.flash.triton_backward import flash_backward  # noqa: E402
from lmperf.kernels.flash.triton_forward import INTERPRETED, flash_forward  # noqa: E402


@pytest.fixture(autouse=True)
def _skip_when_rerun(request):
    if RERUN_IN_SUBPROCESS and request.node.originalname != "test_rerun_in_subprocess":
        pytest.skip("triton was imported without the interpreter; see test_rerun_in_subprocess")


@pytest.mark.skipif(not RERUN_IN_SUBPROCESS, reason="only when triton was imported compiled")
def test_rerun_in_subprocess():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]


DEVICE = "cuda" if CUDA else "cpu"
# sequence lengths drawn in [LO, HI]: several tiles each, ragged, n_q != n_k
LO, HI = (200, 1500) if CUDA else (2, 90)  # one key: dQ, dK are exactly 0
MAX_BATCH = 4 if CUDA else 2

# (O and L, gradients). float32 products are IEEE float32 unless TF32 is asked for.
TOLERANCE = {
    torch.float32: (1e-5, 1e-4),
    torch.bfloat16: (2e-2, 3e-2),
    torch.float16: (5e-3, 1e-2),
}
TF32_TOLERANCE = (2e-3, 5e-3)
# powers of two and not (the kernels pad to BLOCK_D and mask); GPU: fewer, each compiles 4 kernels
HEAD_DIMS = (16, 80, 256) if CUDA else (16, 48, 80, 112, 256)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "bf16", "fp16"]

# None: the tuner's choice (lmperf.kernels.flash.tuning; the policy is `off` unless the environment says
# otherwise, so nothing is tuned here): the committed table's or the heuristic's tiles on GPU, the
# single interpreter config on CPU. Interpreted, a second, square tiling.
if CUDA:
    FIXED = [dict(fwd=None, dkdv=None, dq=None)]
else:
    FIXED = [
        dict(fwd=None, dkdv=None, dq=None),
        dict(
            fwd={"BLOCK_M": 16, "BLOCK_N": 16}, dkdv={"BLOCK_M": 16, "BLOCK_N": 16}, dq={"BLOCK_M": 16, "BLOCK_N": 16}
        ),
    ]


@pytest.fixture
def rng():
    seed = int.from_bytes(os.urandom(4), "little")
    return torch.Generator().manual_seed(seed)


def random_inputs(gen, dtype, d, batch, n_q=None, n_k=None):
    """q (B, n_q, d), k, v (B, n_k, d), dO on DEVICE; lengths ragged and independent."""
    n_q = n_q or int(torch.randint(LO, HI + 1, (1,), generator=gen))
    n_k = n_k or int(torch.randint(LO, HI + 1, (1,), generator=gen))
    return [torch.randn(batch, n, d, generator=gen).to(DEVICE, dtype) for n in (n_q, n_k, n_k, n_q)]


def inputs(rng, dtype, d, **kw):
    kw.setdefault("batch", int(torch.randint(1, MAX_BATCH + 1, (1,), generator=rng)))
    return random_inputs(rng, dtype, d, **kw)


def run_kernels(q, k, v, do, is_causal, tiles):
    o, lse = flash_forward(q, k, v, is_causal, config=tiles["fwd"])
    dq, dk, dv = flash_backward(q, k, v, o, lse, do, is_causal, dkdv_config=tiles["dkdv"], dq_config=tiles["dq"])
    return o, lse, dq, dk, dv


@pytest.mark.skipif(CUDA, reason="the draw's lengths are the interpreter's (LO, HI)")
def test_an_ill_conditioned_draw_is_judged_against_naive_attention_in_its_precision():
    """Seed 2536671786 once failed CI: bf16, d = 112, causal, n_q = 2, n_k = 64. The second query's
    gradient is a difference of nearly equal numbers, so naive bf16 attention misses float64 by more
    than the fixed tolerance too; ours is judged against that (flash_helpers)."""
    from flash_helpers import LOW_PRECISION_FACTOR, low_precision_errors

    q, k, v, do = inputs(torch.Generator().manual_seed(2536671786), torch.bfloat16, 112)
    assert (q.shape[1], k.shape[1]) == (2, 64)
    got = run_kernels(q, k, v, do, True, FIXED[0])
    want = reference_with_grads(q, k, v, do, True)
    naive = low_precision_errors(q, k, v, do, True, want)
    tol_grad = TOLERANCE[torch.bfloat16][1]
    assert naive[2] > tol_grad and rel_err(got[2], want[2]) > tol_grad  # dQ: both beyond the fixed tolerance
    assert rel_err(got[2], want[2]) < LOW_PRECISION_FACTOR * naive[2]
    assert_close(got, want, *TOLERANCE[torch.bfloat16], 2536671786, inputs=(q, k, v, do, True))


@pytest.mark.skipif(CUDA, reason="the draw's lengths are the interpreter's (LO, HI)")
def test_the_draw_that_truncating_casts_failed_passes():
    """Seed 3014225105 failed CI: bf16, d = 48, causal, n_q = 2, n_k = 40, dQ 3.8e-2 from float64
    while naive bf16 attention was at 6.0e-3. The interpreter truncated float32 -> bfloat16 casts;
    rounding to nearest, as the GPU does (lmperf.kernels.flash.triton_common), puts ours back under the fixed tolerance."""
    q, k, v, do = inputs(torch.Generator().manual_seed(3014225105), torch.bfloat16, 48)
    assert (q.shape[1], k.shape[1]) == (2, 40)
    got = run_kernels(q, k, v, do, True, FIXED[0])
    want = reference_with_grads(q, k, v, do, True)
    assert max(rel_err(g, w) for g, w in zip(got[2:], want[2:])) < TOLERANCE[torch.bfloat16][1] / 3
    assert_close(got, want, *TOLERANCE[torch.bfloat16], 3014225105, inputs=(q, k, v, do, True))


def test_interpreter_iff_no_cuda():
    assert INTERPRETED == (not CUDA)


def _bf16_probe_kernels():
    """Two tiny kernels: y = x.to(bfloat16) and c = a @ b (bf16 operands, float32 result)."""
    import triton
    import triton.language as tl

    @triton.jit
    def cast_kernel(X, Y, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(Y + offs, tl.load(X + offs).to(tl.bfloat16))

    @triton.jit
    def dot_kernel(A, B, C, N: tl.constexpr):
        r = tl.arange(0, N)
        a = tl.load(A + r[:, None] * N + r[None, :])
        b = tl.load(B + r[:, None] * N + r[None, :])
        tl.store(C + r[:, None] * N + r[None, :], tl.dot(a, b))

    return cast_kernel, dot_kernel


def test_bf16_cast_rounds_to_nearest_even_and_dot_multiplies_values(rng):
    """Compiled or interpreted, float32 -> bfloat16 rounds as torch does (to nearest, ties to even;
    the interpreter alone truncated, which biased the backward's sums: flash_helpers), and a bf16
    tl.dot gives the float32 product of the values (the interpreter alone multiplied bits:
    lmperf.kernels.flash.triton_common)."""
    cast_kernel, dot_kernel = _bf16_probe_kernels()
    n = 1024
    x = torch.randn(n, generator=rng) * 10.0 ** torch.randint(-3, 4, (n,), generator=rng)
    # ties: a bf16 value plus exactly half its last place, with even and odd last bits
    base = torch.randn(64, generator=rng).bfloat16().float()
    half_ulp = (base.view(torch.int32) & 0x7F800000).view(torch.float32) * 2.0**-8
    x[:64] = base + half_ulp
    x[64:128] = base + half_ulp * 0.99  # below the tie: rounds down, as truncation would
    x[128:192] = base + half_ulp * 1.01  # above the tie: rounds up, where truncation goes down
    x = x.to(DEVICE)
    y = torch.empty(n, dtype=torch.bfloat16, device=DEVICE)
    cast_kernel[(1,)](x, y, n)
    want = x.to(torch.bfloat16)
    assert torch.equal(y.view(torch.int16), want.view(torch.int16)), (y - want).abs().max()

    a, b = (torch.randn(16, 16, generator=rng).bfloat16().to(DEVICE) for _ in range(2))
    c = torch.zeros(16, 16, device=DEVICE)
    dot_kernel[(1,)](a, b, c, 16)
    assert rel_err(c, a.double() @ b.double()) < 1e-6


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_kernels_match_float64_reference(rng, dtype, d, is_causal):
    if not is_causal and d not in (16, 80):
        pytest.skip("the non-causal sweep is cut to d = 16, 80 (compile time on GPU, interpreter time on CPU)")
    q, k, v, do = inputs(rng, dtype, d)
    got = run_kernels(q, k, v, do, is_causal, FIXED[0])
    assert got[0].dtype == dtype and got[1].dtype == torch.float32
    assert_close(
        got,
        reference_with_grads(q, k, v, do, is_causal),
        *TOLERANCE[dtype],
        rng.initial_seed(),
        inputs=(q, k, v, do, is_causal),
    )


@pytest.mark.skipif(len(FIXED) < 2, reason="second tiling only under the interpreter")
@pytest.mark.parametrize("shape", ["more_queries", "more_keys", "two_keys"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_square_tiles_and_uneven_lengths(rng, shape, is_causal):
    n_q, n_k = {"more_queries": (75, 21), "more_keys": (21, 75), "two_keys": (40, 2)}[shape]
    q, k, v, do = inputs(rng, torch.float32, 32, n_q=n_q, n_k=n_k)
    got = run_kernels(q, k, v, do, is_causal, FIXED[1])
    assert_close(
        got,
        reference_with_grads(q, k, v, do, is_causal),
        *TOLERANCE[torch.float32],
        rng.initial_seed(),
        inputs=(q, k, v, do, is_causal),
    )


# every kernel streaming through tensor descriptors (Hopper's TMA; the interpreter emulates them):
# out-of-bounds rows and padded columns must read as zero, as the masked loads do
TMA_TILES = dict(
    fwd={"BLOCK_M": 32, "BLOCK_N": 16, "USE_TMA": True},
    dkdv={"BLOCK_M": 16, "BLOCK_N": 32, "USE_TMA": True},
    dq={"BLOCK_M": 32, "BLOCK_N": 16, "USE_TMA": True},
)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("d", [64, 80])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_tensor_descriptor_loads_match_float64_reference(rng, dtype, d, is_causal):
    if CUDA:  # the interpreter's tiles are small; on GPU, tiles a tuner would pick
        tiles = {
            "fwd": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "USE_TMA": True},
            "dkdv": {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "USE_TMA": True},
            "dq": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "USE_TMA": True},
        }
    else:
        tiles = TMA_TILES
    q, k, v, do = inputs(rng, dtype, d)
    assert_close(
        run_kernels(q, k, v, do, is_causal, tiles),
        reference_with_grads(q, k, v, do, is_causal),
        *TOLERANCE[dtype],
        rng.initial_seed(),
        inputs=(q, k, v, do, is_causal),
    )


@pytest.mark.parametrize("use_tma", [False, True], ids=["pointer_loads", "tma"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_dp_before_dv_order_matches_float64_reference(rng, is_causal, use_tma):
    """DP_FIRST (a dK/dV tuning candidate) only reorders the pass's matmuls: same gradients."""
    tiles = dict(TMA_TILES) if not CUDA else {"fwd": None, "dq": None}
    tiles["dkdv"] = (
        {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
        if CUDA
        else {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1}
    ) | {"USE_TMA": use_tma, "DP_FIRST": True}
    q, k, v, do = inputs(rng, torch.bfloat16, 80)
    assert_close(
        run_kernels(q, k, v, do, is_causal, tiles),
        reference_with_grads(q, k, v, do, is_causal),
        *TOLERANCE[torch.bfloat16],
        rng.initial_seed(),
        inputs=(q, k, v, do, is_causal),
    )


@pytest.mark.parametrize("is_causal", [False, True])
def test_batch_first_launches_give_the_same_outputs(rng, is_causal):
    """BATCH_FIRST (a forward and dQ tuning candidate) only changes which program takes which (batch,
    query tile): outputs equal to the usual launch's, bit for bit, and within tolerance of float64."""
    if CUDA:
        fwd = dq = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
    else:
        fwd = dq = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    q, k, v, do = inputs(rng, torch.bfloat16, 80, batch=3)
    usual = {"fwd": fwd, "dkdv": None, "dq": dq}
    batch_first = {"fwd": fwd | {"BATCH_FIRST": True}, "dkdv": None, "dq": dq | {"BATCH_FIRST": True}}
    got = run_kernels(q, k, v, do, is_causal, batch_first)
    for a, b in zip(got, run_kernels(q, k, v, do, is_causal, usual)):
        assert torch.equal(a, b)
    assert_close(
        got,
        reference_with_grads(q, k, v, do, is_causal),
        *TOLERANCE[torch.bfloat16],
        rng.initial_seed(),
        inputs=(q, k, v, do, is_causal),
    )


def test_tensor_descriptors_only_where_rows_are_16_byte_aligned():
    from lmperf.kernels.flash.triton_common import use_tma

    aligned = torch.zeros(2, 8, 80, dtype=torch.bfloat16, device=DEVICE)  # rows of 160 bytes
    ragged = torch.zeros(2, 8, 100, dtype=torch.bfloat16, device=DEVICE)  # rows of 200 bytes
    assert use_tma({"BLOCK_M": 16, "USE_TMA": True}, aligned, aligned)["USE_TMA"] is True
    assert use_tma({"BLOCK_M": 16, "USE_TMA": True}, aligned, ragged)["USE_TMA"] is False
    assert use_tma({"BLOCK_M": 16, "USE_TMA": True}, aligned[..., 1:], aligned)["USE_TMA"] is False  # offset base
    assert use_tma({"BLOCK_M": 16}, aligned)["USE_TMA"] is False  # not asked for


def test_tensor_descriptors_get_their_allocator_on_the_launching_thread():
    """Triton keeps its allocator per thread, and autograd runs the backward on a thread of its own:
    a TMA launch there must find the allocator set there (on GPU it fails, "no allocator was set")."""
    import threading

    from triton.runtime import _allocation

    from lmperf.kernels.flash.triton_common import use_tma

    aligned = torch.zeros(2, 8, 64, dtype=torch.bfloat16, device=DEVICE)
    use_tma({"USE_TMA": True}, aligned)  # this thread's
    seen = {}

    def launch_elsewhere():
        seen["before"] = _allocation._allocator.get()
        use_tma({"USE_TMA": True}, aligned)
        seen["after"] = _allocation._allocator.get()

    worker = threading.Thread(target=launch_elsewhere)
    worker.start()
    worker.join()
    assert isinstance(seen["before"], _allocation.NullAllocator)  # a new thread starts without one
    assert not isinstance(seen["after"], _allocation.NullAllocator)
    buffer = seen["after"](64, 16, None)
    assert buffer.device == aligned.device and buffer.numel() >= 64


@pytest.fixture
def two_candidates(monkeypatch, tmp_path):
    """Tune among two configs per kernel, with an empty user cache and no committed table: the
    tuning path runs, but a fresh bucket does not compile every candidate on GPU."""
    monkeypatch.setattr(tuning, "CANDIDATES", {k: v[:2] for k, v in tuning.CANDIDATES.items()})
    monkeypatch.setattr(tuning, "TUNED_DIR", tmp_path / "committed")
    monkeypatch.setenv("LMPERF_CACHE_DIR", str(tmp_path / "cache"))
    tuning.forget()
    tuning.reset_stats()
    yield tmp_path / "cache"
    tuning.forget()
    tuning.set_policy(None)


@pytest.mark.skipif(not CUDA, reason="the interpreter runs one fixed config: nothing to tune")
def test_tuning_once_per_bucket_and_remembered(rng, two_candidates):
    tuning.set_policy("missing")
    q, k, v, do = inputs(rng, torch.bfloat16, 80, batch=2, n_q=1000, n_k=900)
    got, _ = run_function(FlashAttention2Triton, q, k, v, do, True)
    assert_close(
        got,
        reference_with_grads(q, k, v, do, True),
        *TOLERANCE[torch.bfloat16],
        rng.initial_seed(),
        inputs=(q, k, v, do, True),
    )
    assert tuning.stats()["tuned"] == 3  # forward, dK/dV, dQ: one bucket each
    # another batch and other lengths in the same bucket (n 513..1024, d 65..128): no tuning
    q, k, v, do = inputs(rng, torch.bfloat16, 96, batch=3, n_q=700, n_k=1024)
    got, _ = run_function(FlashAttention2Triton, q, k, v, do, True)
    assert_close(
        got,
        reference_with_grads(q, k, v, do, True),
        *TOLERANCE[torch.bfloat16],
        rng.initial_seed(),
        inputs=(q, k, v, do, True),
    )
    assert tuning.stats()["tuned"] == 3 and tuning.stats()["memory"] == 3
    # a new process (memory forgotten) reads the user cache
    files = list(two_candidates.glob("flash-*-triton*.json"))
    assert len(files) == 1 and len(json.loads(files[0].read_text())["choices"]) == 3
    tuning.forget()
    run_function(FlashAttention2Triton, q, k, v, do, True)
    assert tuning.stats()["user_cache"] == 3 and tuning.stats()["tuned"] == 3


@pytest.mark.skipif(not CUDA, reason="TF32 exists on GPU only")
@pytest.mark.parametrize("products", ["tf32x3", "ieee"])
def test_fp32_is_as_exact_as_sdpa_fp32_and_tf32_is_asked_for(rng, monkeypatch, products):
    monkeypatch.setenv("LMPERF_FLASH_FP32", products)
    q, k, v, do = inputs(rng, torch.float32, 64, n_q=1024, n_k=1024)
    ref = reference_with_grads(q, k, v, do, True)
    ours = flash_forward(q, k, v, True)[0]
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert rel_err(ours, ref[0]) < 3 * rel_err(sdpa, ref[0]) < TOLERANCE[torch.float32][0]
    tf32 = flash_forward(q, k, v, True, tf32=True)[0]
    assert TOLERANCE[torch.float32][0] < rel_err(tf32, ref[0]) < TF32_TOLERANCE[0]


def run_function(fn, q, k, v, do, is_causal):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    o = fn.apply(q, k, v, is_causal)
    saved = o.grad_fn.saved_tensors
    o.backward(do)
    return (o.detach(), saved[0], q.grad, k.grad, v.grad), saved


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.usefixtures("two_candidates")
def test_autograd_function_and_saved_tensors(rng, is_causal):
    dtype = torch.bfloat16
    q, k, v, do = inputs(rng, dtype, 64)
    got, saved = run_function(FlashAttention2Triton, q, k, v, do, is_causal)
    assert_close(
        got,
        reference_with_grads(q, k, v, do, is_causal),
        *TOLERANCE[dtype],
        rng.initial_seed(),
        inputs=(q, k, v, do, is_causal),
    )
    # the course's contract: save_for_backward(L, Q, K, V, O), L the only (batch, n_q) tensor
    assert len(saved) == 5
    l_like = [t for t in saved if t.shape == q.shape[:2]]
    assert len(l_like) == 1 and l_like[0] is saved[0] and saved[0].dtype == torch.float32
    for t, want in zip(saved[1:], (q, k, v, got[0])):
        assert t.shape == want.shape and torch.equal(t, want)


@pytest.mark.usefixtures("two_candidates")
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
@pytest.mark.usefixtures("two_candidates")
def test_compiled_backward_variant(rng):
    q, k, v, do = inputs(rng, torch.bfloat16, 64, batch=2)
    got, _ = run_function(FlashAttention2TritonCompiledBackward, q, k, v, do, True)
    assert_close(
        got,
        reference_with_grads(q, k, v, do, True),
        *TOLERANCE[torch.bfloat16],
        rng.initial_seed(),
        inputs=(q, k, v, do, True),
    )


@pytest.mark.skipif(not CUDA, reason="full size needs CUDA")
def test_full_size_leaderboard_shape_autotuned():
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    q, k, v, do = (torch.randn(16, 4096, 64, generator=gen).to(DEVICE, torch.bfloat16) for _ in range(4))
    got, _ = run_function(FlashAttention2Triton, q, k, v, do, True)
    want = reference_with_grads(q, k, v, do, True)
    assert_close(got, want, *TOLERANCE[torch.bfloat16], gen.initial_seed(), inputs=(q, k, v, do, True))


@pytest.mark.parametrize(
    "case, message",
    [
        ("head_dim", "head dim"),
        ("big_head_dim", "head dim"),
        ("dtype", "dtype"),
        ("shape", "same shape"),
        ("float64", "unsupported dtype"),
    ],
)
def test_bad_inputs_raise_value_error(case, message):
    q, k, v = (torch.randn(2, n, 32, device=DEVICE) for n in (8, 12, 12))
    if case == "head_dim":
        q, k, v = (torch.randn(2, n, 8, device=DEVICE) for n in (8, 12, 12))
    elif case == "big_head_dim":
        q, k, v = (torch.randn(2, n, 320, device=DEVICE) for n in (8, 12, 12))
    elif case == "dtype":
        v = v.bfloat16()
    elif case == "shape":
        v = v[:, :5]
    elif case == "float64":
        q, k, v = (t.double() for t in (q, k, v))
    with pytest.raises(ValueError, match=message):
        FlashAttention2Triton.apply(q, k, v, False)


def test_cpu_tensors_rejected_when_compiled(monkeypatch):
    from lmperf.kernels.flash import triton_common

    monkeypatch.setattr(triton_common, "INTERPRETED", False)
    q = torch.randn(1, 8, 16)
    with pytest.raises(ValueError, match="CUDA"):
        FlashAttention2Triton.apply(q, q, q, False)
