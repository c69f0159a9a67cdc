"""Dense peak rates per device slug (pure: no torch), read by cells for MFU and by reports."""

# Dense peak rates per device slug, in TFLOP/s, and memory bandwidth in GB/s.
# "fp32" is the CUDA-core rate (PyTorch's default: TF32 off for matmuls); "tf32"/"bf16" are
# dense tensor-core rates (no sparsity). "fp8": dense FP8 (e4m3/e5m2) tensor-core rate, half of
# the datasheet's "with sparsity" figure: H100 SXM5 3,958 -> 1,978.9; H200 SXM 3,958 -> 1,978.9
# (NVIDIA H100 and H200 Tensor Core GPU datasheets, "FP8 Tensor Core"). The A100 has no FP8.
PEAKS: dict[str, dict] = {
    "h100": dict(
        fp32=66.9,
        tf32=494.7,
        bf16=989.4,
        fp16=989.4,
        fp8=1978.9,
        hbm_gbps=3350,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5), dense rates",
    ),
    "h200": dict(
        fp32=66.9,
        tf32=494.7,
        bf16=989.4,
        fp16=989.4,
        fp8=1978.9,
        hbm_gbps=4800,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM), dense rates",
    ),
    "a100": dict(
        fp32=19.5,
        tf32=156.0,
        bf16=312.0,
        fp16=312.0,
        hbm_gbps=2039,
        source="NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB), dense rates",
    ),
}
