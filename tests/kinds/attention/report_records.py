"""Synthetic attention records for the report's tests: schema-valid, memory from the accounting."""

from __future__ import annotations

from lmperf.core.record import make_record
from lmperf.kinds.attention import memory_model as memory

MIB = 2**20
H100_TOTAL_MIB = 81_079.0  # get_device_properties of an H100 80GB HBM3, as the records hold it
BATCH = 8
OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 32.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which 14.32 GiB "
    "is free. Of the allocated memory 64.13 GiB is allocated by PyTorch, and 1024.00 KiB is reserved by PyTorch "
    "but unallocated."
)


def provenance(device: str = "h100", **settings) -> dict:
    return {
        "device_slug": device,
        "device_name": "NVIDIA H100 80GB HBM3" if device != "cpu" else "x86_64",
        "torch_version": "2.11.0",
        "git_commit": "67290d6c7cd9604ba97b7e3d857fa5cdf742956f",
        "git_dirty": False,
        "start_time": "2026-11-26T16:11:29+00:00",
        "matmul_allow_tf32": False,
        "code_version": "938f54fc80582c83",
        "settings": {
            "batch_size": BATCH,
            "precision": "fp32",
            "warmup_passes": 5,
            "measured_passes": 100,
            "min_measured_passes": 2,
            "max_phase_seconds": 1.5,
            "full_passes_up_to": 16384,
            "compile_dynamic": True,
            **settings,
        },
    }


def kept_bytes(impl: str, shape: memory.Shape, n2: float | None = None) -> float:
    """What the forward keeps: the accounting's for plain and fused kernels, else n2 matrices plus O."""
    if n2 is None and impl in ("plain", *memory.FUSED_IMPLEMENTATIONS):
        return memory.accounting(impl, shape).retained_bytes
    return (2 if n2 is None else n2) * shape.matrix_bytes + shape.vector_bytes


def _memory_metrics(impl: str, shape: memory.Shape, device: str, held_mib: float, n2, kept_scale: float) -> dict:
    kept = kept_bytes(impl, shape, n2) * kept_scale / MIB
    own = memory.accounting(impl, shape)
    plain = memory.plain_accounting(shape)
    metrics = {
        "retained_tensors_mib": kept,
        "n2_matrix_mib": shape.matrix_bytes / MIB,
        "predicted_retained_mib": own.retained_bytes / MIB if own else None,
        "predicted_before_backward_mib": own.before_backward_bytes / MIB if own else None,
        "plain_predicted_retained_mib": plain.retained_bytes / MIB,
        "plain_predicted_before_backward_mib": plain.before_backward_bytes / MIB,
    }
    if device != "cpu":
        inputs = 4 * shape.vector_bytes / MIB
        metrics.update(
            device_total_memory_mib=H100_TOTAL_MIB,
            baseline_allocated_mib=inputs + held_mib,
            retained_by_forward_mib=kept,
            memory_before_backward_mib=inputs + held_mib + kept,
        )
    return metrics


def _timing(phase: str, ms: float | None, interval, trials: int) -> dict:
    if ms is None:
        return {}
    out = {f"{phase}_ms_mean": ms, f"{phase}_ms_std": ms / 100, f"{phase}_n": 100}
    if interval is not None:
        out[f"{phase}_ms_mean_interval"] = list(interval)
    return out


def record(
    impl: str,
    d: int,
    n: int,
    status: str = "ok",
    *,
    fwd: float | None = 1.0,
    bwd: float | None = 2.0,
    fwd_interval=None,
    bwd_interval=None,
    trials: int = 1,
    device: str = "h100",
    held_mib: float = 64.0,
    n2: float | None = None,
    kept_scale: float = 1.0,
    memory_measured: bool = True,
    settings: dict | None = None,
    **extra,
) -> dict:
    """One attention record; an `oom` record keeps only what `extra` and the timings given say."""
    shape = memory.Shape(BATCH, n, d, 4)
    metrics = {"first_forward_ms": 900.0 if impl == "compiled" else 1.0}
    if memory_measured:
        metrics.update(_memory_metrics(impl, shape, device, held_mib, n2, kept_scale))
    else:
        plain = memory.plain_accounting(shape)
        metrics.update(
            n2_matrix_mib=shape.matrix_bytes / MIB,
            plain_predicted_retained_mib=plain.retained_bytes / MIB,
            predicted_before_backward_mib=plain.before_backward_bytes / MIB if impl == "plain" else None,
            device_total_memory_mib=H100_TOTAL_MIB if device != "cpu" else None,
        )
    metrics.update(_timing("forward", fwd, fwd_interval, trials))
    metrics.update(_timing("backward", bwd, bwd_interval, trials))
    if trials > 1:
        metrics["trials"] = [{"start_time": f"t{i}"} for i in range(trials)]
    metrics.update(extra)
    cell = {"implementation": impl, "head_dim": d, "sequence_length": n, "batch_size": BATCH, "precision": "fp32"}
    reason = {"ok": None, "oom": "out of memory", "unsupported": f"{impl}: cannot run here"}[status]
    prov = provenance(device, implementation=impl, **(settings or {}))
    return make_record("attention", cell, status, metrics if status != "unsupported" else {}, prov, reason)


def plain_oom(d: int, n: int, phase: str = "forward warm-up", **extra) -> dict:
    """Plain attention out of memory before any pass was timed, with the allocator's numbers."""
    return record(
        "plain",
        d,
        n,
        "oom",
        fwd=None,
        bwd=None,
        memory_measured=False,
        oom_phase=phase,
        oom_message=OOM_MESSAGE,
        oom_requested_mib=32768.0,
        oom_allocated_by_pytorch_mib=65669.12,
        oom_free_mib=14663.68,
        **extra,
    )
