"""Compile the FlashAttention-2 kernels for a GPU architecture on a machine without one (test_compile).

Triton lowers a kernel to PTX and a cubin without a device, so a CPU machine can check that every
kernel builds for Hopper and whether its loads were software-pipelined. Arguments are specialised as
the JIT does for real inputs (pointers and strides divisible by 16): without that alignment Triton
cannot pipeline the loads. Needs the kernel modules imported compiled (TRITON_INTERPRET unset).
"""

from __future__ import annotations

import triton

_POINTERS = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}
_FP32_POINTERS = {"L", "Delta"}
_FLOATS = {"qk_scale", "sm_scale"}
_CONSTEXPRS = set(
    "HEAD_DIM BLOCK_D IS_CAUSAL BLOCK_M BLOCK_N PRECISION WARP_SPECIALIZE USE_TMA DP_FIRST BATCH_FIRST".split()
)


def compile_kernel(
    kernel,
    dtype: str,
    constexprs: dict,
    num_warps: int = 4,
    num_stages: int = 2,
    arch: int = 90,
    float_type: str = "fp32",
):
    """Compile `kernel` (a plain triton.jit function) for sm_`arch`; dtype is "bf16", "fp16"
    or "fp32"; float_type the type of the scale arguments ("fp64" as torch.compile may pass)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in _CONSTEXPRS:
            signature[name] = "constexpr"
        elif name in _POINTERS:
            signature[name] = f"*{dtype}"
        elif name in _FP32_POINTERS:
            signature[name] = "*fp32"
        elif name in _FLOATS:
            signature[name] = float_type
        else:
            signature[name] = "i32"
        if signature[name] != "constexpr" and name not in _FLOATS:
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(
        source, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=num_warps, num_stages=num_stages)
    )


def pipelined_loads(compiled) -> int:
    """How many cp.async copies the software pipeliner emitted (0: loads not pipelined)."""
    return compiled.asm["ttgir"].count("async_copy_global_to_local")
