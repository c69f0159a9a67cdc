"""lmperf.kernels.flash.warm: the shapes are reduced to one per set of binaries (the tiles each kernel
would run with, not the length bucket, decide them), a task per kernel of each, slowest first;
workers never tune, run TF32 as asked, and launch only their task's kernel.

The real compilation needs a GPU (the last test, there); here the pool runs in this process and the
worker's task is replaced by one that reports what it was given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Executor

import pytest
import torch

from lmperf.kernels.flash import triton_backward, triton_forward, tuning, warm
from lmperf.kernels.flash.products import fp32_products


class InlinePool(Executor):
    """A pool that runs its tasks in the calling process, in order."""

    def __init__(self, workers, mp_context=None):
        self.workers = workers

    def map(self, fn, *iterables, **kwargs):
        return [fn(*args) for args in zip(*iterables)]


def spec(d, dtype, causal, n=100, batch=1, **extra):
    return dict(batch=batch, n_queries=n, n_keys=n + 1, head_dim=d, dtype=dtype, causal=causal, **extra)


def square(d, n, dtype="bf16", causal=True, batch=8, **extra):
    return dict(spec(d, dtype, causal, n, batch, **extra), n_keys=n)


def fake_planned(kernel, dtype, precision, head_dim, causal, n_queries, n_keys, device):
    """Tiles that change at bucket 2048 for the forward only and at 16384 for every kernel (the
    shapes of buckets 128-1024 share every binary), and differ for TF32 products."""
    bucket = max(n_queries, n_keys)
    size = 32 if kernel == "fwd" and 1024 < bucket <= 8192 else 128 if bucket > 8192 else 64
    assert device == "h100"
    return {"BLOCK_M": size, "BLOCK_N": 32, "num_warps": 4 if precision == "tf32" else 8, "num_stages": 2}


@pytest.fixture
def planned(monkeypatch):
    monkeypatch.setattr(tuning, "planned", fake_planned)
    monkeypatch.setattr(tuning, "device_slug", lambda device=None: "h100")


@pytest.fixture
def inline(monkeypatch, planned):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(warm, "ProcessPoolExecutor", InlinePool)
    seen = []
    monkeypatch.setattr(warm, "run_task", lambda task: seen.append(task) or {"kernel": task[1], "seconds": 0.0})
    return seen


def test_one_task_per_kernel_of_each_set_of_binaries_slowest_first(inline):
    specs = [
        spec(64, "bf16", True),
        spec(256, "fp32", False),
        spec(64, "bf16", True, n=200),  # same combination and tiles (fake_planned): the same binaries
        spec(64, "bf16", True, n=3000),  # same combination, other forward tiles: a shape of its own
        spec(80, "fp16", False),
        spec(64, "fp32", True),
    ]
    out = warm.warm(specs, workers=32)
    assert not any(t["tf32"] for t in out["tasks"])
    # the slowest shapes first and, among shapes alike, the dK/dV passes, then dQ, then the forwards
    keys = [
        ((t["dtype"] != "fp32", -t["head_dim"], not t["causal"]), warm.KERNEL_ORDER.index(t["kernel"]))
        for t in out["tasks"]
    ]
    assert keys == sorted(keys)
    by_shape = {}
    for shape, kernel in inline:
        by_shape.setdefault((shape["head_dim"], shape["dtype"], shape["causal"], shape["n_queries"]), []).append(kernel)
    assert list(by_shape) == [
        (256, "fp32", False, 100),
        (64, "fp32", True, 100),
        (80, "fp16", False, 100),
        (64, "bf16", True, 100),
        (64, "bf16", True, 3000),
    ]
    assert all(kernels == ["dkdv", "dq", "fwd"] for kernels in by_shape.values())
    assert (out["shapes"], out["combinations"], out["workers"]) == (5, 4, 15)  # never more processes than tasks
    assert warm.warm(specs, workers=4)["workers"] == 4


def test_a_bad_dtype_and_no_cuda_are_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match="dtype must be one of"):
        warm.warm([spec(64, "fp64", True)])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        warm.warm([spec(64, "bf16", True)])


def test_cheapest_keeps_one_shape_per_set_of_binaries(planned):
    specs = [
        square(64, 1000),  # bucket 1024 ...
        square(64, 600),  # ... the same tiles, fewer pairs: kept in its place
        square(64, 100),  # bucket 128: other bucket, the same tiles (fake_planned) ...
        square(64, 50),  # ... and so is 50, the fewest pairs of the three
        square(64, 2000),  # bucket 2048: other forward tiles
        square(64, 6000),  # bucket 8192: the same tiles as 2000
        square(64, 70000, batch=2),  # beyond bucket 8192: other tiles for every kernel ...
        square(64, 65536),  # ... and so is 65536, fewer pairs
        square(64, 600, causal=False),  # another combination
        square(100, 520),  # d = 100: 520 x 100 is a multiple of 16 ...
        square(100, 513),  # ... 513 x 100 is not: another batch-stride specialisation
        square(100, 516),  # 516 x 100 is again
        square(64, 600, dtype="fp32", tf32=True),  # TF32 products: other binaries than fp32's
        square(64, 600, dtype="fp32", tf32=False),
        square(64, 600, tf32=True),  # tf32 means nothing for bf16 inputs: the first one's binaries
        square(256, 65536),  # stride 2**24 ...
        square(256, 2**23, batch=1),  # ... the same tiles, but a stride of 2**31 takes 64-bit integers
        square(64, 608),  # the tiles of 600, but a length divisible by 16: another dK/dV binary ...
        square(64, 1008),  # ... the same one
        square(64, 1),  # the tiles of 50, but a length of 1 is a constant to Triton
    ]
    kept = warm.cheapest(specs, "h100")
    assert [(s["head_dim"], s["n_queries"], s["dtype"], s["causal"], bool(s.get("tf32"))) for s in kept] == [
        (64, 50, "bf16", True, False),
        (64, 2000, "bf16", True, False),
        (64, 65536, "bf16", True, False),
        (64, 600, "bf16", False, False),
        (100, 516, "bf16", True, False),
        (100, 513, "bf16", True, False),
        (64, 600, "fp32", True, True),
        (64, 600, "fp32", True, False),
        (256, 65536, "bf16", True, False),
        (256, 2**23, "bf16", True, False),
        (64, 608, "bf16", True, False),
        (64, 1, "bf16", True, False),
    ]
    assert {s["batch"] for s in kept} == {1}  # the batch compiles nothing


def test_tiles_are_the_tuners_plan_for_each_kernel_in_the_shapes_precision(monkeypatch):
    asked = []
    monkeypatch.setattr(tuning, "planned", lambda *args: asked.append(args) or {"BLOCK_M": 16})
    s = dict(batch=3, n_queries=777, n_keys=2049, head_dim=80, dtype="fp32", causal=True)
    assert warm.tiles(s, "h200") == ((("BLOCK_M", 16),),) * 3
    assert asked == [(k, torch.float32, fp32_products(), 80, True, 777, 2049, "h200") for k in tuning.KERNELS]
    asked.clear()
    warm.tiles(dict(s, tf32=True), "h200")
    assert {a[2] for a in asked} == {"tf32"}


def test_workers_never_tune_and_run_tf32_as_each_shape_asks(monkeypatch):
    monkeypatch.setenv("LMPERF_FLASH_TUNE", "missing")  # what a worker would inherit
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    seen, cuda = [], torch.backends.cuda
    monkeypatch.setattr(
        warm, "kernel_once", lambda s, k: seen.append((s["dtype"], k, tuning.policy(), cuda.matmul.allow_tf32))
    )
    before = torch.backends.cuda.matmul.allow_tf32
    tasks = [
        (spec(64, "fp32", True, tf32=True), "dkdv"),
        (spec(64, "fp32", True), "fwd"),
        (spec(64, "bf16", False), "dq"),
    ]
    assert [warm.run_task(task)["kernel"] for task in tasks] == ["dkdv", "fwd", "dq"]
    assert seen == [("fp32", "dkdv", "off", True), ("fp32", "fwd", "off", False), ("bf16", "dq", "off", False)]
    assert torch.backends.cuda.matmul.allow_tf32 == before and tuning.policy() == "missing"  # both restored


@pytest.mark.parametrize("kernel", warm.KERNEL_ORDER)
def test_each_task_launches_its_kernel_alone_with_the_tiles_the_tuner_chooses(monkeypatch, kernel):
    """One kernel (dQ with the backward's preprocessing kernel), with the config tuning.choose gives
    the launch and the dot precision flash_forward/backward take, on contiguous tensors of the shape."""
    monkeypatch.setattr(torch, "randn", lambda *size, device=None, dtype=None: torch.ones(*size, dtype=dtype))
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *size, device=None, dtype=None: real_zeros(*size, dtype=dtype))
    launched, chosen = [], []

    def choose(name, q, k, causal, precision, launch, outputs):
        chosen.append((name, tuple(q.shape), tuple(k.shape), causal, precision))
        return {"BLOCK_M": 64, "BLOCK_N": 64, "for": name}

    def recorder(name):
        def launch(*args):
            assert all(a.is_contiguous() for a in args if isinstance(a, torch.Tensor))
            launched.append((name, args[-2]["for"], args[-1]))

        return launch

    class DeltaKernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append(("delta", grid, kwargs["HEAD_DIM"]))

    monkeypatch.setattr(tuning, "choose", choose)
    monkeypatch.setattr(triton_forward, "launch_forward", recorder("fwd"))
    monkeypatch.setattr(triton_backward, "launch_dkdv", recorder("dkdv"))
    monkeypatch.setattr(triton_backward, "launch_dq", recorder("dq"))
    monkeypatch.setattr(triton_backward, "flash_bwd_delta_kernel", DeltaKernel())
    warm.kernel_once(dict(batch=2, n_queries=100, n_keys=130, head_dim=48, dtype="fp32", causal=True), kernel)
    assert chosen == [(kernel, (2, 100, 48), (2, 130, 48), True, fp32_products())]
    delta = [("delta", (-(-100 // triton_backward.DELTA_BLOCK_M), 2), 48)] if kernel == "dq" else []
    assert launched == delta + [(kernel, kernel, fp32_products())]
    with pytest.raises(ValueError, match="kernel must be one of"):
        warm.kernel_once(spec(48, "fp32", True), "both")


GPU_CHECK = """
import json, os, sys, torch
from lmperf.kernels.flash import warm
from lmperf.kernels.flash.autograd import FlashAttention2Triton
cache = os.environ["TRITON_CACHE_DIR"]
entries = lambda: sorted(os.listdir(cache)) if os.path.isdir(cache) else []
out = []
for s in json.loads(sys.argv[1]):
    done = warm.warm([s], workers=3)
    before = entries()
    q, k, v = (torch.randn(s["batch"], n, s["head_dim"], device="cuda", dtype=getattr(torch, s["torch_dtype"]),
               requires_grad=True) for n in (s["n_queries"], s["n_keys"], s["n_keys"]))
    FlashAttention2Triton.apply(q, k, v, s["causal"]).sum().backward()
    torch.cuda.synchronize()
    out.append({"kernels": [t["kernel"] for t in done["tasks"]], "new": sorted(set(entries()) - set(before)), "warmed": len(before)})
print(json.dumps(out))
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_after_warming_the_first_forward_and_backward_compile_nothing(tmp_path):
    """Each kernel compiled alone in its own process lands in Triton's cache under the key the real
    launch asks for: the shape's first forward and backward (in another process) add no entry."""
    specs = [
        dict(batch=2, n_queries=300, n_keys=300, head_dim=64, dtype="bf16", torch_dtype="bfloat16", causal=True),
        dict(batch=1, n_queries=257, n_keys=513, head_dim=80, dtype="fp32", torch_dtype="float32", causal=False),
    ]
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"), LMPERF_FLASH_TUNE="off")
    argv = [sys.executable, "-c", GPU_CHECK, json.dumps(specs)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for task in json.loads(proc.stdout.strip().splitlines()[-1]):
        assert task["kernels"] == ["dkdv", "dq", "fwd"] and task["warmed"] >= 4 and task["new"] == [], task
