"""lmperf.kernels."""
