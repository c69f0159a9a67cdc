"""Timing FlashAttention-2 against plain and SDPA attention on CUDA (flash_benchmarking, leaderboard).

Implementations are registered by name in IMPLEMENTATIONS (`plain`, the course's unfused
attention, is the baseline); each is a function (q, k, v, is_causal) -> o on (batch, seq, d)
tensors, heads folded into batch. Inputs are made before timing, and every timed function is a
zero-argument closure handed to `triton.testing.do_bench` (CUDA events, median). Precision
`tf32` is float32 inputs with TF32 matmuls allowed (torch.backends.cuda.matmul.allow_tf32, which
our kernels follow too); `fp32` keeps IEEE float32 products.

The harness lives outside lmperf.kernels.flash: kernels are leaves and never import the measuring layer.

    python -m lmperf.kinds.flash.harness              # table: leaderboard shape, causal d=64/128 at 16k
    python -m lmperf.kinds.flash.harness --leaderboard  # also the course's leaderboard protocol
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F

from lmperf.attention import plain_attention
from lmperf.core.flops import tflops_per_s

PASSES = ("forward", "backward", "forward_backward")
BASELINE = "plain"
LEADERBOARD_SHAPE = dict(batch=16, seq=16384, head_dim=64, dtype=torch.bfloat16, causal=True)


@contextlib.contextmanager
def matmul_precision(precision: str):
    """TF32 matmuls allowed for `tf32`, forbidden otherwise (fp32 means IEEE fp32), restored after."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


# --- FLOP counts ------------------------------------------------------------------------------------


def attention_flops(batch: int, seq: int, head_dim: int, causal: bool, pass_name: str) -> float:
    """Forward 4*B*N^2*d, half when causal; backward 2.5x forward; forward_backward the sum
    (lmperf.core.flops, heads folded into batch)."""
    from lmperf.core.flops import attention_backward_flops, attention_forward_flops

    forward = attention_forward_flops(batch, 1, seq, seq, head_dim, causal)
    backward = attention_backward_flops(batch, 1, seq, seq, head_dim, causal)
    return {"forward": forward, "backward": backward, "forward_backward": forward + backward}[pass_name]


# --- implementations ------------------------------------------------------------------------------


def flash_triton(q, k, v, is_causal=False):
    from lmperf.kernels.flash.autograd import FlashAttention2Triton

    return FlashAttention2Triton.apply(q, k, v, is_causal)


def _sdpa(backend_name: str) -> Callable:
    def attention(q, k, v, is_causal=False):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        # the fused kernels want (batch, heads, seq, d): our folded batch becomes the heads
        with sdpa_kernel(backend):
            o = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=is_causal)
        return o[0]

    attention.__name__ = f"sdpa_{backend_name.lower()}"
    return attention


IMPLEMENTATIONS: dict[str, Callable] = {
    "plain": plain_attention,  # the course's unfused attention, as the model uses it
    "flash_triton": flash_triton,
    "sdpa_flash": _sdpa("FLASH_ATTENTION"),
    "sdpa_cudnn": _sdpa("CUDNN_ATTENTION"),
    "sdpa_efficient": _sdpa("EFFICIENT_ATTENTION"),
    "sdpa_math": _sdpa("MATH"),
}


# --- timing ---------------------------------------------------------------------------------------


def make_inputs(batch: int, seq: int, head_dim: int, dtype: torch.dtype, device="cuda", seed=0):
    """q, k, v (requiring grad) and dO, all (batch, seq, head_dim)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (torch.randn(batch, seq, head_dim, device=device, dtype=dtype, generator=gen) for _ in range(4))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do


def time_attention(
    batch: int,
    seq: int,
    head_dim: int,
    dtype: torch.dtype,
    causal: bool,
    impl: str,
    *,
    warmup_ms: int = 25,
    rep_ms: int = 100,
) -> dict:
    """Median forward, backward and forward+backward milliseconds of one implementation.

    Returns {"forward_ms", "backward_ms", "forward_backward_ms", "status", "error"}; status is
    "ok", "oom" (times NaN) or "error" (times NaN, the exception in "error"). The backward is
    timed on one retained graph (retain_graph=True); do_bench sets the input grads to None
    before each run, outside the timed region, so nothing accumulates.
    """
    from triton.testing import do_bench

    fn = IMPLEMENTATIONS[impl]
    result = {f"{p}_ms": float("nan") for p in PASSES} | {"status": "ok", "error": None}
    q = k = v = do = o = None
    try:
        q, k, v, do = make_inputs(batch, seq, head_dim, dtype)
        grads = [q, k, v]

        def forward():
            return fn(q, k, v, causal)

        result["forward_ms"] = do_bench(forward, warmup=warmup_ms, rep=rep_ms, return_mode="median")
        o = forward()

        def backward():
            o.backward(do, retain_graph=True)

        result["backward_ms"] = do_bench(
            backward, warmup=warmup_ms, rep=rep_ms, grad_to_none=grads, return_mode="median"
        )
        o = None

        def forward_backward():
            fn(q, k, v, causal).backward(do)

        result["forward_backward_ms"] = do_bench(
            forward_backward, warmup=warmup_ms, rep=rep_ms, grad_to_none=grads, return_mode="median"
        )
    except torch.OutOfMemoryError as e:
        result.update(status="oom", error=str(e).splitlines()[0])
    except Exception as e:  # recorded as a value so a sweep goes on
        result.update(status="error", error=f"{type(e).__name__}: {e}"[:500])
    finally:
        q = k = v = do = o = None  # drop the inputs (the closures above hold the names)
        torch.cuda.empty_cache()
    return result


def time_leaderboard(
    impl: str = "flash_triton",
    *,
    compile: bool = True,
    warmup_ms: int = 1000,
    rep_ms: int = 10000,
    head_dim: int | None = None,
) -> dict:
    """The course's leaderboard protocol on LEADERBOARD_SHAPE: f = torch.compile(impl);
    do_bench(lambda: f(q, k, v, True).sum().backward(), rep=10000, warmup=1000).

    As in the course's script, input grads are not reset between runs (they accumulate).
    `head_dim` replaces the shape's 64 (e.g. 128 for the d=128 comparison).
    Returns {"forward_backward_ms_median", "forward_backward_ms_mean", "status", "error"}.
    """
    from triton.testing import do_bench

    shape = LEADERBOARD_SHAPE
    result = {
        "forward_backward_ms_median": float("nan"),
        "forward_backward_ms_mean": float("nan"),
        "status": "ok",
        "error": None,
    }
    try:
        q, k, v, _ = make_inputs(shape["batch"], shape["seq"], head_dim or shape["head_dim"], shape["dtype"])
        f = torch.compile(IMPLEMENTATIONS[impl]) if compile else IMPLEMENTATIONS[impl]

        def step():
            o = f(q, k, v, True)
            o.sum().backward()

        times = do_bench(step, warmup=warmup_ms, rep=rep_ms, return_mode="all")
        times = torch.tensor(times, dtype=torch.float64)
        result.update(forward_backward_ms_median=times.median().item(), forward_backward_ms_mean=times.mean().item())
    except torch.OutOfMemoryError as e:
        result.update(status="oom", error=str(e).splitlines()[0])
    except Exception as e:
        result.update(status="error", error=f"{type(e).__name__}: {e}"[:500])
    torch.cuda.empty_cache()
    return result


# --- the table ------------------------------------------------------------------------------------


def table_rows(shapes, impls=("plain", "flash_triton", "sdpa_flash", "sdpa_cudnn"), **timing) -> list[dict]:
    """One row per (shape, implementation): times, TFLOP/s and speed-up against the baseline."""
    rows = []
    for batch, seq, head_dim, dtype, causal in shapes:
        base = None
        for impl in impls:
            r = time_attention(batch, seq, head_dim, dtype, causal, impl, **timing)
            row = dict(
                batch=batch, seq=seq, head_dim=head_dim, dtype=str(dtype).split(".")[-1], causal=causal, impl=impl, **r
            )
            for p in PASSES:
                row[f"{p}_tflops"] = tflops_per_s(attention_flops(batch, seq, head_dim, causal, p), r[f"{p}_ms"])
            if impl == BASELINE:
                base = r
            if base is not None:
                row["speedup_vs_plain"] = base["forward_backward_ms"] / r["forward_backward_ms"]
            rows.append(row)
            print(format_row(row), flush=True)
    return rows


def format_row(row: dict) -> str:
    shape = f"{row['batch']}x{row['seq']}x{row['head_dim']} {row['dtype']}" + (" causal" if row["causal"] else "")
    times = "  ".join(f"{row[f'{p}_ms']:8.3f} ms {row[f'{p}_tflops']:6.1f} TF" for p in PASSES)
    note = "" if row["status"] == "ok" else f"  [{row['status']}: {row['error']}]"
    return f"{shape:28s} {row['impl']:13s} {times}{note}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--leaderboard",
        action="store_true",
        help="also run the course's leaderboard protocol (torch.compile, 11 s each)",
    )
    parser.add_argument("--tune", action="store_true", help="tune buckets with no remembered tiles")
    parser.add_argument("--impls", default="plain,flash_triton,sdpa_flash,sdpa_cudnn")
    args = parser.parse_args(argv)

    lb = LEADERBOARD_SHAPE
    shapes = [
        (lb["batch"], lb["seq"], lb["head_dim"], lb["dtype"], lb["causal"]),
        (1, 16384, 64, torch.bfloat16, True),
        (1, 16384, 128, torch.bfloat16, True),
    ]
    if args.tune:
        from lmperf.kernels.flash import tuning

        tuning.set_policy("missing")
    print(f"{'shape':28s} {'impl':13s} " + "  ".join(f"{p:>20s}" for p in PASSES))
    rows = table_rows(shapes, impls=args.impls.split(","))
    by = {(r["batch"], r["head_dim"], r["impl"]): r for r in rows}
    ours = by.get((lb["batch"], lb["head_dim"], "flash_triton"))
    for other in ("sdpa_flash", "sdpa_cudnn"):
        theirs = by.get((lb["batch"], lb["head_dim"], other))
        if ours and theirs:
            print(
                f"leaderboard shape, fwd+bwd: flash_triton / {other} = "
                f"{ours['forward_backward_ms'] / theirs['forward_backward_ms']:.3f}"
            )
    if args.leaderboard:
        for impl in ("flash_triton", "sdpa_flash", "sdpa_cudnn"):
            print(f"leaderboard protocol {impl}: {time_leaderboard(impl)}", flush=True)
    return rows


if __name__ == "__main__":
    main()
