"""The pieces of lmperf.kinds.flash.harness that do not need a GPU: FLOP counts, the baselines, the layering."""

import os

import pytest
import torch

from lmperf.core.flops import tflops_per_s
from lmperf.kernels.flash.reference import attention_reference, relative_error
from lmperf.kinds.flash.harness import IMPLEMENTATIONS, attention_flops, matmul_precision


def test_flop_counts():
    # leaderboard: 16 x 16384^2 x 64, causal
    fwd = attention_flops(16, 16384, 64, True, "forward")
    assert fwd == 4 * 16 * 16384**2 * 64 / 2
    assert attention_flops(16, 16384, 64, True, "backward") == 2.5 * fwd
    assert attention_flops(16, 16384, 64, True, "forward_backward") == 3.5 * fwd
    assert attention_flops(1, 128, 16, False, "forward") == 2 * attention_flops(1, 128, 16, True, "forward")
    assert tflops_per_s(2e12, 1000.0) == pytest.approx(2.0)


@pytest.mark.parametrize("is_causal", [False, True])
def test_plain_attention_matches_reference(is_causal):
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    q, k, v = (torch.randn(3, n, 32, generator=gen, dtype=torch.float64) for n in (37, 53, 53))
    o = IMPLEMENTATIONS["plain"](q, k, v, is_causal)
    assert relative_error(o, attention_reference(q, k, v, is_causal)[0]) < 1e-12


def test_registry_names():
    assert set(IMPLEMENTATIONS) == {"plain", "flash_triton", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math"}


def test_tf32_is_its_own_precision():
    before = torch.backends.cuda.matmul.allow_tf32
    with matmul_precision("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32
        with matmul_precision("fp32"):
            assert not torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cuda.matmul.allow_tf32 == before


def test_kernels_are_leaves():
    """Nothing in lmperf.kernels.flash imports the measuring layer, the cells or the model's attention."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "src" / "lmperf" / "flash"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            for name in names:
                assert not name.startswith(("lmperf.attention", "lmperf.benchmarks", "lmperf.cells", "lmperf.model")), (
                    f"{path.name} imports {name}"
                )
