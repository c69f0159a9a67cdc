"""Synthetic e2e and e2e_compile records for the report's tests: valid records (``make_record``) whose
times, spreads, intervals and GPU busy shares the test chooses."""

from __future__ import annotations

from lmperf.core.record import make_record

PROVENANCE = {
    "device_slug": "h100",
    "device_name": "NVIDIA H100 80GB HBM3",
    "torch_version": "2.11.0",
    "git_commit": "0123456789abcdef0123456789abcdef01234567",
    "git_dirty": False,
    "start_time": "2026-11-26T10:00:00+00:00",
}


def timed(metrics: dict, name: str, ms: float, cv: float, width: float | None, trials: int) -> None:
    """``<name>_ms_mean`` = ms with std cv·ms, and, where ``width`` is given, ``trials`` trials and a
    95% interval ms·[1 − width, 1 + width]."""
    metrics[f"{name}_ms_mean"] = ms
    metrics[f"{name}_ms_std"] = cv * ms
    metrics[f"{name}_ms_median"] = ms
    if width is not None:
        metrics[f"{name}_ms_mean_interval"] = [ms * (1 - width), ms * (1 + width)]
        metrics["trials"] = [{"trial": i} for i in range(trials)]


def e2e(
    model: str = "small",
    ctx: int = 128,
    precision: str = "fp32",
    compile: str = "eager",
    warmup: int = 5,
    *,
    forward: float = 10.0,
    backward: float | None = None,
    inference: float | None = None,
    cv: float = 0.01,
    width: float | None = None,
    trials: int = 3,
    training: str = "ok",
    attention: str = "plain",
    busy: float | None = None,
    device: str = "h100",
    **extra,
) -> dict:
    """One e2e record: forward ``forward`` ms, backward twice that unless given, optimizer step 1 ms."""
    backward = 2 * forward if backward is None else backward
    metrics: dict = {"parameter_count": 1_000_000, "training_status": training, "inference_status": "ok"}
    if training == "ok":
        for name, ms in (("forward", forward), ("backward", backward), ("optimizer_step", 1.0)):
            timed(metrics, name, ms, cv, width, trials)
        timed(metrics, "training_step", forward + backward + 1.0, cv, width, trials)
        metrics["forward_ms_samples"] = [forward] * 4
    timed(metrics, "inference_forward", inference or 0.8 * forward, cv, width, trials)
    if busy is not None:
        metrics["gpu_busy_fraction"] = busy
    metrics.update(extra.pop("metrics", {}))
    settings = {"attention": attention, "batch_size": 4, "vocab_size": 10_000, **extra.pop("settings", {})}
    cell = {"model": model, "context_length": ctx, "precision": precision, "compile": compile, "warmup_steps": warmup}
    provenance = {**PROVENANCE, "device_slug": device, "settings": settings}
    if training == "ok":
        return make_record("e2e", cell, "ok", metrics, provenance)
    return make_record("e2e", cell, "oom", metrics, provenance, "training step: CUDA out of memory")


def compiled_pair(model: str, ctx: int, eager_ms: float, compiled_ms: float, **kwargs) -> list[dict]:
    """An eager and a compiled record of one cell (compiled block by block, loading from the cache)."""
    settings = {"compile_scope": "blocks", **kwargs.pop("settings", {})}
    return [
        e2e(model, ctx, forward=eager_ms, **kwargs),
        e2e(
            model,
            ctx,
            compile="compiled",
            forward=compiled_ms,
            settings=settings,
            metrics={"compile_cache_hits": 10},
            **kwargs,
        ),
    ]


def compile_job(
    model: str, ctx: int, training_s: float | None, inference_s: float, start_s: float, age_s: float
) -> dict:
    """A compile job's record (kind e2e_compile); ``training_s`` None: compiling the training graphs failed."""
    metrics = {"inference_compile_s": inference_s, "inference_status": "ok", "training_status": "ok"}
    if training_s is not None:
        metrics["training_compile_s"] = training_s
    minute, second = divmod(int(start_s), 60)
    provenance = {
        **PROVENANCE,
        "process_start_time": f"2026-11-26T10:{minute:02d}:{second:02d}+00:00",
        "process_age_s": age_s,
        "settings": {"concurrent_compiles": 4, "compile_scope": "blocks"},
    }
    return make_record(
        "e2e_compile", {"model": model, "context_length": ctx, "precision": "fp32"}, "ok", metrics, provenance
    )
