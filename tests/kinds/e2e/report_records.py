"""Synthetic e2e and e2e_compile records for the report's tests: valid records (``make_record``) whose
times, spreads, intervals and GPU busy shares the test chooses."""

from __future__ import annotations

from lmperf.core.record import make_record
from tests.kinds.records import provenance

PROVENANCE = provenance(start_time="2026-11-26T10:00:00+00:00")


def e2e(model: str = "small", ctx: int = 128, precision: str = "fp32", compile: str = "eager", warmup: int = 5, *,
        forward: float = 10.0, cv: float = 0.01, width: float | None = None, training: str = "ok",
        attention: str = "plain", busy: float | None = None, device: str = "h100",
        metrics: dict | None = None) -> dict:  # fmt: skip
    """One e2e record: forward ``forward`` ms, backward twice that, optimizer step 1 ms, inference 0.8 of
    the forward, each with samples of std ``cv``·mean and, where ``width`` is given, 3 trials of those samples
    and a 95% interval ±``width`` of it; ``busy``: the GPU's busy share of the training step."""
    m: dict = {"parameter_count": 1_000_000, "training_status": training, "inference_status": "ok"}
    times = {"inference_forward": 0.8 * forward}
    if training == "ok":
        times.update(forward=forward, backward=2 * forward, optimizer_step=1.0, training_step=3 * forward + 1)
    samples = {f"{name}_ms_samples": [ms, ms * (1 - cv), ms * (1 + cv)] for name, ms in times.items()}
    m.update(samples)  # the first is the median: the first step no slower than the others
    for name, ms in times.items():
        m.update({f"{name}_ms_mean": ms, f"{name}_ms_std": cv * ms})
        if width is not None:
            m.update({f"{name}_ms_mean_interval": [ms * (1 - width), ms * (1 + width)], "trials": [samples] * 3})
    if busy is not None and training == "ok":
        m["gpu_busy_fraction"] = busy
    m.update(metrics or {})
    cell = {"model": model, "context_length": ctx, "precision": precision, "compile": compile, "warmup_steps": warmup}
    settings = {"attention": attention, "batch_size": 4, "vocab_size": 10_000}
    prov = {**PROVENANCE, "device_slug": device, "settings": settings}
    reason = None if training == "ok" else "training: CUDA out of memory"
    return make_record("e2e", cell, "ok" if training == "ok" else "oom", m, prov, reason)


def compiled_pair(model: str, ctx: int, eager_ms: float, compiled_ms: float, **kwargs) -> list[dict]:
    """An eager and a compiled record of one cell, the compiled one loading its graphs from the cache."""
    loaded = {"metrics": {"compile_cache_hits": 10}}
    return [
        e2e(model, ctx, forward=eager_ms, **kwargs),
        e2e(model, ctx, compile="compiled", forward=compiled_ms, **loaded, **kwargs),
    ]


def compile_job(model: str, ctx: int, training_s: float | None, inference_s: float) -> dict:
    """A compile job's record (kind e2e_compile); ``training_s`` None: compiling the training graphs failed."""
    metrics = {"inference_compile_s": inference_s, "training_compile_s": training_s}
    metrics = {k: v for k, v in metrics.items() if v is not None}
    cell = {"model": model, "context_length": ctx, "precision": "fp32"}
    return make_record("e2e_compile", cell, "ok", metrics, PROVENANCE)
