"""Synthetic ladder records for the ladder report's tests: every number set by hand, no cell code."""

from __future__ import annotations

from lmperf.core.record import make_record
from tests.kinds.records import provenance

PROV = provenance(git_commit="abcdef0123" + "0" * 30, start_time="2026-11-22T00:00:00+00:00")


def rung(name: str, index: int, parent: str | None, step_ms: float | None, *, model: str = "small", ctx: int = 1024,
         batch: int = 4, accum: int = 1, status: str = "ok", interval: tuple[float, float] | None = None,
         trials: int = 1, mfu: dict | None = None, attention: str = "plain", device: str = "h100",
         **metrics) -> dict:  # fmt: skip
    """A ladder record: ``step_ms`` is the median (over ``trials``, with ``interval`` when given)."""
    config = {"precision": "bf16", "attention": attention, "batch_size": batch, "accumulation_steps": accum}
    m = {"rung_index": index, "parent": parent, "change": f"change of {name}", "config": config, "rung_wall_s": 2.0}
    m |= {"step_statistic": "median", "tokens_per_step": batch * ctx * accum, **metrics}
    if status == "ok":
        m["step_ms_median"] = step_ms
        m |= {k: v for k, v in (mfu or {}).items()}
        if interval is not None:
            m["step_ms_median_interval"] = list(interval)
            m["trials"] = [{"samples": [step_ms]} for _ in range(trials)]
    prov = {**PROV, "device_slug": device, "device_name": "x86_64" if device == "cpu" else PROV["device_name"]}
    reason = None if status == "ok" else ("CUDA out of memory" if status == "oom" else "cannot run here")
    return make_record("ladder", {"model": model, "context_length": ctx, "rung": name}, status, m, prov, reason)


def us_per_token(step_ms: float, batch: int = 4, ctx: int = 1024, accum: int = 1) -> float:
    """The independent reference: µs per token of a step."""
    return step_ms * 1e3 / (batch * ctx * accum)
