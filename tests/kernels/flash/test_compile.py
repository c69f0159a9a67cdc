"""The Triton kernels build for Hopper (sm_90) on a machine without a GPU.

The interpreter accepts code that the compiler rejects (a plain Python global inside a kernel, a
float64 scale argument as torch.compile passes it), so each kernel is compiled ahead of time once,
in a subprocess where TRITON_INTERPRET is unset: every kernel, each kind of product (IEEE, TF32,
3xTF32), pointer and TMA loads, and the software pipelining of the loads. With CUDA the real tests
compile them all.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="GPU tests compile for real")

SCRIPT = textwrap.dedent("""
    import triton
    from tests.kernels.flash.aot import compile_kernel, pipelined_loads
    from lmperf.kernels.flash.triton_backward import flash_bwd_delta_kernel, flash_bwd_dkdv_kernel, flash_bwd_dq_kernel
    from lmperf.kernels.flash.triton_forward import flash_fwd_kernel

    def c(head_dim, causal=True, precision="ieee", **tiles):
        return dict(HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), IS_CAUSAL=causal,
                    PRECISION=precision, **tiles)

    cases = [  # (kernel, dtype, constexprs, stages: > 1 asks for pipelined loads, 0 for TMA's)
        (flash_fwd_kernel, "bf16", c(80, BLOCK_M=128, BLOCK_N=64, WARP_SPECIALIZE=False, USE_TMA=False), 3),
        (flash_fwd_kernel, "fp32", c(48, False, "tf32", BLOCK_M=64, BLOCK_N=32, WARP_SPECIALIZE=False, USE_TMA=False), 2),
        (flash_fwd_kernel, "fp32", c(128, True, "tf32x3", BLOCK_M=32, BLOCK_N=32, WARP_SPECIALIZE=False, USE_TMA=False), 0),
        (flash_bwd_dkdv_kernel, "bf16", c(64, BLOCK_M=64, BLOCK_N=64, USE_TMA=True, DP_FIRST=True), 0),
        (flash_bwd_dq_kernel, "bf16", c(64, BLOCK_M=128, BLOCK_N=32, USE_TMA=False), 3),
        (flash_bwd_delta_kernel, "fp16", dict(HEAD_DIM=160, BLOCK_D=256, BLOCK_M=64), 1),
    ]
    for kernel, dtype, constexprs, stages in cases:
        compiled = compile_kernel(kernel, dtype, constexprs, 4, stages or 3, float_type="fp64")
        if stages > 1 and pipelined_loads(compiled) == 0:
            raise SystemExit(f"{kernel.__name__} {constexprs}: loads not pipelined")
    print("ok")
""")


def test_the_kernels_compile_for_sm90():
    pytest.importorskip("triton")
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except ImportError:
        pytest.skip("this Triton build has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    repo = os.path.join(os.path.dirname(__file__), "..", "..", "..")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(repo, "src"), repo, env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-4000:]
