"""Facts of memory_profiling (c): bf16 against fp32, each verdict on both sides of its margin."""

from __future__ import annotations

import pytest

from lmperf.core import stats
from lmperf.core.stats import Estimate
from lmperf.kinds.memory import bf16 as B

from .records import cell, inference_metrics, record, training_metrics


def _peak(ctx: int, precision: str, peak: float, mode: str = "inference", interval=None) -> dict:
    metrics = inference_metrics() if mode == "inference" else training_metrics()
    metrics["peak_allocated_mib"] = peak
    if interval is not None:  # a cell measured in three trials
        metrics["peak_allocated_mib_interval"] = list(interval)
        metrics["trials"] = [{}, {}, {}]
    return record(cell(ctx, precision, mode), metrics)


def test_single_trial_verdict_flips_at_twice_the_margin():
    edge = 2 * B.SAME_MEMORY_MARGIN  # stats.compare doubles the margin for cells measured once
    for factor, verdict in ((1 - 2 * edge, "lower"), (1 + 2 * edge, "higher"), (1 + edge / 2, "within noise")):
        f = B.precision_facts([_peak(128, "fp32", 1000.0), _peak(128, "bf16", 1000.0 * factor)])
        (change,) = f.peaks
        assert change.verdict == verdict, factor
        assert change.margin == pytest.approx(edge)


def test_intervals_decide_when_cells_have_trials():
    fp32 = _peak(128, "fp32", 1000.0, interval=(995.0, 1005.0))
    tight = _peak(128, "bf16", 900.0, interval=(895.0, 905.0))
    wide = _peak(128, "bf16", 900.0, interval=(800.0, 1100.0))
    assert B.precision_facts([fp32, tight]).peaks[0].verdict == "lower"
    assert B.precision_facts([fp32, wide]).peaks[0].verdict == "within noise"
    # the verdict is stats.compare's, in memory's words
    a, b = stats.metric(tight, "peak_allocated_mib"), stats.metric(fp32, "peak_allocated_mib")
    assert stats.compare(a, b, B.SAME_MEMORY_MARGIN) == "faster"
    assert B.precision_facts([fp32, tight]).peaks[0].margin == B.SAME_MEMORY_MARGIN


def test_weight_copies_outweigh_flips_with_the_account():
    change = B.Change("training", 128, Estimate(100.0), Estimate(110.0))
    assert B.ForwardEnd(change, 10.0, 20.0, activations_saved_mib=2.0, weight_copies_mib=6.0).copies_outweigh
    assert not B.ForwardEnd(change, 10.0, 20.0, activations_saved_mib=9.0, weight_copies_mib=6.0).copies_outweigh


def _training(ctx: int, precision: str, forward_rise: float, saved: float, phase: str = "optimizer_step") -> dict:
    metrics = training_metrics(forward_rise=forward_rise, saved_for_backward_mib=saved)
    metrics["peak_phase"] = phase
    return record(cell(ctx, precision), metrics)


def test_end_of_forward_change_and_its_account_from_the_records():
    # 2.7B at context 128: the account's bf16 weight copies (6.3 GiB) outweigh the activation bytes bf16
    # saves; at 512 they do not. The records' own end-of-forward memory decides the verdicts.
    records = [
        _training(128, "fp32", 5000.0, 5000.0),
        _training(128, "bf16", 9500.0, 9500.0),
        _training(512, "fp32", 29000.0, 29000.0, "backward"),
        _training(512, "bf16", 25000.0, 25000.0),
    ]
    f = B.precision_facts(records)
    by_ctx = {e.change.context: e for e in f.forward_ends}
    assert by_ctx[128].change.verdict == "higher" and by_ctx[128].copies_outweigh
    assert by_ctx[512].change.verdict == "lower" and not by_ctx[512].copies_outweigh
    assert (by_ctx[128].saved_fp32_mib, by_ctx[128].saved_bf16_mib) == (5000.0, 9500.0)
    assert by_ctx[128].weight_copies_mib == pytest.approx(by_ctx[512].weight_copies_mib)  # one copy per weight
    assert dict(f.bf16_peak_phases) == {128: "optimizer_step", 512: "optimizer_step"}


def test_a_fit_change_is_kept_and_not_compared():
    ok = _training(512, "bf16", 1000.0, 1000.0)
    oom = record(cell(512, "fp32"), {"oom_events": []}, status="oom", reason="out of memory")
    f = B.precision_facts([ok, oom])
    assert f.fit_changes == ((512, "training", "oom", "ok"),)
    assert f.peaks == () and f.forward_ends == ()
