"""lmperf.flash.warm: the shapes are split into one task per (head dim, dtype, causal), slowest first.

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


@pytest.fixture
def inline(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(warm, "ProcessPoolExecutor", InlinePool)
    seen = []
    monkeypatch.setattr(warm, "run_once", lambda specs: seen.append(specs) or {"shapes": len(specs), "seconds": 0.0})
    return seen


def test_one_task_per_combination_slowest_first(inline):
    specs = [
        spec(64, "bf16", True),
        spec(256, "fp32", False),
        spec(64, "bf16", True, n=3000),  # same combination, another length: same task
        spec(80, "fp16", False),
        spec(64, "fp32", True),
    ]
    out = warm.warm(specs, workers=8)
    combos = [(t["head_dim"], t["dtype"], t["causal"]) for t in out["tasks"]]
    assert combos == [(256, "fp32", False), (64, "fp32", True), (80, "fp16", False), (64, "bf16", True)]
    assert [t["shapes"] for t in out["tasks"]] == [1, 1, 1, 2]
    assert sorted(len(task) for task in inline) == [1, 1, 1, 2]
    assert out["workers"] == 4 and out["combinations"] == 4  # never more processes than tasks


def test_bad_dtype_and_no_cuda_are_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match="dtype must be one of"):
        warm.warm([spec(64, "fp64", True)])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        warm.warm([spec(64, "bf16", True)])
