"""The timing harness without a GPU: FLOP counts, and the registry's implementations on its 4-D inputs
against float64 attention (``sdpa`` pinned to a backend; the CUDA-only ones refuse a CPU)."""

from __future__ import annotations

import pytest
import torch

from lmperf import attention
from lmperf.kernels.flash.reference import attention_reference, relative_error
from lmperf.kinds.flash import harness


def test_flop_counts():
    fwd = harness.attention_flops(16, 16384, 64, True, "forward")
    assert fwd == 4 * 16 * 16384**2 * 64 / 2  # the leaderboard's shape, causal
    assert harness.attention_flops(16, 16384, 64, True, "forward_backward") == 3.5 * fwd
    assert harness.attention_flops(1, 128, 16, False, "forward") == 2 * harness.attention_flops(
        1, 128, 16, True, "forward"
    )


@pytest.mark.parametrize(("name", "backend"), [("plain", None), ("sdpa", "MATH"), ("flash", None)])
@pytest.mark.parametrize("causal", [False, True])
def test_implementations_match_float64_attention(fresh_seed, name, backend, causal):
    gen = torch.Generator().manual_seed(fresh_seed)
    q, k, v = (torch.randn(1, 3, n, 32, generator=gen) for n in (37, 53, 53))  # (1, batch, N, d)
    want, _ = attention_reference(q.double(), k.double(), v.double(), causal)
    assert relative_error(harness.implementation(name, backend)(q, k, v, causal), want) < 1e-5


@pytest.mark.parametrize("name", ["sdpa_flash", "sdpa_cudnn"])
def test_pinned_fused_backends_refuse_a_cpu(name):
    with pytest.raises(attention.Unavailable, match=f"{name}: PyTorch's .* needs CUDA tensors"):
        harness.implementation(name)(*(torch.randn(1, 2, 8, 16) for _ in range(3)), True)
