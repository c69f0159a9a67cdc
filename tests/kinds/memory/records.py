"""Synthetic memory records for the report's tests: schema-valid (lmperf.core.record.make_record),
with only the metrics each fact reads. Sizes in MiB."""

from __future__ import annotations

from lmperf.core.record import make_record

PROVENANCE = {
    "device_slug": "h100",
    "device_name": "NVIDIA H100 80GB HBM3",
    "torch_version": "2.11.0",
    "git_commit": "0123456789abcdef0123456789abcdef01234567",
    "git_dirty": False,
    "start_time": "2026-01-01T00:00:00+00:00",
    "settings": {},
}


def cell(ctx: int = 128, precision: str = "fp32", mode: str = "training", model: str = "2.7B") -> dict:
    return {"model": model, "context_length": ctx, "precision": precision, "mode": mode, "batch_size": 4}


def record(cell_: dict, metrics: dict, status: str = "ok", reason: str | None = None, device: str = "h100") -> dict:
    provenance = dict(PROVENANCE, device_slug=device)
    return make_record("memory", cell_, status, metrics, provenance, reason)


def phase(name: str, start: float, end: float, peak: float | None = None) -> dict:
    return {
        "phase": name,
        "start_active_mib": start,
        "end_active_mib": end,
        "peak_active_mib": max(start, end, peak or 0),
    }


def training_metrics(
    start: float = 1000.0,
    forward_rise: float = 300.0,
    gradients: float = 100.0,
    transient: float = 100.0,
    backward_rise: float = 0.0,
    peak_allocated: float | None = None,
    **extra,
) -> dict:
    """A step that rises by ``forward_rise`` in the forward, ends the backward ``gradients`` above
    its start, has a ``transient`` in the optimizer step and frees the gradients in zero_grad."""
    fwd_end = start + forward_rise
    bwd_end = start + gradients
    phases = [
        phase("forward", start, fwd_end),
        phase("backward", fwd_end, bwd_end, fwd_end + backward_rise),
        phase("optimizer_step", bwd_end, bwd_end, bwd_end + transient),
        phase("zero_grad", bwd_end, start),
    ]
    peak = max(p["peak_active_mib"] for p in phases)
    peak_phase = max(phases, key=lambda p: p["peak_active_mib"])["phase"]
    return {
        "phases": phases,
        "replay_peak_active_mib": peak,
        "peak_allocated_mib": peak if peak_allocated is None else peak_allocated,
        "peak_phase": peak_phase,
        **extra,
    }


def inference_metrics(base: float = 1000.0, rise: float = 50.0, **extra) -> dict:
    return {
        "phases": [phase("forward", base, base + 1, base + rise)],
        "replay_peak_active_mib": base + rise,
        "peak_allocated_mib": base + rise,
        "peak_phase": "forward",
        **extra,
    }
