"""Synthetic nsys and e2e records for the report's tests: schema-valid (lmperf.core.record.make_record),
with only the metrics the report reads. Times in ms per step; a phase's kernels are one per class unless
``top`` names them."""

from __future__ import annotations

from lmperf.core.record import make_record

FP32_MS = {"matmul": 8.0, "elementwise": 1.5, "reduction": 0.3, "memory": 0.2}
BF16_MS = {"matmul": 0.8, "elementwise": 1.7, "reduction": 0.3, "memory": 1.2}
TRAIN_MS = {"matmul": 24.0, "elementwise": 5.0, "reduction": 0.8, "memory": 0.7, "optimizer": 3.0}


def provenance(device: str = "h100") -> dict:
    return {
        "device_slug": device,
        "device_name": "CPU" if device == "cpu" else "NVIDIA H100 80GB HBM3",
        "torch_version": "2.11.0",
        "git_commit": "0123456789abcdef0123456789abcdef01234567",
        "git_dirty": False,
        "start_time": "2026-01-01T00:00:00+00:00",
        "settings": {"batch_size": 4},
    }


def phase(class_ms: dict, top: list[tuple[str, str, float]] | None = None, launches: float = 700.0) -> dict:
    """A phase summary; ``top``: (label, class, ms) of its top kernels, else one kernel per class."""
    total = sum(class_ms.values())
    kernels = top or [(f"{cls}_kernel", cls, ms) for cls, ms in sorted(class_ms.items(), key=lambda kv: -kv[1])]
    return {
        "kernel_ms_per_step": total,
        "launches_per_step": launches,
        "class_ms_per_step": class_ms,
        "class_share": {cls: ms / total for cls, ms in class_ms.items()},
        "matmul_share": class_ms.get("matmul", 0.0) / total,
        "top_kernels": [
            {
                "name": label,
                "label": label,
                "class": cls,
                "launches_per_step": 72.0,
                "ms_per_step": ms,
                "share": ms / total,
            }
            for label, cls, ms in kernels
        ],
    }


def attention(
    scores_matmul: float = 0.2, softmax: float = 0.25, final_matmul: float = 0.2, flops: float = 1e10
) -> dict:
    """The three attention ranges; the softmax does 5 FLOPs per score against 2·d per matmul (d = 64)."""

    def one(ms: float, matmul: float, fl: float) -> dict:
        return {"kernel_ms_per_step": ms, "matmul_ms_per_step": matmul, "flops_per_step": fl}

    return {
        "ranges": {
            "computing attention scores": one(scores_matmul * 2, scores_matmul, flops),
            "computing softmax": one(softmax, 0.0, flops * 5 / 128),
            "final matmul": one(final_matmul, final_matmul, flops),
        }
    }


def common(profiler: str, nvtx: tuple[list[float], list[float]] | None) -> dict:
    metrics = {"profiler": profiler, "profiler_version": "2025.3", "warmup_steps": 2, "measured_steps": 2}
    if nvtx:
        off, on = nvtx
        metrics["nvtx_overhead"] = {
            "status": "ok",
            "context_length": 128,
            "nvtx_disabled_forward_ms_samples": off,
            "nvtx_enabled_forward_ms_samples": on,
        }
    return metrics


def inference(
    model: str = "small",
    ctx: int = 128,
    precision: str = "fp32",
    class_ms: dict | None = None,
    top: list | None = None,
    range_ms: float | None = None,
    timer_ms: float | None = None,
    att: dict | None = None,
    nvtx: tuple[list[float], list[float]] | None = None,
    device: str = "h100",
    profiler: str = "nsys",
) -> dict:
    """An inference record; the range defaults to the kernel time / 0.95, the timer to the range."""
    fwd = phase(class_ms or (BF16_MS if precision == "bf16" else FP32_MS), top)
    range_ms = range_ms or fwd["kernel_ms_per_step"] / 0.95
    timer_ms = timer_ms or range_ms
    metrics = common(profiler, nvtx) | {
        "inference_forward_ms_mean": timer_ms,
        "phases": {"inference_forward": fwd},
        "attention": att or attention(),
        "forward_cross_check": {
            "timer_ms_mean": timer_ms,
            "nvtx_range_ms_mean": range_ms,
            "kernel_ms_per_step": fwd["kernel_ms_per_step"],
        },
    }
    cell = {"model": model, "context_length": ctx, "precision": precision, "mode": "inference"}
    return make_record("nsys", cell, "ok", metrics, provenance(device))


def training(
    model: str = "small",
    ctx: int = 128,
    precision: str = "fp32",
    class_ms: dict | None = None,
    fb_top: list | None = None,
    device: str = "h100",
    profiler: str = "nsys",
    status: str = "ok",
) -> dict:
    """A training record: forward a third of the step's non-optimizer kernel time, backward the rest."""
    cell = {"model": model, "context_length": ctx, "precision": precision, "mode": "training"}
    if status != "ok":
        return make_record("nsys", cell, status, common(profiler, None), provenance(device), "out of memory")
    step_ms = class_ms or TRAIN_MS
    fb_ms = {c: ms for c, ms in step_ms.items() if c != "optimizer"}
    fwd_ms = {c: ms / 3 for c, ms in fb_ms.items()}
    optimizer_ms = step_ms.get("optimizer", 0.0)
    forward_range = sum(fwd_ms.values()) / 0.95
    metrics = common(profiler, None) | {
        "forward_ms_mean": forward_range,
        "phases": {
            "forward": phase(fwd_ms),
            "backward": phase({c: 2 * ms for c, ms in fwd_ms.items()}),
            "optimizer_step": {"kernel_ms_per_step": optimizer_ms},
            "forward_backward": phase(fb_ms, fb_top),
            "training_step": phase(step_ms, launches=2100.0),
        },
        "forward_cross_check": {
            "timer_ms_mean": forward_range,
            "nvtx_range_ms_mean": forward_range,
            "kernel_ms_per_step": sum(fwd_ms.values()),
        },
    }
    return make_record("nsys", cell, "ok", metrics, provenance(device))


def e2e(model: str = "small", ctx: int = 128, forward_ms: float = 10.0, interval: list[float] | None = None) -> dict:
    """An eager fp32 end-to-end record: its inference forward (with an interval over trials where given)."""
    metrics: dict = {"inference_forward_ms_mean": forward_ms, "forward_ms_mean": forward_ms}
    if interval:
        metrics["inference_forward_ms_mean_interval"] = interval
        metrics["trials"] = [{"samples": [forward_ms]} for _ in range(3)]
    cell = {"model": model, "context_length": ctx, "precision": "fp32", "compile": "eager", "warmup_steps": 5}
    return make_record("e2e", cell, "ok", metrics, provenance())
