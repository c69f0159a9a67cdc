"""Kernel names: a short name, a readable label, and a class (matmul, elementwise, …).

Demangled CUDA kernel names are long templates (``void at::native::vectorized_elementwise_kernel
<4, at::native::CUDAFunctor_add<float>, …>(…)``); the short name alone (``vectorized_elementwise_
kernel``) lumps every elementwise operation together, so ``label`` appends the functor or the
inner kernel that says what the kernel computes. The classifier reads the full name: cuBLAS and
CUTLASS kernels (``gemm``, ``cutlass``, ``xmma``, ``sm90_…``, ``nvjet_…``, split-K reductions)
are matmuls; under the torch.profiler fallback on a CPU the "kernels" are ATen operators
(``aten::mm`` …) and are classified the same way.
"""

from __future__ import annotations

import re

# Classes in the order the report draws them.
CLASSES = ("matmul", "softmax", "reduction", "elementwise", "memory", "optimizer", "other")

# First match wins, so the specific patterns come before the generic ones (a cuBLAS split-K
# "reduce" kernel is a matmul; a multi-tensor AdamW kernel is an optimizer kernel).
_RULES: list[tuple[str, re.Pattern]] = [
    ("optimizer", re.compile(r"multi_tensor_apply|fused_adam|adamw?_|aten::_fused_adam|aten::_foreach_", re.I)),
    (
        "matmul",
        re.compile(
            r"gemm|cutlass|xmma|cublas|nvjet|wgmma|splitkreduce|\bsm(70|75|80|86|89|90|100)_|gemv|"
            r"aten::(mm|bmm|addmm|baddbmm|addbmm|matmul|linear|_scaled_mm)\b",
            re.I,
        ),
    ),
    # Kernels named softmax: PyTorch's fused (log-)softmax, e.g. cross-entropy's. The course's softmax
    # is written out (max, subtract, exp, sum, divide) and runs as reduction and elementwise kernels;
    # the nsys cells attribute it by its NVTX range ("computing softmax"), not by kernel name.
    ("softmax", re.compile(r"softmax", re.I)),
    (
        "reduction",
        re.compile(
            r"reduce_kernel|reduction|\breduce|aten::(sum|amax|amin|max|min|mean|norm|var|std|argmax|logsumexp)\b", re.I
        ),
    ),
    (
        "memory",
        re.compile(
            r"direct_copy|copy_kernel|FillFunctor|(?<!masked_)fill_kernel|memset|memcpy|\bcat\w*kernel|CatArray|"
            r"aten::(copy_|fill_|zero_|zeros|empty\w*|cat|clone|contiguous|to|_to_copy|as_strided|view|"
            r"reshape|transpose|t|expand|permute|slice|select|unsqueeze|flatten|detach|resolve_conj|ones_like|"
            r"zeros_like|empty_like|stack)\b",
            re.I,
        ),
    ),
    (
        "elementwise",
        re.compile(
            r"elementwise|pointwise|triton_poi|aten::(add|add_|sub|mul|mul_|div|div_|exp|pow|sqrt|rsqrt|silu|"
            r"neg|masked_fill|masked_fill_|where|lt|gt|ge|le|eq|ne|sigmoid|cos|sin|rsub|reciprocal|"
            r"addcmul_|addcdiv_|lerp_|sqrt_|threshold_backward|silu_backward|clamp_min)\b",
            re.I,
        ),
    ),
]

# Short names that say nothing on their own: the label adds what the template computes.
_GENERIC = re.compile(
    r"^(vectorized_elementwise_kernel|unrolled_elementwise_kernel|elementwise_kernel|"
    r"elementwise_kernel_with_index|reduce_kernel|Kernel|Kernel2|device_kernel|kernel|"
    r"multi_tensor_apply_kernel|index_elementwise_kernel|distribution_elementwise_grid_stride_kernel)$"
)
# Tokens that name the computation inside a template, most specific first.
_DETAIL_PATTERNS = [
    re.compile(r"\b(cutlass_\w+|sm\d+_xmma_\w+|nvjet_\w+)"),
    re.compile(r"\b(\w+?)_kernel_cuda\b"),
    re.compile(r"\b(\w+?)_kernel(?:_impl)?\b"),
    re.compile(r"\b(\w+?)_cuda_out\b"),
    re.compile(r"\b((?!BinaryFunctor\b|AUnaryFunctor\b|BUnaryFunctor\b|UnaryFunctor\b)\w*Functor\w*)\b"),
    re.compile(r"\b(\w+Ops)\b"),
    re.compile(r"\b(\w+?_functor)\b"),
    re.compile(r"\b(\w*(?:Adam|adam)\w*)\b"),
]
_DETAIL_SKIP = {
    "vectorized_elementwise",
    "unrolled_elementwise",
    "elementwise",
    "reduce",
    "gpu",
    "launch",
    "multi_tensor_apply",
    "index_elementwise",
    "distribution_elementwise_grid_stride",
}


def short_name(name: str) -> str:
    """The function's own name: no return type, namespaces, template or parameter list."""
    text = name.strip()
    if text.startswith("aten::") or "<" not in text and "(" not in text and "::" not in text:
        return text
    text = re.sub(r"^void\s+", "", text)
    depth, cut = 0, len(text)
    for i, ch in enumerate(text):
        if ch in "<(" and depth == 0:
            cut = i
            break
    head = text[:cut]
    return head.rsplit("::", 1)[-1].strip() or text


def _detail(name: str, short: str) -> str | None:
    inner = name[len(name.split("<", 1)[0]) :] if "<" in name else ""
    for pattern in _DETAIL_PATTERNS:
        for match in pattern.finditer(inner):
            token = match.group(1)
            if token and token != short and token not in _DETAIL_SKIP:
                return token
    return None


def label(name: str, short: str | None = None) -> str:
    """A readable name: the short name, plus the computation for generic template kernels."""
    short = short or short_name(name)
    if _GENERIC.match(short):
        detail = _detail(name, short)
        if detail:
            return f"{short}[{detail}]"
    return short


def classify(name: str) -> str:
    """One of CLASSES, from the full (demangled) kernel or operator name."""
    for cls, pattern in _RULES:
        if pattern.search(name):
            return cls
    return "other"
