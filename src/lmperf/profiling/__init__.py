"""Profiling: Nsight Systems runs (``nsys``), the torch.profiler fallback, kernels named and classified
(``kernels``) and attributed to NVTX phases (``phases``)."""
