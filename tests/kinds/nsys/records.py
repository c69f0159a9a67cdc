"""Synthetic nsys and e2e records for the report's tests: schema-valid, with only the metrics the report
reads. Times in ms per step; a phase's kernels are one per class (``<class>_kernel``) unless ``top`` names them."""

from __future__ import annotations

from lmperf.core.record import make_record
from tests.kinds import records

FP32_MS = {"matmul": 8.0, "elementwise": 1.5, "reduction": 0.3, "memory": 0.2}
TRAIN_MS = {"matmul": 24.0, "elementwise": 5.0, "reduction": 0.8, "memory": 0.7, "optimizer": 3.0}


def provenance(device: str = "h100") -> dict:
    return records.provenance(device, "CPU" if device == "cpu" else records.H100, settings={"batch_size": 4})


def phase(class_ms: dict, top: list | None = None, range_ms: float | None = None, launches: float = 700.0) -> dict:
    """A phase summary; ``top``: (label, class, ms) of its top kernels, else one kernel per class."""
    total = sum(class_ms.values())
    kernels = top or [(f"{cls}_kernel", cls, ms) for cls, ms in sorted(class_ms.items(), key=lambda kv: -kv[1])]
    return {
        "kernel_ms_per_step": total,
        "range_ms_mean": range_ms or total / 0.95,
        "launches_per_step": launches,
        "class_ms_per_step": class_ms,
        "class_share": {cls: ms / total for cls, ms in class_ms.items()},
        "matmul_share": class_ms.get("matmul", 0.0) / total,
        "top_kernels": [
            {"name": n, "label": n, "class": c, "launches_per_step": 72.0, "ms_per_step": ms, "share": ms / total}
            for n, c, ms in kernels
        ],
    }


def attention(scores: float = 0.2, softmax: float = 0.25, final: float = 0.2, flops: float = 1e10) -> dict:
    """The three attention ranges: the matmuls' kernel time, the softmax's; 5 FLOPs per score against 2·d = 128."""

    def one(ms: float, matmul: float, fl: float) -> dict:
        return {"kernel_ms_per_step": ms, "matmul_ms_per_step": matmul, "flops_per_step": fl}

    names = ("computing attention scores", "computing softmax", "final matmul")
    return {
        "ranges": dict(
            zip(names, (one(scores, scores, flops), one(softmax, 0.0, flops * 5 / 128), one(final, final, flops)))
        )
    }


def common(profiler: str) -> dict:
    return {"profiler": profiler, "profiler_version": "2025.3", "warmup_steps": 2, "measured_steps": 2}


def inference(model="small", ctx=128, precision="fp32", class_ms=None, top=None, range_ms=None, timer_ms=None,
              att=None, device="h100", profiler="nsys") -> dict:  # fmt: skip
    """An inference record; the range defaults to the kernel time / 0.95, the timer to the range."""
    fwd = phase(class_ms or FP32_MS, top, range_ms)
    metrics = common(profiler) | {
        "inference_forward_ms_mean": timer_ms or fwd["range_ms_mean"],
        "phases": {"inference_forward": fwd},
        "attention": att or attention(),
    }
    cell = {"model": model, "context_length": ctx, "precision": precision, "mode": "inference"}
    return make_record("nsys", cell, "ok", metrics, provenance(device))


def training(model="small", ctx=128, precision="fp32", class_ms=None, fb_top=None, device="h100",
             profiler="nsys", status="ok") -> dict:  # fmt: skip
    """A training record: forward a third of the step's non-optimizer kernel time, backward the rest."""
    cell = {"model": model, "context_length": ctx, "precision": precision, "mode": "training"}
    if status != "ok":
        return make_record("nsys", cell, status, common(profiler), provenance(device), "out of memory")
    step_ms = class_ms or TRAIN_MS
    fwd_ms = {c: ms / 3 for c, ms in step_ms.items() if c != "optimizer"}
    phases = {
        "forward": phase(fwd_ms),
        "backward": phase({c: 2 * ms for c, ms in fwd_ms.items()}),
        "optimizer_step": {"kernel_ms_per_step": step_ms.get("optimizer", 0.0)},
        "forward_backward": phase({c: 3 * ms for c, ms in fwd_ms.items()}, fb_top),
        "training_step": phase(step_ms, launches=2100.0),
    }
    return make_record("nsys", cell, "ok", common(profiler) | {"phases": phases}, provenance(device))


def e2e(model="small", ctx=128, forward_ms=10.0, interval=None, warmup=5) -> dict:
    """An eager fp32 end-to-end record: its inference forward (with an interval over trials where given)."""
    metrics: dict = {"inference_forward_ms_mean": forward_ms}
    if interval:
        metrics |= {"inference_forward_ms_mean_interval": interval, "trials": [{"samples": [forward_ms]}] * 3}
    cell = {"model": model, "context_length": ctx, "precision": "fp32", "compile": "eager", "warmup_steps": warmup}
    return make_record("e2e", cell, "ok", metrics, provenance())
