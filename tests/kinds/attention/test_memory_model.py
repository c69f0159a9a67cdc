"""The memory accounting of attention: hand-computed numbers, and what PyTorch's autograd really saves."""

from __future__ import annotations

import random

import pytest
import torch

from lmperf import attention
from lmperf.kinds.attention import memory_model as memory
from lmperf.kinds.attention.cell import build, saved_bytes

GIB, MIB, KIB = 2**30, 2**20, 2**10


def test_plain_accounting_by_hand_for_the_courses_largest_cell():
    # batch 8, N = 16384, d = 64, fp32: one N×N matrix is 8·16384²·4 B = 8 GiB, a row statistic
    # 8·16384·4 B = 512 KiB, a (B, N, d) tensor 8·16384·64·4 B = 32 MiB.
    acc = memory.plain_accounting(memory.Shape(8, 16384, 64, 4))
    assert acc.inputs_bytes == 128 * MIB and acc.output_bytes == 32 * MIB  # Q, K, V and dO; O
    assert acc.saved_bytes == 3 * 8 * GIB + 2 * 512 * KIB  # S, E, P, max and sum
    assert acc.before_backward_bytes == 24 * GIB + 1 * MIB + 160 * MIB
    assert acc.forward_peak_extra_bytes == 32 * GIB + 1 * MIB  # at P = E / sum: S, X, E and P live, both rows


def test_the_first_allocation_that_fails_on_an_80_gib_card():
    # N = 32768, d = 64: M = 32 GiB, R = 1 MiB. Live: raw, then S (raw freed), m, X: 64 GiB + 1 MiB, then E asks for 32 GiB more
    shape, base = memory.Shape(8, 32768, 64, 4), 4 * 64 * MIB
    fail = memory.first_failure(memory.plain_forward_steps(shape), base, 80 * GIB)
    assert (fail.step.tensor, fail.step.nbytes, fail.live_before) == ("E", 32 * GIB, base + 64 * GIB + 1 * MIB)
    assert memory.first_failure(memory.plain_forward_steps(shape), base, 160 * GIB) is None
    # matrices of 36 B, rows of 12 B, vectors of 60 B
    points = memory.timeline(memory.plain_forward_steps(memory.Shape(1, 3, 5, 4)), base_bytes=100)
    assert [p.live_peak for p in points] == [136, 172, 148, 184, 220, 232, 268, 292]


def test_fused_accounting_by_hand():
    acc = memory.fused_accounting(memory.Shape(8, 65536, 128, 4))
    assert acc.saved_bytes == 8 * 65536 * 4 == 2 * MIB and acc.output_bytes == 256 * MIB  # one fp32 log-sum-exp per row
    assert acc.retained_bytes == 258 * MIB
    assert memory.accounting("compiled", memory.Shape(1, 2, 3)) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_accounting_is_what_autograd_saves(fresh_seed, dtype):
    torch.manual_seed(fresh_seed)
    rng = random.Random(fresh_seed)
    shape = memory.Shape(rng.randint(1, 4), rng.randint(8, 96), rng.choice([4, 8, 16]), dtype.itemsize)
    q, k, v = (
        torch.randn(shape.batch, shape.seq_len, shape.head_dim, dtype=dtype, requires_grad=True) for _ in range(3)
    )
    _, saved, retained = saved_bytes(attention.plain_attention, q, k, v)
    assert (saved, retained) == (
        memory.plain_accounting(shape).saved_bytes,
        memory.plain_accounting(shape).retained_bytes,
    )
    if dtype == torch.float32:  # a fused kernel: O and one fp32 log-sum-exp per row
        _, _, retained = saved_bytes(build("sdpa", compile_dynamic=False), q, k, v)
        assert retained == memory.fused_accounting(shape).retained_bytes


def test_fit_exponent():
    xs = [256, 1024, 4096, 16384]
    assert memory.fit_exponent(xs, [3 * x**2 for x in xs]) == pytest.approx(2.0)
    assert memory.fit_exponent(xs, [5 * x for x in xs]) == pytest.approx(1.0)
    assert 1.5 < memory.fit_exponent(xs, [x**2 + 2000 * x for x in xs]) < 2.0  # a linear term bends the slope
