"""Compile the FlashAttention-2 kernels for a GPU architecture on a machine without one.

Triton lowers a kernel all the way to PTX and a cubin (ptxas ships in the Triton wheel) without
touching a device, so a CPU machine can check that every kernel and tile config builds for
Hopper, and read off its shared-memory use and whether the loads were software-pipelined.
Arguments are specialised the way the JIT does for real inputs (pointers and strides divisible
by 16), since without that alignment Triton cannot pipeline the loads.

    python -m lmperf.kernels.flash.aot          # every tuning candidate, bf16, causal, d=64

Needs the kernel modules imported compiled (TRITON_INTERPRET unset).
"""

from __future__ import annotations

import argparse
import time

import triton

_POINTERS = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}
_FP32_POINTERS = {"L", "Delta"}
_FLOATS = {"qk_scale", "sm_scale"}
_CONSTEXPRS = {
    "HEAD_DIM",
    "BLOCK_D",
    "IS_CAUSAL",
    "BLOCK_M",
    "BLOCK_N",
    "PRECISION",
    "WARP_SPECIALIZE",
    "USE_TMA",
    "DP_FIRST",
    "BATCH_FIRST",
}


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


def main(argv=None):
    from .triton_backward import flash_bwd_dkdv_kernel, flash_bwd_dq_kernel
    from .triton_common import INTERPRETED, block_d, dot_precision
    from .triton_forward import flash_fwd_kernel
    from .tuning import candidates

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--arch", type=int, default=90)
    args = parser.parse_args(argv)
    if INTERPRETED:
        raise SystemExit("unset TRITON_INTERPRET: the interpreter's kernels cannot be compiled")
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    for name, kernel in (("fwd", flash_fwd_kernel), ("dkdv", flash_bwd_dkdv_kernel), ("dq", flash_bwd_dq_kernel)):
        for config in candidates(name, args.head_dim, dtype):
            config = dict(config)
            warps, stages = config.pop("num_warps"), config.pop("num_stages")
            config.setdefault("USE_TMA", False)
            if name == "fwd":
                config.setdefault("WARP_SPECIALIZE", False)
            if name == "dkdv":
                config.setdefault("DP_FIRST", False)
            else:
                config.setdefault("BATCH_FIRST", False)
            start = time.perf_counter()
            try:
                compiled = compile_kernel(
                    kernel,
                    args.dtype,
                    dict(
                        HEAD_DIM=args.head_dim,
                        BLOCK_D=block_d(args.head_dim),
                        IS_CAUSAL=True,
                        PRECISION=dot_precision(dtype),
                        **config,
                    ),
                    warps,
                    stages,
                    args.arch,
                )
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"{name:5s} {config} w{warps} s{stages}: FAILED {type(exc).__name__}: {exc}"[:300], flush=True)
                continue
            print(
                f"{name:5s} {config} w{warps} s{stages}: shared {compiled.metadata.shared} B, "
                f"{pipelined_loads(compiled)} async copies, {time.perf_counter() - start:.1f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
