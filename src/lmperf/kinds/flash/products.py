"""What the benchmark's fp32 records multiplied in: our kernels (the record's ``dot_precision``) and SDPA's
backends (by backend and device). Reads records only."""

from __future__ import annotations

from lmperf.core.peaks import PEAKS

# tl.dot's input_precision -> the report's label
PRODUCT_LABELS = {"ieee": "IEEE", "tf32": "TF32", "tf32x3": "3xTF32"}
PRODUCT_WORDS = {"IEEE": "IEEE float32 products", "TF32": "TF32 products", "3xTF32": "3xTF32 products"}
PRODUCT_SENTENCES = {
    "IEEE": 'IEEE float32 products (`input_precision="ieee"`, on the FMA units), so these rows are fp32 arithmetic',
    "TF32": "TF32 products on tensor cores (one product, 10-bit mantissas), so these rows are not fp32 arithmetic",
    "3xTF32": (
        'three TF32 tensor-core products per product (`input_precision="tf32x3"`: high*high + high*low + '
        "low*high of each operand's TF32 split), whose error against float64 matches fp32's, "
        "so these rows are fp32-accurate, not IEEE float32 arithmetic"
    ),
}
# PyTorch's memory-efficient SDPA kernels (CUTLASS, from xFormers: `DefaultGemmType<ArchTag, float>` in
# `mem_eff_attention/gemm_kernel_utils.h`) multiply fp32 inputs with 3xTF32 (`OpMultiplyAddFastF32`)
# on compute capability 8.0 and newer, whatever `allow_tf32` says. The flash backend takes no fp32.
SDPA_FP32_PRODUCTS = {"EFFICIENT_ATTENTION": "3xTF32"}
SDPA_FP32_WHY = (
    "PyTorch's memory-efficient kernels (CUTLASS `OpMultiplyAddFastF32`) multiply fp32 inputs with three TF32 "
    "tensor-core products per product on GPUs with TF32 tensor cores (this one has them: a TF32 peak in "
    "`lmperf.core.peaks`), whatever `allow_tf32` says"
)


def record_products(record: dict) -> tuple[str, str] | None:
    """(a PRODUCT_LABELS value, how we know) for one fp32 GPU record of our kernels; None where the
    question does not arise (not fp32, or the CPU, which computes in fp32). The record's
    ``dot_precision`` (metrics, or settings in older records) wins; without one the kernels followed
    ``torch.backends.cuda.matmul.allow_tf32``."""
    prov = record["provenance"]
    if record["cell"].get("precision") != "fp32" or prov.get("device_slug") == "cpu":
        return None
    named = record.get("metrics", {}).get("dot_precision") or (prov.get("settings") or {}).get("dot_precision")
    if named:
        return PRODUCT_LABELS.get(str(named).lower(), str(named)), f"`dot_precision` {named} in the records"
    on = bool(prov.get("matmul_allow_tf32"))
    how = f"the kernels follow `torch.backends.cuda.matmul.allow_tf32`, {'on' if on else 'off'} in the records"
    return ("TF32" if on else "IEEE"), how


def sdpa_products(records: list[dict]) -> str | None:
    """What the ``sdpa`` records of float32 inputs multiplied in (a PRODUCT_LABELS value), where the backend
    they were pinned to and the device decide it; None where they do not (CPU, another backend or device)."""
    mine = [r for r in records if r["cell"]["implementation"] == "sdpa"]
    backends = {r["provenance"]["settings"].get("sdpa_backend") for r in mine}
    slugs = {r["provenance"].get("device_slug") for r in mine}
    if len(backends) != 1 or len(slugs) != 1 or not (PEAKS.get(slugs.pop() or "") or {}).get("tf32"):
        return None
    return SDPA_FP32_PRODUCTS.get(backends.pop() or "")
