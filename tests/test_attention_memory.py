"""Memory accounting of attention: hand-computed numbers and PyTorch's own saved tensors."""

from __future__ import annotations

import random

import pytest
import torch

from lmperf import attention
from lmperf.kinds.attention import memory_model as memory
from lmperf.kinds.attention.cell import SavedTensors, build

GIB, MIB, KIB = 2**30, 2**20, 2**10


def test_plain_accounting_by_hand_for_the_courses_largest_cell():
    # batch 8, N = 16384, d = 64, fp32: one N×N matrix is 8·16384²·4 B = 8 GiB exactly,
    # a row statistic 8·16384·4 B = 512 KiB, a (B, N, d) tensor 8·16384·64·4 B = 32 MiB.
    acc = memory.plain_accounting(memory.Shape(8, 16384, 64, 4))
    assert acc.inputs_bytes == 96 * MIB and acc.grad_output_bytes == 32 * MIB and acc.output_bytes == 32 * MIB
    assert acc.saved_bytes == 3 * 8 * GIB + 2 * 512 * KIB  # S, E, P and the row max and sum
    assert acc.n2_matrices_saved == 3
    assert acc.retained_bytes == 24 * GIB + 1 * MIB + 32 * MIB
    assert acc.before_backward_bytes == 24 * GIB + 1 * MIB + 160 * MIB
    # peak at P = E / sum: S, X, E and P live at once, with both row statistics
    assert acc.forward_peak_extra_bytes == 32 * GIB + 1 * MIB
    assert acc.forward_peak_bytes == 32 * GIB + 1 * MIB + 128 * MIB


def test_first_failing_allocation_on_an_80_gib_card():
    # N = 32768, d = 64: M = 32 GiB, R = 1 MiB, Q/K/V/dO = 64 MiB each. Live: raw 32, S 64 (raw
    # freed -> 32), m, X -> 64 GiB + 1 MiB, then E asks for 32 GiB more: 96 GiB > 80 GiB.
    shape = memory.Shape(8, 32768, 64, 4)
    base = 4 * 64 * MIB
    fail = memory.first_failure(memory.plain_forward_steps(shape), base, 80 * GIB)
    assert fail.step.tensor == "E"
    assert fail.step.nbytes == 32 * GIB
    assert fail.live_before == base + 64 * GIB + 1 * MIB
    assert fail.live_peak == base + 96 * GIB + 1 * MIB
    # the whole forward fits in 160 GiB (peak 128 GiB + 2 MiB + base)
    assert memory.first_failure(memory.plain_forward_steps(shape), base, 160 * GIB) is None


def test_timeline_frees_and_rounding():
    shape = memory.Shape(1, 3, 5, 4)  # matrices of 36 B, rows of 12 B, vectors of 60 B
    points = memory.timeline(memory.plain_forward_steps(shape), base_bytes=100)
    assert [p.live_peak for p in points] == [136, 172, 148, 184, 220, 232, 268, 292]
    assert points[1].live_after == 136  # raw freed once S exists
    assert points[-2].live_after == 232  # X freed when softmax returned
    assert points[-1].live_after == 292  # then O (60 B) added
    rounded = memory.timeline(memory.plain_forward_steps(shape), rounded=True)
    assert all(p.live_peak % 512 == 0 for p in rounded)
    assert memory.block_bytes(1) == 512 and memory.block_bytes(512) == 512 and memory.block_bytes(513) == 1024


def test_fused_accounting_by_hand():
    acc = memory.fused_accounting(memory.Shape(8, 65536, 128, 4))
    assert acc.saved_bytes == 8 * 65536 * 4 == 2 * MIB  # one fp32 log-sum-exp per row
    assert acc.output_bytes == 256 * MIB and acc.n2_matrices_saved == 0
    assert acc.retained_bytes == 258 * MIB
    assert memory.accounting("compiled", memory.Shape(1, 2, 3)) is None
    assert memory.accounting("flash", memory.Shape(1, 2, 3)).n2_matrices_saved == 0


def _saved(fn, shape: memory.Shape, dtype=torch.float32):
    q, k, v = (
        torch.randn(shape.batch, shape.seq_len, shape.head_dim, dtype=dtype, requires_grad=True) for _ in range(3)
    )
    saved = SavedTensors(exclude=(q, k, v))
    with saved.hooks():
        out = fn(q, k, v)
    return saved, out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_plain_accounting_matches_what_autograd_saves(fresh_seed, dtype):
    torch.manual_seed(fresh_seed)
    rng = random.Random(fresh_seed)
    shape = memory.Shape(rng.randint(1, 4), rng.randint(8, 96), rng.choice([4, 8, 16]), dtype.itemsize)
    saved, out = _saved(attention.plain_attention, shape, dtype)
    acc = memory.plain_accounting(shape)
    assert saved.nbytes() == acc.saved_bytes
    assert saved.nbytes(also=out) == acc.retained_bytes
    n2 = [s for s in saved.storages.values() if s[1] == (shape.batch, shape.seq_len, shape.seq_len)]
    assert len(n2) == acc.n2_matrices_saved == 3


def test_fused_accounting_matches_sdpa(fresh_seed):
    torch.manual_seed(fresh_seed)
    shape = memory.Shape(2, random.Random(fresh_seed).randint(16, 80), 16, 4)
    saved, out = _saved(build("sdpa"), shape)
    assert saved.nbytes(also=out) == memory.fused_accounting(shape).retained_bytes


def test_fit_exponent():
    xs = [256, 1024, 4096, 16384]
    assert memory.fit_exponent(xs, [3 * x**2 for x in xs]) == pytest.approx(2.0)
    assert memory.fit_exponent(xs, [5 * x for x in xs]) == pytest.approx(1.0)
    # a quadratic plus a linear term bends the slope below 2
    assert 1.5 < memory.fit_exponent(xs, [x**2 + 2000 * x for x in xs]) < 2.0
    with pytest.raises(ValueError):
        memory.fit_exponent([4], [16])
