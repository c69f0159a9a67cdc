"""Kernel classes and names: the classifier on real kernel names (GEMMs apart from fused attention), labels,
and the short names tables show with their legend."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lmperf.profiling import kernels as kn

REPO = Path(__file__).resolve().parents[2]
# fused attention kernels: cuDNN's (from the H100 ladder profile), PyTorch's flash and memory-efficient ones,
# FlashAttention 2 and 3, Triton's tutorial, and the ATen operators that run them on a CPU
ATTENTION = [
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1_kernel0_0",
    "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 128, 64, 4>>(Flash_fwd_params)",
    "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::arch::Sm80>)",
    "void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8>>(Flash_bwd_params)",
    "void cutlass::device_kernel<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2>>>(T1::Params)",
    "_fwd_kernel",
    "_attn_fwd",
    "_bwd_dkdv",
    "_bwd_dq",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_efficient_attention_forward",
]


def test_classifier_on_real_kernel_names_of_the_plain_model():
    rows = [line.rstrip("\n").split("\t", 1) for line in open(REPO / "tests/fixtures/nsys/kernel_classes_h200.tsv")]
    rows = [r for r in rows if len(r) == 2 and not r[0].startswith("#")]
    assert len(rows) > 100 and not [(want, name) for want, name in rows if kn.classify(name) != want]
    assert {want for want, _ in rows} == {
        "matmul",
        "elementwise",
        "reduction",
        "softmax",
        "memory",
        "optimizer",
        "other",
    }


@pytest.mark.parametrize("name", ATTENTION)
def test_fused_attention_kernels_are_attention_not_matmul(name):
    assert kn.classify(name) == "attention"


def test_our_triton_kernels_are_attention_and_lookalikes_are_not():
    source = "".join(p.read_text() for p in (REPO / "src/lmperf/kernels/flash").glob("triton_*.py"))
    ours = re.findall(r"@triton\.jit[^\n]*\ndef (\w+_kernel)\(", source)
    assert len(ours) >= 4 and {kn.classify(name) for name in ours} == {"attention"}
    assert kn.classify("_rms_norm_fwd_kernel") != "attention" and kn.classify("aten::bmm") == "matmul"


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)",
         "Kernel2[cutlass_80_simt_sgemm_256x128_8x4_nn_align1]"),
        ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::exp_kernel_cuda(at::TensorIteratorBase &)"
         "::[lambda() (instance 2)]>(int, T2, T3)", "vectorized_elementwise_kernel[exp]"),
        ("void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::func_wrapper_t<"
         "float, at::native::MaxNanFunctor<float>>, unsigned int, float, (int)4, (int)4>>(T3)",
         "reduce_kernel[MaxNanFunctor]"),
        ("nvjet_sm90_tst_64x64_64x13_4x2_h_bz_TNT", "nvjet_sm90_tst_64x64_64x13_4x2_h_bz_TNT"),
        ("aten::mm", "aten::mm"),
    ],
)  # fmt: skip
def test_labels(name, label):
    assert kn.label(name) == label


def test_short_names_are_distinct_and_each_in_the_legend():
    xmma = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_"
    assert kn.compact_name(xmma + "execute_kernel__5x_cublas") == "xmma gemm f32f32 tn 64x64x8"
    assert kn.compact_name(xmma + "execute_split_k_kernel__5x_cublas") == "xmma gemm f32f32 tn 64x64x8 split-k"
    a, b = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT", "nvjet_sm90_tst_256x128_64x4_1x4_h_bz_coopA_NTT"
    assert (kn.compact_name(a), kn.compact_name(b)) == ("nvjet 256x128x64 1x2 NTT", "nvjet 256x128x64 1x4 NTT")
    legend = kn.legend([a, "elementwise_kernel[MulFunctor]", None])
    assert legend == f"- `nvjet 256x128x64 1x2 NTT`: `{a}`"
    cut = "x" * kn.SHORT_NAME_CHARS
    twins = kn.legend([cut + "_one", cut + "_two"])
    assert f"`{cut}_one` or `{cut}_two` (one short name for these; the table does not tell them apart)" in twins
