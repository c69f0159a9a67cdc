"""Dense peak rates per device slug (pure: no torch), read by cells for MFU and by reports.

TFLOP/s, and memory bandwidth in GB/s. "fp32" is the CUDA-core rate (PyTorch's default: TF32 off for
matmuls); "tf32"/"bf16"/"fp16" dense tensor-core rates; "fp8" the dense FP8 rate, half the datasheets'
"with sparsity" 3,958. The A100 has no FP8.
"""

_HOPPER = dict(fp32=66.9, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9)
_AMPERE = dict(fp32=19.5, tf32=156.0, bf16=312.0, fp16=312.0)
PEAKS: dict[str, dict] = {
    "h100": dict(_HOPPER, hbm_gbps=3350, source="NVIDIA H100 Tensor Core GPU datasheet (SXM5), dense rates"),
    "h200": dict(_HOPPER, hbm_gbps=4800, source="NVIDIA H200 Tensor Core GPU datasheet (SXM), dense rates"),
    "a100": dict(_AMPERE, hbm_gbps=2039, source="NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB), dense rates"),
}
