"""Dense peak rates per device slug (pure: no torch), read by cells for MFU and by reports."""

# Dense peak rates per device slug, in TFLOP/s, and memory bandwidth in GB/s.
# "fp32" is the CUDA-core rate (PyTorch's default: TF32 off for matmuls); "tf32"/"bf16" are
# dense tensor-core rates (no sparsity).
PEAKS: dict[str, dict] = {
    "h100": dict(
        fp32=66.9,
        tf32=494.7,
        bf16=989.4,
        fp16=989.4,
        hbm_gbps=3350,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5), dense rates",
    ),
    "h200": dict(
        fp32=66.9,
        tf32=494.7,
        bf16=989.4,
        fp16=989.4,
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
