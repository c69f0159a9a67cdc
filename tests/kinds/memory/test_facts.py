"""Facts of memory_profiling (a) and (b): stage visibility, the two peaks, the analytic account."""

from __future__ import annotations

import pytest

from lmperf.core.sizes import config_from_name
from lmperf.kinds.memory import facts as F
from lmperf.kinds.memory.account import analytic_account

from .records import cell, inference_metrics, record, training_metrics

PEAK = 10_000.0


def _step(**moves) -> dict:
    """A training record whose peak is PEAK (a backward excursion) and whose stages move as given."""
    base = dict(start=5000.0, forward_rise=3000.0, gradients=1000.0, transient=1000.0)
    base.update(moves)
    rise = PEAK - base["start"] - base["forward_rise"]
    return record(cell(), training_metrics(backward_rise=rise, **base))


@pytest.mark.parametrize(
    ("move", "name"),
    [
        ("forward_rise", "forward rises"),
        ("transient", "optimizer step has a transient"),
        ("gradients", "zero_grad drops"),
    ],
)
def test_each_stage_shows_only_beyond_visible_share(move, name):
    small, large = F.VISIBLE_SHARE * PEAK * 0.5, F.VISIBLE_SHARE * PEAK * 2
    hidden = F.stage_row(_step(**{move: small})).hidden
    assert name in hidden
    assert F.stage_row(_step(**{move: large})).hidden == ()


def test_backward_shows_when_it_moves_memory_at_all():
    # no net change and no excursion in the backward: hidden; a release of its saved activations: shown
    still = record(cell(), training_metrics(forward_rise=3000.0, gradients=3000.0, transient=5000.0))
    assert F.stage_row(still).hidden == ("backward changes active memory",)
    assert F.stage_row(record(cell(), training_metrics(forward_rise=3000.0, gradients=1000.0))).hidden == ()


def test_stage_verdict_is_yes_partly_or_no():
    shown = _step()
    hidden = _step(transient=1.0)
    other = dict(hidden, cell=cell(256))
    assert F.stage_facts([shown, dict(shown, cell=cell(256))]).verdict == "yes"
    assert F.stage_facts([shown, other]).verdict == "partly"
    assert F.stage_facts([hidden, other]).verdict == "no"
    assert F.stage_facts([record(cell(mode="inference"), inference_metrics())]).verdict is None


def test_stage_facts_read_each_stage_from_the_phases():
    a = record(cell(128), training_metrics(start=1000, forward_rise=300, gradients=100, transient=100))
    b = record(cell(512), training_metrics(start=1000, forward_rise=900, gradients=100, transient=100))
    inf = record(cell(128, mode="inference"), inference_metrics(base=400, rise=30))
    f = F.stage_facts([a, b, inf])
    assert f.forward_rise_mib == (300, 900)
    assert f.gradients_mib == (100, 100)
    assert f.step_transient_mib == (100, 100)
    assert f.zero_grad_frees_mib == (100, 100)
    assert f.inference_base_mib == (400, 400) and f.inference_rise_mib == 30
    assert [r.mode for r in f.rows] == ["training", "training", "inference"]


def _gap_record(per_allocation: float) -> dict:
    n = 100
    metrics = training_metrics(peak_allocated=None, live_allocations_at_peak=n)
    metrics["peak_allocated_mib"] = metrics["replay_peak_active_mib"] + per_allocation * n
    return record(cell(), metrics)


def test_two_peaks_reconcile_only_within_block_slack():
    within = F.two_peaks([_gap_record(F.BLOCK_SLACK_MIB * 0.5)])
    beyond = F.two_peaks([_gap_record(F.BLOCK_SLACK_MIB * 2)])
    assert within.reconciled and within.per_allocation_mib == pytest.approx(0.5 * F.BLOCK_SLACK_MIB)
    assert not beyond.reconciled
    assert F.two_peaks([]) is None


def test_analytic_peak_phase_follows_the_larger_total():
    config = config_from_name("2.7B", vocab_size=10_000)
    sides = {}
    for ctx in (128, 512):
        account = analytic_account(config, 4, ctx, "fp32", "training")
        sides[ctx] = F.analytic_peak_phase(account)
        bigger = account["end_of_forward_mib"] >= account["optimizer_step_mib"]
        assert sides[ctx] == (F.ANALYTIC_END_OF_FORWARD if bigger else F.ANALYTIC_OPTIMIZER_STEP)
        got = F.peak_cell(record(cell(ctx), training_metrics()))
        assert got.analytic_phase == sides[ctx] and got.analytic_mib == pytest.approx(account["predicted_peak_mib"])
    assert sides == {128: F.ANALYTIC_OPTIMIZER_STEP, 512: F.ANALYTIC_END_OF_FORWARD}  # one cell on each side
    assert F.analytic_peak_phase({"predicted_peak_phase": "forward"}) == "forward"  # inference


def test_peak_facts_group_contexts_by_phase_and_measure_the_account():
    config = config_from_name("2.7B", vocab_size=10_000)
    records = []
    for ctx, phase in ((128, "optimizer_step"), (256, "optimizer_step"), (512, "backward")):
        predicted = analytic_account(config, 4, ctx, "fp32", "training")["predicted_peak_mib"]
        m = training_metrics()
        m.update(replay_peak_active_mib=predicted * 1.01, peak_phase=phase)
        records.append(record(cell(ctx), m))
    records.append(record(cell(128, mode="inference"), inference_metrics(base=100, rise=20)))
    f = F.peak_facts(records)
    assert f.contexts_by_phase() == {"optimizer_step": (128, 256), "backward": (512,)}
    assert f.analytic_error == pytest.approx(0.01 / 1.01)
    assert f.span("inference") == (120, 120)


def test_out_of_memory_keeps_where_it_failed():
    oom = record(
        cell(512),
        {"oom_events": [{"phase": "backward", "requested_bytes": 2 * 2**20, "device_free_bytes": 2**20}]},
        status="oom",
        reason="out of memory",
    )
    (o,) = F.peak_facts([oom]).out_of_memory
    assert (o.context, o.mode, o.where) == (512, "training", (("backward", 2.0, 1.0),))
    assert F.peak_facts([oom]).rows[0].training.peak is None


def test_composition_keeps_live_gradients_apart_from_the_account():
    live = {"parameters": 10.0, "gradients": 0.5, "optimizer_state": 20.0, "other": 30.0}
    r = record(cell(512), training_metrics(breakdown_at_peak_mib=live, saved_for_backward_mib=100.0))
    (c,) = F.compositions([r])
    assert c.live_mib["gradients"] == 0.5
    assert c.account["gradients_mib"] == pytest.approx(4 * c.account["parameter_count"] / 2**20)
    closed = c.account["activations_mib"] + c.account["weight_copies_mib"]
    assert F.saved_error((c,)) == pytest.approx(abs(closed - 100.0) / 100.0)
