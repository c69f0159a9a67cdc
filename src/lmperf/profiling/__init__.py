"""Profiling: Nsight Systems runs and reports, the torch.profiler fallback, and kernel analysis.

``kernels`` names and classifies kernels, ``phases`` attributes them to NVTX phases by launch time
and summarises them, ``nsys`` runs ``nsys`` and reads its SQLite export, and ``torch_fallback``
captures the same ranges and kernels with ``torch.profiler`` where nsys is missing.
"""
