"""Kernel names: a short name, a readable label (the short name and the functor or inner kernel that
says what it computes) and a class from the full name: ``matmul`` (GEMMs only), ``attention`` (fused
attention kernels), elementwise, …; ATen operators (the CPU fallback's "kernels") alike.
"""

from __future__ import annotations

import re

# Classes in the order the report draws them.
CLASSES = ("matmul", "attention", "softmax", "reduction", "elementwise", "memory", "optimizer", "other")

# First match wins: the specific patterns come before the generic ones (a multi-tensor AdamW kernel is
# an optimizer kernel; cuDNN's `…sdpa_sm90_flash_fprop_wgmma…` and PyTorch's `fmha_cutlassF…` are
# attention, not the GEMMs their names also suggest; a cuBLAS split-K "reduce" kernel is a matmul).
_PATTERNS = {
    "optimizer": r"multi_tensor_apply|fused_adam|adamw?_|aten::_fused_adam|aten::_foreach_",
    # cuDNN (`cudnn_generated_fort_native_sdpa_…`), PyTorch's mem-efficient (`fmha_cutlassF_…`) and flash
    # (`pytorch_flash::flash_fwd_kernel`) kernels, FlashAttention 2 and 3, ours (lmperf.kernels.flash:
    # `flash_fwd_kernel`, `flash_bwd_…`), Triton's tutorial (`_attn_fwd`, `_bwd_dkdv`, …), and their ATen ops
    "attention": r"fmha|sdpa|scaled_dot_product|flash_(fwd|bwd)|FlashAttn|flash_attention|efficient_attention|"
    r"(?<![A-Za-z0-9])_(attn_fwd|attn_bwd|fwd_kernel|bwd_kernel|bwd_dkdv|bwd_dq|bwd_preprocess)",
    "matmul": r"gemm|cutlass|xmma|cublas|nvjet|wgmma|splitkreduce|\bsm(70|75|80|86|89|90|100)_|gemv|"
    r"aten::(mm|bmm|addmm|baddbmm|addbmm|matmul|linear|_scaled_mm)\b",
    # PyTorch's fused (log-)softmax, e.g. cross-entropy's. The course's softmax is written out (max,
    # subtract, exp, sum, divide): reduction and elementwise kernels, found by its NVTX range instead.
    "softmax": r"softmax",
    "reduction": r"reduce_kernel|reduction|\breduce|aten::(sum|amax|amin|max|min|mean|norm|var|std|argmax|logsumexp)\b",
    "memory": r"direct_copy|copy_kernel|FillFunctor|(?<!masked_)fill_kernel|memset|memcpy|\bcat\w*kernel|CatArray|"
    r"aten::(copy_|fill_|zero_|zeros|empty\w*|cat|clone|contiguous|to|_to_copy|as_strided|view|"
    r"reshape|transpose|t|expand|permute|slice|select|unsqueeze|flatten|detach|resolve_conj|ones_like|"
    r"zeros_like|empty_like|stack)\b",
    "elementwise": r"elementwise|pointwise|triton_poi|aten::(add|add_|sub|mul|mul_|div|div_|exp|pow|sqrt|rsqrt|silu|"
    r"neg|masked_fill|masked_fill_|where|lt|gt|ge|le|eq|ne|sigmoid|cos|sin|rsub|reciprocal|"
    r"addcmul_|addcdiv_|lerp_|sqrt_|threshold_backward|silu_backward|clamp_min)\b",
}
_RULES = [(name, re.compile(pattern, re.I)) for name, pattern in _PATTERNS.items()]

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
_DETAIL_SKIP = {"vectorized_elementwise", "unrolled_elementwise", "elementwise", "reduce", "gpu", "launch"}
_DETAIL_SKIP |= {"multi_tensor_apply", "index_elementwise", "distribution_elementwise_grid_stride"}


def short_name(name: str) -> str:
    """The function's own name: no return type, namespaces, template or parameter list."""
    text = name.strip()
    if text.startswith("aten::") or "<" not in text and "(" not in text and "::" not in text:
        return text
    text = re.sub(r"^void\s+", "", text)
    cut = next((i for i, ch in enumerate(text) if ch in "<("), len(text))
    return text[:cut].rsplit("::", 1)[-1].strip() or text


def label(name: str, short: str | None = None) -> str:
    """A readable name: the short name, plus the computation for generic template kernels."""
    short = short or short_name(name)
    if _GENERIC.match(short) and "<" in name:
        inner = name[len(name.split("<", 1)[0]) :]
        for pattern in _DETAIL_PATTERNS:
            for match in pattern.finditer(inner):
                token = match.group(1)
                if token and token != short and token not in _DETAIL_SKIP:
                    return f"{short}[{token}]"
    return short


def classify(name: str) -> str:
    """One of CLASSES, from the full (demangled) kernel or operator name."""
    return next((cls for cls, pattern in _RULES if pattern.search(name)), "other")


# Short names for tables: cuBLAS and CUTLASS name their GEMMs with whole templates; a table shows
# 'xmma gemm f32f32 tn 128x128x8' and a legend under it the full name.
SHORT_NAME_CHARS = 48  # longer names are cut in tables; the legend gives them in full
# cuBLAS's Hopper GEMMs: nvjet_sm90_tst_<tile MxN>_<K>x<stages>_<cluster>_<h|v>_bz[_coopA|_coopB]_<layouts>
_NVJET = re.compile(r"nvjet_sm\d+_\w+?_(\d+x\d+)_(\d+)x\d+_(\d+x\d+)_[hv]_\w+?_([NT]{3})\b")
_XMMA = re.compile(r"xmma_gemm_(\w+?)_(tn|nt|nn|tt)_n_tilesize(\d+x\d+x\d+)")
_CUTLASS = re.compile(r"cutlass_\d+_(\w+?gemm)_(\d+x\d+)_\w*?_(nn|nt|tn|tt)")


def compact_name(label):
    """'xmma gemm f32f32 tn 128x128x8' (and '… split-k'), 'nvjet 256x128x64 1x2 NTT' (tile M×N×K, cluster,
    layouts), 'cutlass simt_sgemm 128x128 nt'; other names longer than SHORT_NAME_CHARS cut with '…'."""
    if not isinstance(label, str):
        return label
    if m := _XMMA.search(label):
        return f"xmma gemm {m.group(1).split('_')[0]} {m.group(2)} {m.group(3)}" + " split-k" * ("split_k" in label)
    if m := _NVJET.search(label):
        return f"nvjet {m.group(1)}x{m.group(2)} {m.group(3)} {m.group(4)}"
    if m := _CUTLASS.search(label):
        return f"cutlass {m.group(1)} {m.group(2)} {m.group(3)}"
    return label if len(label) <= SHORT_NAME_CHARS else label[: SHORT_NAME_CHARS - 1] + "…"


def legend(labels) -> str:
    """The full name of every name a table shows shortened, as a markdown list ('' when none is); two names
    that shorten alike are both listed, never merged silently."""
    full: dict[str, set[str]] = {}
    for x in labels:
        if isinstance(x, str) and compact_name(x) != x:
            full.setdefault(compact_name(x), set()).add(x)
    twins = " (one short name for these; the table does not tell them apart)"
    return "\n".join(
        f"- `{name}`: " + " or ".join(f"`{f}`" for f in sorted(fs)) + twins * (len(fs) > 1)
        for name, fs in sorted(full.items())
    )
