"""Synthetic memory records: schema-valid, with only the metrics the facts read. Sizes in MiB."""

from __future__ import annotations

from lmperf.core.record import make_record
from tests.kinds.records import provenance

PROVENANCE = provenance(settings={"vocab_size": 10_000})


def cell(ctx: int = 128, precision: str = "fp32", mode: str = "training", model: str = "2.7B") -> dict:
    return {"model": model, "context_length": ctx, "precision": precision, "mode": mode, "batch_size": 4}


def record(cell_: dict, metrics: dict, status: str = "ok", reason: str | None = None, device: str = "h100") -> dict:
    return make_record("memory", cell_, status, metrics, dict(PROVENANCE, device_slug=device), reason)


def phase(name: str, start: float, end: float, peak: float = 0.0) -> dict:
    return {"phase": name, "start_active_mib": start, "end_active_mib": end, "peak_active_mib": max(start, end, peak)}


def training(start=1000.0, forward_rise=300.0, gradients=100.0, transient=100.0, backward_rise=0.0, **extra) -> dict:
    """A step: the forward rises by ``forward_rise``, the backward ends ``gradients`` above the start, the
    optimizer step has a ``transient``, zero_grad frees the gradients."""
    fwd, bwd = start + forward_rise, start + gradients
    phases = [
        phase("forward", start, fwd),
        phase("backward", fwd, bwd, fwd + backward_rise),
        phase("optimizer_step", bwd, bwd, bwd + transient),
        phase("zero_grad", bwd, start),
    ]
    top = max(phases, key=lambda p: p["peak_active_mib"])
    peaks = {"replay_peak_active_mib": top["peak_active_mib"], "peak_allocated_mib": top["peak_active_mib"]}
    return {"phases": phases, **peaks, "peak_phase": top["phase"], **extra}


def inference(base: float = 1000.0, rise: float = 50.0, **extra) -> dict:
    peaks = {"replay_peak_active_mib": base + rise, "peak_allocated_mib": base + rise, "peak_phase": "forward"}
    return {"phases": [phase("forward", base, base + 1, base + rise)], **peaks, **extra}
