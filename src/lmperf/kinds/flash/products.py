"""What fp32 attention records multiplied in: our Triton kernels (the record's ``dot_precision``, or
what the code that wrote it did) and PyTorch's SDPA backends (decided by backend and device).

Shared by the attention, flash and across-devices reports; reads records only.
"""

from __future__ import annotations

# what one fp32 record of our Triton kernels multiplied in, by tl.dot's input_precision
PRODUCT_LABELS = {"ieee": "IEEE", "tf32": "TF32", "tf32x3": "3xTF32"}
PRODUCT_WORDS = {
    "IEEE": "IEEE float32 products",
    "TF32": "TF32 products",
    "3xTF32": "3xTF32 products",
}
PRODUCT_SENTENCES = {
    "IEEE": 'IEEE float32 products (`input_precision="ieee"`, on the FMA units), so these rows are fp32 arithmetic',
    "TF32": "TF32 products on tensor cores (one product, 10-bit mantissas), so these rows are not fp32 arithmetic",
    "3xTF32": (
        'three TF32 tensor-core products per product (`input_precision="tf32x3"`: high*high + high*low + '
        "low*high of each operand's TF32 split), whose error against float64 matches fp32's, "
        "so these rows are fp32-accurate, not IEEE float32 arithmetic"
    ),
}


def record_products(record: dict) -> tuple[str, str] | None:
    """What one fp32 record of our Triton kernels multiplied in, and how we know: (a PRODUCT_LABELS
    value, source); None where the question does not arise (not fp32, or the CPU path, which has
    no tensor cores and computes in fp32).

    The record's own setting (``dot_precision`` / ``input_precision``) wins. Without one, the code
    that wrote it decides: the kernels of issue 12 (every record whose provenance has a
    ``code_version`` key, which came later) used IEEE float32 products unless
    ``torch.backends.cuda.matmul.allow_tf32`` was on (``provenance.matmul_allow_tf32``); the
    kernels before them used ``tl.dot``'s default, TF32."""
    prov = record["provenance"]
    if record["cell"].get("precision") != "fp32" or prov.get("device_slug") == "cpu":
        return None
    settings = prov.get("settings") or {}
    named = settings.get("dot_precision") or settings.get("input_precision")
    if named:
        name = "ieee" if str(named).lower() == "fp32" else str(named).lower()
        return PRODUCT_LABELS.get(name, str(named)), f"`dot_precision` {named} in the records' settings"
    if "code_version" in prov:
        on = bool(prov.get("matmul_allow_tf32"))
        return (
            "TF32" if on else "IEEE",
            "the kernels follow `torch.backends.cuda.matmul.allow_tf32`, "
            f"{'on' if on else 'off'} in the records' provenance",
        )
    return "TF32", "Triton's default input precision, in the kernels of records that predate code versions"


# PyTorch's memory-efficient SDPA kernels (CUTLASS, from xFormers: `DefaultGemmType<ArchTag, float>` in
# `mem_eff_attention/gemm_kernel_utils.h`) multiply fp32 inputs on tensor cores with 3xTF32
# (`cutlass::arch::OpMultiplyAddFastF32`) on compute capability 8.0 and newer, whatever
# `torch.backends.cuda.matmul.allow_tf32` says; older GPUs run them on the FMA units. The flash backend
# takes fp16/bf16 only.
SDPA_FP32_PRODUCTS = {"EFFICIENT_ATTENTION": "3xTF32"}
SDPA_FP32_WHY = (
    "PyTorch's memory-efficient kernels (CUTLASS `OpMultiplyAddFastF32`) multiply fp32 inputs with three TF32 "
    "tensor-core products per product on GPUs with TF32 tensor cores (this one has them: a TF32 peak in "
    "`lmperf.core.peaks`), whatever `allow_tf32` says"
)
# backends of F.scaled_dot_product_attention that take float32 inputs at all
SDPA_FP32_CAPABLE = ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")


def has_tf32_tensor_cores(device_slug: str | None) -> bool:
    """Whether the device has TF32 tensor cores (compute capability 8.0 or newer), by its TF32 peak in
    lmperf.core.peaks; False for devices it does not know."""
    from lmperf.core.peaks import PEAKS

    return bool((PEAKS.get(device_slug or "") or {}).get("tf32"))


def sdpa_backend(records: list[dict], implementation: str) -> str | None:
    """The SDPA backend an implementation's records (float32 inputs) ran on: the one pinned in their settings
    (``sdpa_backend``), else the only one of the allowed fused backends (``sdpa_backends``) that takes
    fp32 here — the flash backend takes fp16/bf16 only, and cuDNN's is out where every ``sdpa_cudnn``
    record of these records is unsupported; None where that leaves not exactly one."""
    settings = [(r["provenance"].get("settings") or {}) for r in _impl_records(records, implementation)]
    pinned = {s["sdpa_backend"] for s in settings if s.get("sdpa_backend")}
    if pinned:
        return pinned.pop() if len(pinned) == 1 else None
    allowed = {b for s in settings for b in (s.get("sdpa_backends") or [])}
    candidates = {b for b in allowed if b in SDPA_FP32_CAPABLE}
    cudnn = _impl_records(records, "sdpa_cudnn")
    if cudnn and all(r["status"] == "unsupported" for r in cudnn):
        candidates.discard("CUDNN_ATTENTION")
    return candidates.pop() if len(candidates) == 1 else None


def sdpa_products(records: list[dict], implementation: str) -> str | None:
    """What an SDPA implementation's GPU records of float32 inputs multiplied in (a PRODUCT_LABELS value), where the
    backend and the device decide it; None where they do not (CPU, unknown backend or device)."""
    mine = _impl_records(records, implementation)
    if not implementation.startswith("sdpa") or not mine:
        return None
    slugs = {r["provenance"].get("device_slug") for r in mine}
    if len(slugs) != 1 or not has_tf32_tensor_cores(slugs.pop()):
        return None
    return SDPA_FP32_PRODUCTS.get(sdpa_backend(records, implementation) or "")


def _impl_records(records: list[dict], implementation: str) -> list[dict]:
    return [
        r
        for r in records
        if ((r["provenance"].get("settings") or {}).get("implementation") or r["cell"].get("implementation"))
        == implementation
    ]
