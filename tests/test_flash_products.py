"""lmperf.kernels.flash.products.dot_precision_for: what a cell's records say our kernels multiply in.

The reference is the table the three cells (flash_correctness, flash_benchmark, attention) each
wrote by hand before they shared the helper, read off their old code.
"""

from __future__ import annotations

import pytest

from lmperf.kernels.flash import products


@pytest.mark.parametrize("fp32_env", ["tf32x3", "ieee"])
@pytest.mark.parametrize("allow_tf32", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
def test_dot_precision_for_every_precision(monkeypatch, fp32_env, allow_tf32, precision):
    monkeypatch.setenv("LMPERF_FLASH_FP32", fp32_env)
    want = {
        # attention: "tf32" if allow_tf32 else fp32_products(); flash_correctness: fp32_products()
        "fp32": "tf32" if allow_tf32 else fp32_env,
        # flash_benchmark: {"fp32": fp32_products(), "tf32": "tf32"}.get(precision, precision)
        "tf32": "tf32",
        "bf16": "bf16",
        "fp16": "fp16",
    }[precision]
    assert products.dot_precision_for(precision, allow_tf32) == want


def test_dot_precision_for_defaults_to_fp32_products_and_checks_the_environment(monkeypatch):
    monkeypatch.delenv("LMPERF_FLASH_FP32", raising=False)
    assert products.dot_precision_for("fp32") == "tf32x3"
    monkeypatch.setenv("LMPERF_FLASH_FP32", "fp64")
    with pytest.raises(ValueError, match="LMPERF_FLASH_FP32"):
        products.dot_precision_for("fp32")
    assert products.dot_precision_for("bf16") == "bf16"  # 16-bit inputs never read it
