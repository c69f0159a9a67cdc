"""The timing harness: the course's wall-clock method per phase (``PhaseTimer``, with CUDA events at
the same boundaries as a cross-check), passes under a time budget, and summaries of samples.
"""

from __future__ import annotations

import statistics
import timeit
from contextlib import contextmanager

import torch


def summarize(samples_ms: list[float]) -> dict:
    """Mean, sample standard deviation, median, min, max and the samples themselves (ms)."""
    if not samples_ms:
        raise ValueError("no samples to summarize")
    return {
        "mean": statistics.fmean(samples_ms),
        "std": statistics.stdev(samples_ms) if len(samples_ms) > 1 else 0.0,
        "median": statistics.median(samples_ms),
        "min": min(samples_ms),
        "max": max(samples_ms),
        "n": len(samples_ms),
        "samples": list(samples_ms),
    }


def flatten_summary(prefix: str, summary: dict, unit: str = "ms") -> dict:
    """{'mean': 1.0, ...} -> {'forward_ms_mean': 1.0, ...}; n stays unit-free."""
    out = {}
    for key, value in summary.items():
        out[f"{prefix}_n" if key == "n" else f"{prefix}_{unit}_{key}"] = value
    return out


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseTimer:
    """``with timer.phase("forward"):`` appends one sample (ms, default_timer, synchronized before and
    after) to ``samples_ms["forward"]``; on CUDA an event pair brackets the same region."""

    def __init__(self, device: torch.device, record: bool = True, cuda_events: bool = True):
        self.device = device
        self.record = record
        self.cuda_events = cuda_events
        self.samples_ms: dict[str, list[float]] = {}
        self._events: dict[str, list[tuple]] = {}

    @contextmanager
    def phase(self, name: str):
        synchronize(self.device)
        use_events = self.record and self.cuda_events and self.device.type == "cuda"
        if use_events:
            start_event = torch.cuda.Event(enable_timing=True)
            end_event = torch.cuda.Event(enable_timing=True)
            start_event.record()
        start = timeit.default_timer()
        yield
        if use_events:
            end_event.record()
        synchronize(self.device)
        elapsed_ms = (timeit.default_timer() - start) * 1e3
        if self.record:
            self.samples_ms.setdefault(name, []).append(elapsed_ms)
            if use_events:
                self._events.setdefault(name, []).append((start_event, end_event))

    def event_samples_ms(self) -> dict[str, list[float]]:
        return {name: [s.elapsed_time(e) for s, e in pairs] for name, pairs in self._events.items()}


def run_passes(one_pass, max_passes: int, min_passes: int, max_seconds: float) -> int:
    """Run ``one_pass`` up to ``max_passes`` times, stopping (after ``min_passes``) before the
    next pass would take the total past ``max_seconds``. Returns the number of passes run."""
    start = timeit.default_timer()
    done = 0
    while done < max_passes:
        t0 = timeit.default_timer()
        one_pass()
        done += 1
        now = timeit.default_timer()
        if done >= min_passes and (now - start) + (now - t0) > max_seconds:
            break
    return done


def warm_up(
    one_pass, passes: int, max_seconds: float, min_passes: int = 1, first_s: float | None = None
) -> tuple[float, int]:
    """Run ``one_pass`` up to ``passes`` times; (first pass in ms, passes run). The first (compilation)
    does not count against ``max_seconds``; another runs while the last says it would still fit, or
    while under ``min_passes``. ``first_s``: the first pass already ran elsewhere and took this long."""
    if first_s is None:
        first_s = seconds(one_pass)
    last = first_s
    first_ms, done = first_s * 1e3, 1
    start = timeit.default_timer()
    while done < passes and (done < min_passes or (timeit.default_timer() - start) + last <= max_seconds):
        last = seconds(one_pass)
        done += 1
    return first_ms, done


def seconds(fn) -> float:
    """Wall-clock seconds ``fn()`` takes (no synchronize: ``fn`` synchronizes where it must)."""
    t0 = timeit.default_timer()
    fn()
    return timeit.default_timer() - t0
