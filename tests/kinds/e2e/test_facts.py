"""The e2e report's facts from synthetic records: every verdict with records on both sides of it."""

from __future__ import annotations

import pytest

from lmperf.kinds.e2e import facts as F
from tests.kinds.e2e.report_records import compile_job, compiled_pair, e2e

# -- benchmarking_script (b): variability, host-bound, out of memory ---------------------------------


def test_variability_is_high_only_from_the_cv_threshold_on():
    quiet = F.timing_facts([e2e(cv=F.LOW_CV * 0.9), e2e("medium", cv=0.001)], 5)
    noisy = F.timing_facts([e2e(cv=F.LOW_CV * 1.1), e2e("medium", cv=0.001)], 5)
    assert quiet.noisy == [] and len(quiet.judged) == 2
    assert [r.label for r in noisy.noisy] == ["small/128"]
    assert noisy.noisy[0].cv == pytest.approx(F.LOW_CV * 1.1)


def test_host_bound_only_where_the_gpu_busy_share_is_measured():
    facts = F.timing_facts(
        [e2e(busy=F.HOST_BOUND_BUSY * 0.8), e2e("medium", busy=F.HOST_BOUND_BUSY * 1.2), e2e("large")], 5
    )
    by = {r.model: r.host_bound for r in facts.rows}
    # large has no busy share: not guessed (its time ratios say nothing here)
    assert by == {"small": True, "medium": False, "large": None}


def test_backward_over_forward_and_out_of_memory_cells():
    facts = F.timing_facts([e2e(forward=10.0, backward=25.0), e2e("xl", 1024, training="oom")], 5)
    assert facts.backward_over_forward == [pytest.approx(2.5)]
    assert [r.label for r in facts.oom] == ["xl/1024"] and not facts.oom[0].training_ok
    assert facts.trials == 1  # no trials in these records: no intervals


def test_only_the_default_warmup_fp32_eager_plain_cells_are_tabulated():
    records = [e2e(), e2e(warmup=0), e2e(precision="bf16"), e2e(attention="flash"), *compiled_pair("small", 256, 9, 8)]
    facts = F.timing_facts(records, 5)
    assert [r.label for r in facts.rows] == ["small/128", "small/256"]


# -- benchmarking_script (c): warm-up counts against the default, beyond the noise -------------------


def _sweep(w0_ms: float, width: float | None) -> F.WarmupFacts:
    records = [
        e2e(ctx=256, warmup=5, forward=10.0, width=width),
        e2e(ctx=256, warmup=0, forward=w0_ms, width=width),
        e2e(ctx=256, warmup=1, forward=10.1, width=width),
    ]
    return F.warmup_facts(records, 5, 256)


def test_a_warmup_count_differs_from_the_default_only_beyond_the_noise():
    tight = _sweep(15.0, 0.01)  # intervals apart: slower
    assert [r.verdict("forward") for r in tight.cold] == ["slower"]
    assert [r.verdict("forward") for r in tight.few] == ["within noise"]  # 10.1 against 10.0
    wide = _sweep(15.0, 0.25)  # intervals overlap: within the noise, however different the medians
    assert [r.verdict("forward") for r in wide.cold] == ["within noise"]
    single = _sweep(10.5, None)  # one trial each: only a difference beyond twice the margin counts
    assert [r.verdict("forward") for r in single.cold] == ["within noise"]


def test_the_first_step_over_the_median_is_read_from_the_samples():
    record = e2e(ctx=256, warmup=0, metrics={"forward_ms_samples": [90.0, 10.0, 10.0, 12.0]})
    (row,) = F.warmup_facts([record], 5, 256).rows
    assert row.firsts["forward"] == pytest.approx(9.0)
    assert row.verdict("forward") is None  # no default-count cell to compare with


# -- benchmarking_mixed_precision (c) ---------------------------------------------------------------


def _bf16(speedups: dict[str, float], width: float | None = 0.01) -> F.PrecisionFacts:
    records = []
    for model, s in speedups.items():
        for ctx in (128, 256):
            records += [
                e2e(model, ctx, forward=30.0, width=width),
                e2e(model, ctx, "bf16", forward=30.0 / s, width=width),
            ]
    return F.precision_facts(records, 5, cpu=False)


def test_bf16_is_faster_slower_or_within_the_noise_by_its_intervals():
    assert {r.verdict("step") for r in _bf16({"small": 1.3}).rows} == {"faster"}
    assert {r.verdict("step") for r in _bf16({"small": 0.7}).rows} == {"slower"}
    assert {r.verdict("step") for r in _bf16({"small": 1.3}, width=0.2).rows} == {"within noise"}
    assert _bf16({"small": 1.3}).rows[0].speedup("forward").median == pytest.approx(1.3)


def test_bf16_trend_with_size_and_the_size_it_is_faster_from():
    growing = _bf16({"small": 0.8, "medium": 1.5, "large": 2.0})
    assert growing.grows_with_size and growing.faster_from == "medium"
    dipping = _bf16({"small": 1.5, "medium": 1.2, "large": 2.0})
    assert dipping.grows_with_size and dipping.faster_from == "small"
    assert not _bf16({"small": 1.5, "large": 1.5}).grows_with_size  # level
    assert not _bf16({"small": 1.5, "large": 2.0}, width=0.2).grows_with_size  # within the noise
    assert _bf16({"small": 1.5, "medium": 1.0}).faster_from is None


def test_bf16_host_bound_rows_need_a_measured_busy_share():
    def facts(busy):
        records = [e2e(forward=10.0, busy=busy), e2e(precision="bf16", forward=11.0, busy=busy)]
        return F.precision_facts(records, 5, cpu=False)

    assert [r.label for r in facts(F.HOST_BOUND_BUSY * 0.5).host_bound] == ["small/128"]
    assert facts(F.HOST_BOUND_BUSY * 1.5).host_bound == [] and facts(None).host_bound == []


# -- torch_compile (b) ------------------------------------------------------------------------------


def test_compiled_cells_against_eager_and_the_compile_job():
    records = (
        compiled_pair("small", 128, 20.0, 10.0, width=0.01)
        + compiled_pair("small", 256, 20.0, 19.9, width=0.01)  # 1.005x: within the noise
        + [e2e("small", 512)]  # eager only
        + compiled_pair("xl", 1024, 100.0, 90.0, training="oom")
        + [compile_job("small", 128, 11.0, 2.0, 0, 20), compile_job("small", 256, None, 3.0, 10, 50)]
    )
    c = F.compile_facts(records, 5)
    assert [r.verdict("step") for r in c.rows] == ["faster", "within noise", None]
    assert c.rows[0].speedup("inference").median == pytest.approx(2.0)
    assert [r.label for r in c.training_oom] == ["xl/1024"] and c.rows[2].verdict("inference") == "faster"
    assert c.uncompiled == (512,) and dict(c.scopes) == {"blocks": 3} and len(c.loaded) == 3
    assert c.job_cells == 2 and c.job_training_s == (11.0,) and c.job_inference_s == (2.0, 3.0)
    assert c.job_at_once == 4 and c.job_wall_s == pytest.approx(60.0)  # from 10:00:00 to 10:00:10 + 50 s
    assert c.rows[0].cold_training_s == 11.0 and c.rows[1].cold_training_s is None


def test_a_compiled_record_without_the_scope_setting_compiled_the_whole_model():
    eager, compiled = compiled_pair("small", 128, 20.0, 10.0)
    del compiled["provenance"]["settings"]["compile_scope"]
    assert F.compile_scope(compiled) == "model"
    assert dict(F.compile_facts([eager, compiled], 5).scopes) == {"model": 1}


# -- timer_check ------------------------------------------------------------------------------------


def _timed(model: str, deviation: float, attention: str = "plain") -> dict:
    events = [20.0, 30.0, 40.0, 5.0]  # the last is under the threshold: not compared
    metrics = {}
    for phase in F.TIMER_PHASES:
        metrics[f"{phase}_event_ms_samples"] = events
        metrics[f"{phase}_ms_samples"] = [e * (1 + deviation) for e in events]
    return e2e(model, attention=attention, metrics=metrics)


def test_timer_agreement_flips_at_its_share_and_other_attentions_are_left_out():
    share = F.TIMER_AGREE_SHARE
    t = F.timer_facts([_timed("small", share / 2), _timed("medium", share * 2), _timed("small", 0, "flash")])
    assert len(t.deviations) == 2 * 4 * 3 and t.compared_cells == 2 and t.cells == 2
    assert t.agreeing_samples == 12  # the series of the cell within the share
    assert t.worst[0] == pytest.approx(share * 2) and t.worst[1].startswith("medium")
    assert t.left_out == ("flash",) and t.left_out_cells == 1


# -- flash_benchmarking: the whole model --------------------------------------------------------------


def test_attention_rows_compare_with_plain_beyond_the_noise():
    peak = {"metrics": {"training_peak_allocated_mib": 1000.0}}
    records = [
        e2e(ctx=1024, forward=30.0, width=0.01, **peak),
        e2e(ctx=1024, forward=15.0, width=0.01, attention="flash", metrics={"training_peak_allocated_mib": 500.0}),
        e2e(ctx=1024, forward=29.9, width=0.01, attention="sdpa"),
        e2e("medium", ctx=1024),  # no other attention: no rows
    ]
    rows = F.attention_rows(records)
    assert [(r.attention, r.verdict("step")) for r in rows] == [
        ("plain", "within noise"),
        ("flash", "faster"),
        ("sdpa", "within noise"),
    ]
    assert rows[1].peak_ratio == pytest.approx(0.5) and rows[2].peak_ratio is None
