"""bench/flash_host_probe.py: busy and idle time of a kernel trace, per step."""

from __future__ import annotations

import pytest


@pytest.fixture
def probe(bench_module):
    return bench_module("flash_host_probe")


def kernel(name, ts, dur):
    return {"name": name, "ts": ts, "dur": dur}


def test_gaps_are_idle_time_between_kernels_and_overlaps_count_once(probe):
    # two steps, listed out of order: a [0, 100), b [90, 150) overlaps a; 50 us idle; c [200, 300);
    # then 1000 us idle before the second step's a [1300, 1400)
    trace = [kernel("c", 200, 100), kernel("a", 0, 100), kernel("b", 90, 60), kernel("a", 1300, 100)]
    out = probe.kernel_gaps(trace, steps=2)
    assert out["busy_ms_per_step"] == pytest.approx((150 + 100 + 100) / 1000 / 2)
    assert out["idle_ms_per_step"] == pytest.approx((50 + 1000) / 1000 / 2)
    assert out["span_ms_per_step"] == pytest.approx(1400 / 1000 / 2)
    assert [g["before"] for g in out["largest_gaps"]] == ["a", "c"]
    assert out["largest_gaps"][0]["us"] == pytest.approx(1000)
    # per-name time sums every launch, most time first
    assert list(out["kernel_ms_per_step"]) == ["a", "c", "b"]
    assert out["kernel_ms_per_step"]["a"] == pytest.approx(200 / 1000 / 2)


def test_a_kernel_inside_another_leaves_no_gap(probe):
    out = probe.kernel_gaps([kernel("long", 0, 500), kernel("short", 100, 50), kernel("next", 500, 10)], steps=1)
    assert out["idle_ms_per_step"] == 0
    assert out["busy_ms_per_step"] == pytest.approx(0.51)


def test_an_empty_trace_is_all_zero(probe):
    out = probe.kernel_gaps([], steps=3)
    assert out["busy_ms_per_step"] == out["idle_ms_per_step"] == 0.0
    assert out["largest_gaps"] == []
