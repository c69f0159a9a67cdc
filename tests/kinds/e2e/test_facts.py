"""The e2e report's facts from synthetic records: every verdict with records on both sides of it."""

from __future__ import annotations

import pytest

from lmperf.kinds.e2e import facts as F
from tests.kinds.e2e.report_records import compile_job, compiled_pair, e2e


def test_variability_is_high_only_from_the_cv_threshold_on_and_host_bound_only_where_measured():
    quiet = F.TimingFacts([e2e(cv=F.LOW_CV * 0.9), e2e("medium", cv=0.001)], 5)
    noisy = F.TimingFacts([e2e(cv=F.LOW_CV * 1.1), e2e("medium", cv=0.001)], 5)
    assert quiet.noisy == [] and len(quiet.ok) == 2
    assert [r.label for r in noisy.noisy] == ["small/128"] and noisy.noisy[0].cv == pytest.approx(F.LOW_CV * 1.1)
    # host-bound only where the GPU busy share is measured
    records = [e2e(busy=F.HOST_BOUND_BUSY * 0.8), e2e("medium", busy=F.HOST_BOUND_BUSY * 1.2), e2e("large")]
    bound = {r.model: F.host_bound(r.busy[1]) for r in F.TimingFacts(records, 5).rows}
    assert bound == {"small": True, "medium": False, "large": None}  # large: not measured, not guessed


def test_variability_is_each_trials_own_cv_over_its_steps_the_median_over_trials():
    # a merged record: each mean the median over trials, each std copied from one trial (lmperf.core.trials)
    def trial(mean: float, cv: float) -> dict:
        return {f"{p}_ms_samples": [mean, mean * (1 - cv), mean * (1 + cv)] for p in F.STEP_PHASES}

    runs = [trial(5.0, 0.07), trial(9.0, 0.30), trial(7.0, 0.10), {"status": "oom"}]  # no samples: no CV
    (row,) = F.TimingFacts([e2e(forward=7.0, cv=0.05, metrics={"trials": runs})], 5).rows
    assert row.cvs == pytest.approx({"forward": 0.10, "backward": 0.10}) and row.cv == pytest.approx(0.10)
    assert row.stds["forward"] == pytest.approx(0.7)  # the trials' std: 0.35, 2.7 and 0.7 ms
    (single,) = F.TimingFacts([e2e(cv=0.03)], 5).rows  # one trial: its own samples
    assert single.cv == pytest.approx(0.03) and F.TimingFacts([e2e(training="oom")], 5).rows[0].cv is None


def test_only_the_default_warmup_fp32_eager_plain_cells_are_tabulated_and_oom_cells_kept():
    records = [e2e(), e2e(warmup=0), e2e(precision="bf16"), e2e(attention="flash"), e2e("xl", 1024, training="oom")]
    facts = F.TimingFacts(records + compiled_pair("small", 256, 9, 8), 5)
    assert [r.label for r in facts.rows] == ["small/128", "small/256", "xl/1024"]
    assert [r.label for r in facts.ok] == ["small/128", "small/256"] and facts.trials == 1


def _sweep(w0_ms: float, width: float | None) -> F.WarmupFacts:
    records = [e2e(ctx=256, forward=10.0, width=width), e2e(ctx=256, warmup=0, forward=w0_ms, width=width)]
    return F.WarmupFacts([*records, e2e(ctx=256, warmup=1, forward=10.1, width=width)], 5, 256)


def test_a_warmup_count_differs_from_the_default_only_beyond_the_noise():
    tight = _sweep(15.0, 0.01)  # intervals apart: slower
    assert [r.verdict("forward") for r in tight.judged(fewer=False)] == ["slower"]
    assert [r.verdict("forward") for r in tight.judged(fewer=True)] == ["within noise"]  # 10.1 against 10.0
    assert [r.verdict("forward") for r in tight.rows if r.warmup_steps == 5] == [None]  # not against itself
    # intervals overlap, or single trials under twice the margin: within the noise, however far the medians
    assert [r.verdict("forward") for r in _sweep(15.0, 0.25).judged(fewer=False)] == ["within noise"]
    assert [r.verdict("forward") for r in _sweep(10.5, None).judged(fewer=False)] == ["within noise"]
    record = e2e(ctx=256, warmup=0, metrics={"forward_ms_samples": [90.0, 10.0, 10.0, 12.0]})
    (row,) = F.WarmupFacts([record], 5, 256).rows
    assert row.first_over_median == pytest.approx(9.0) and row.verdict("forward") is None  # no default cell


def _bf16(speedups: dict[str, float], width: float | None = 0.01) -> F.PrecisionFacts:
    records = []
    for model, s in speedups.items():
        for ctx in (128, 256):
            records += [
                e2e(model, ctx, forward=30.0, width=width),
                e2e(model, ctx, "bf16", forward=30.0 / s, width=width),
            ]
    return F.PrecisionFacts(records, 5)


def test_bf16_is_faster_slower_or_within_the_noise_by_its_intervals():
    assert {r.verdict("step") for r in _bf16({"small": 1.3}).rows} == {"faster"}
    assert {r.verdict("step") for r in _bf16({"small": 0.7}).rows} == {"slower"}
    assert {r.verdict("step") for r in _bf16({"small": 1.3}, width=0.2).rows} == {"within noise"}
    # the step is forward (30 / s), backward (60 / s) and 1 ms of optimizer step
    assert _bf16({"small": 1.3}).rows[0].speedup("step").median == pytest.approx(91 / (90 / 1.3 + 1))
    growing = _bf16({"small": 0.8, "medium": 1.5, "large": 2.0})
    assert growing.faster_from == "medium" and growing.by_size["large"] == pytest.approx(91 / (45 + 1))
    assert list(growing.by_size) == ["small", "medium", "large"]
    assert _bf16({"small": 1.5, "medium": 1.0}).faster_from is None


def test_compiled_cells_against_eager_and_the_compile_job():
    records = (
        compiled_pair("small", 128, 20.0, 10.0, width=0.01)
        + compiled_pair("small", 256, 20.0, 19.9, width=0.01)  # within the noise
        + [e2e("small", 512), e2e("medium", 128), e2e("medium", 256, "bf16")]  # eager only; bf16 is never compiled
        + compiled_pair("xl", 1024, 100.0, 90.0, training="oom")
        + [compile_job("small", 128, 11.0, 2.0), compile_job("small", 256, None, 3.0)]
    )
    records[-2]["metrics"]["concurrent_compiles"] = 2  # as the second compile started, beside the first
    records[-1]["provenance"] = {**records[-1]["provenance"], "settings": {"concurrent_compiles": 1}}  # older records
    c = F.CompileFacts(records, 5)
    assert c.at_once == 2 and F.CompileFacts(records[:-2], 5).at_once == 0
    assert [r.verdict("step") for r in c.rows] == ["faster", "within noise", None]
    assert c.rows[0].speedup("inference").median == pytest.approx(2.0) and c.rows[2].verdict("inference") == "faster"
    assert c.uncompiled == ("small/512", "medium/128") and len(c.loaded) == 3 and c.job_cells == 2
    assert c.cold("training") == [11.0] and c.cold("inference") == [2.0, 3.0]


def _timed(model: str, deviation: float, attention: str = "plain") -> dict:
    events = [20.0, 30.0, 40.0, 5.0]  # the last is under the threshold: not compared
    metrics = {f"{p}_event_ms_samples": events for p in F.TIMER_PHASES}
    metrics.update({f"{p}_ms_samples": [e * (1 + deviation) for e in events] for p in F.TIMER_PHASES})
    return e2e(model, attention=attention, metrics=metrics)


def test_timer_deviations_of_the_course_model_only():
    series = F.timer_deviations([_timed("small", 0.01), _timed("medium", 0.04), _timed("small", 0.5, "flash")])
    assert {cell.split(",")[0] for cell, _ in series} == {"small", "medium"} and len(series) == 2 * 4
    assert all(
        d == pytest.approx(0.04 if cell.startswith("medium") else 0.01) for (cell, _), s in series.items() for d in s
    )
    assert all(len(s) == 3 for s in series.values())  # the 5 ms sample is under the threshold


def test_attention_rows_compare_with_plain_beyond_the_noise():
    records = [
        e2e(ctx=1024, forward=30.0, width=0.01, metrics={"training_peak_allocated_mib": 1000.0}),
        e2e(ctx=1024, forward=15.0, width=0.01, attention="flash", metrics={"training_peak_allocated_mib": 500.0}),
        e2e(ctx=1024, forward=29.9, width=0.01, attention="sdpa"),
        e2e("medium", ctx=1024),  # no other attention: no rows
    ]
    rows = F.attention_rows(records)
    assert [(r.attention, r.verdict("step")) for r in rows] == [("flash", "faster"), ("sdpa", "within noise")]
    assert rows[0].peak_ratio == pytest.approx(0.5) and rows[1].peak_ratio is None
