"""What the kinds' synthetic records share: a schema-valid provenance (lmperf.core.record.make_record)."""

from __future__ import annotations

H100 = "NVIDIA H100 80GB HBM3"


def provenance(device: str = "h100", name: str | None = None, **fields) -> dict:
    """A record's provenance on ``device`` (``name``: its device name, by default H100's on h100, else
    the slug), ``fields`` added or replaced."""
    return {
        "device_slug": device,
        "device_name": name or (H100 if device == "h100" else device),
        "torch_version": "2.11.0",
        "git_commit": "0123456789abcdef0123456789abcdef01234567",
        "git_dirty": False,
        "start_time": "2026-01-01T00:00:00+00:00",
        "settings": {},
    } | fields
