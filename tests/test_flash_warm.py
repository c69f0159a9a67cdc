"""lmperf.flash.warm: the shapes are reduced to one per set of binaries (the tiles each kernel would
run with, not the length bucket, decide them), one task each, slowest first; workers never tune and
run TF32 as asked.

The real compilation needs a GPU (bench/flash_sweep.py measures it there); here the pool runs in
this process and the worker's task is replaced by one that reports what it was given.
"""

from __future__ import annotations

from concurrent.futures import Executor

import pytest
import torch

from lmperf.flash import warm


class InlinePool(Executor):
    """A pool that runs its tasks in the calling process, in order."""

    def __init__(self, workers, mp_context=None):
        self.workers = workers

    def map(self, fn, *iterables, **kwargs):
        return [fn(*args) for args in zip(*iterables)]


def spec(d, dtype, causal, n=100):
    return dict(batch=1, n_queries=n, n_keys=n + 1, head_dim=d, dtype=dtype, causal=causal)


def fake_planned(kernel, dtype, precision, head_dim, causal, n_queries, n_keys, device):
    """Tiles that change at bucket 2048 for the forward only and at 16384 for every kernel (the
    shapes of buckets 128-1024 share every binary), and differ for TF32 products."""
    bucket = max(n_queries, n_keys)
    size = 128 if bucket > 8192 else 64
    if kernel == "fwd" and 1024 < bucket <= 8192:
        size = 32
    assert device == "h100"
    return {"BLOCK_M": size, "BLOCK_N": 32, "num_warps": 4 if precision == "tf32" else 8, "num_stages": 2}


@pytest.fixture
def planned(monkeypatch):
    from lmperf.flash import tuning

    monkeypatch.setattr(tuning, "planned", fake_planned)
    monkeypatch.setattr(tuning, "device_slug", lambda device=None: "h100")


@pytest.fixture
def inline(monkeypatch, planned):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(warm, "ProcessPoolExecutor", InlinePool)
    seen = []
    monkeypatch.setattr(warm, "run_once", lambda specs: seen.append(specs) or {"shapes": len(specs), "seconds": 0.0})
    return seen


def test_one_task_per_set_of_binaries_slowest_first(inline):
    specs = [
        spec(64, "bf16", True),
        spec(256, "fp32", False),
        spec(64, "bf16", True, n=200),  # same combination and tiles (fake_planned): the same binaries
        spec(64, "bf16", True, n=3000),  # same combination, other forward tiles: a task of its own
        spec(80, "fp16", False),
        spec(64, "fp32", True),
    ]
    out = warm.warm(specs, workers=8)
    tasks = [(t["head_dim"], t["dtype"], t["causal"]) for t in out["tasks"]]
    assert not any(t["tf32"] for t in out["tasks"])
    assert tasks == [
        (256, "fp32", False),
        (64, "fp32", True),
        (80, "fp16", False),
        (64, "bf16", True),
        (64, "bf16", True),
    ]
    assert [task[0]["n_queries"] for task in inline][-2:] == [100, 3000]  # the cheaper of the two alike
    assert [t["shapes"] for t in out["tasks"]] == [1, 1, 1, 1, 1] and all(len(task) == 1 for task in inline)
    assert out["workers"] == 5 and out["combinations"] == 4  # never more processes than tasks


def test_bad_dtype_and_no_cuda_are_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match="dtype must be one of"):
        warm.warm([spec(64, "fp64", True)])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        warm.warm([spec(64, "bf16", True)])


def test_cheapest_keeps_one_shape_per_set_of_binaries(planned):
    def square(d, n, dtype="bf16", causal=True, batch=8, **extra):
        return dict(batch=batch, n_queries=n, n_keys=n, head_dim=d, dtype=dtype, causal=causal, **extra)

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
    got = [
        (s["head_dim"], s["n_queries"], s["dtype"], s["causal"], bool(s.get("tf32")))
        for s in warm.cheapest(specs, "h100")
    ]
    assert got == [
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
    assert {s["batch"] for s in warm.cheapest(specs, "h100")} == {1}  # the batch compiles nothing


def test_tiles_are_the_tuners_plan_for_each_kernel(monkeypatch):
    """`tiles` asks lmperf.flash.tuning.planned for the forward, dK/dV and dQ of the shape, with the
    dot precision its dtype and tf32 flag give (fp32 products, 3xTF32 by default, for float32; TF32
    when asked)."""
    from lmperf.flash import tuning
    from lmperf.flash.products import fp32_products

    asked = []
    monkeypatch.setattr(tuning, "planned", lambda *args: asked.append(args) or {"BLOCK_M": 16})
    s = dict(batch=3, n_queries=777, n_keys=2049, head_dim=80, dtype="fp32", causal=True)
    assert warm.tiles(s, "h200") == ((("BLOCK_M", 16),),) * 3
    assert asked == [(k, torch.float32, fp32_products(), 80, True, 777, 2049, "h200") for k in tuning.KERNELS]
    asked.clear()
    warm.tiles(dict(s, tf32=True), "h200")
    assert {a[2] for a in asked} == {"tf32"}


def test_workers_never_tune_and_run_tf32_as_each_shape_asks(monkeypatch):
    from lmperf.flash import tuning

    monkeypatch.setenv("LMPERF_FLASH_TUNE", "missing")  # what a worker would inherit
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    seen = []
    monkeypatch.setattr(
        warm,
        "forward_backward",
        lambda s: seen.append((s["dtype"], tuning.policy(), torch.backends.cuda.matmul.allow_tf32)),
    )
    before = torch.backends.cuda.matmul.allow_tf32
    out = warm.run_once([spec(64, "fp32", True) | {"tf32": True}, spec(64, "fp32", True), spec(64, "bf16", False)])
    assert seen == [("fp32", "off", True), ("fp32", "off", False), ("bf16", "off", False)]
    assert out["shapes"] == 3
    assert torch.backends.cuda.matmul.allow_tf32 == before and tuning.policy() == "missing"  # both restored
