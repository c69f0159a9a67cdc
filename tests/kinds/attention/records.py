"""Synthetic attention records for the report's tests: schema-valid, memory from the accounting."""

from __future__ import annotations

from lmperf.core.record import make_record
from lmperf.kinds.attention import memory_model as memory
from tests.kinds.records import provenance

MIB = 2**20
H100_MIB = 81_079.0  # get_device_properties of an H100 80GB HBM3, as the records hold it
OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 32.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which 14.32 GiB "
    "is free. Of the allocated memory 64.13 GiB is allocated by PyTorch, and 1024.00 KiB is reserved by PyTorch "
    "but unallocated."
)
SETTINGS = {"batch_size": 8, "precision": "fp32", "warmup_passes": 5, "measured_passes": 100}
SETTINGS |= {"min_measured_passes": 2, "max_phase_seconds": 1.5, "full_passes_up_to": 16384, "compile_dynamic": True}


def record(impl, d, n, status="ok", *, fwd=1.0, bwd=2.0, fwd_interval=None, trials=1, device="h100", n2=None, **extra):
    """One record; what the forward keeps is the accounting's for plain and fused kernels, else ``n2``
    (default 2) N×N matrices plus O; ``n2=False``: not measured (out of memory before it)."""
    shape = memory.Shape(8, n, d, 4)
    own, plain = memory.accounting(impl, shape), memory.plain_accounting(shape)
    metrics = {"first_forward_ms": 900.0 if impl == "compiled" else 1.0, "n2_matrix_mib": shape.matrix_bytes / MIB}
    metrics |= {"plain_predicted_retained_mib": plain.retained_bytes / MIB}
    metrics |= {"predicted_retained_mib": own and own.retained_bytes / MIB}
    metrics |= {"predicted_before_backward_mib": own and own.before_backward_bytes / MIB}
    if n2 is not False:
        kept = own.retained_bytes if own and n2 is None else (n2 or 2) * shape.matrix_bytes + shape.vector_bytes
        metrics["retained_tensors_mib"] = kept / MIB
        metrics |= {"retained_by_forward_mib": kept / MIB} if device != "cpu" else {}
    metrics |= {"device_total_memory_mib": H100_MIB} if device != "cpu" else {}
    for phase, ms in (("forward", fwd), ("backward", bwd)):
        metrics |= {f"{phase}_ms_mean": ms, f"{phase}_n": 100} if ms is not None else {}
    metrics |= {"forward_ms_mean_interval": list(fwd_interval)} if fwd_interval else {}
    metrics |= {"trials": [{"start_time": f"t{i}"} for i in range(trials)]} if trials > 1 else {}
    cell = {"implementation": impl, "head_dim": d, "sequence_length": n, "batch_size": 8, "precision": "fp32"}
    reason = {"ok": None, "oom": "out of memory", "unsupported": f"{impl}: cannot run here"}[status]
    settings = {**SETTINGS, "implementation": impl}
    prov = provenance(device, device.upper(), code_version="938f54fc80582c83", settings=settings)
    return make_record("attention", cell, status, {**metrics, **extra} if status != "unsupported" else {}, prov, reason)


def plain_oom(d: int, n: int, phase: str = "forward warm-up", **extra) -> dict:
    """Plain attention out of memory before any pass was timed, with the allocator's numbers."""
    said = {"oom_phase": phase, "oom_message": OOM_MESSAGE, "oom_requested_mib": 32768.0}
    said |= {"oom_allocated_by_pytorch_mib": 65669.12, "oom_free_mib": 14663.68}
    return record("plain", d, n, "oom", fwd=None, bwd=None, n2=False, **said | extra)
