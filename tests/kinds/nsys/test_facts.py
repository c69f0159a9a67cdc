"""nsys_profile's facts: every verdict with synthetic records on both sides of it."""

from __future__ import annotations

import pytest

from lmperf.kinds.nsys import facts

from . import records as R


def frame(recs: list[dict], e2e: list[dict] = ()):
    return facts.frame(recs, list(e2e))


def test_profiler_matches_the_timer_only_within_the_noise():
    f = facts.forward_check(frame([R.inference(range_ms=10.0, timer_ms=10.1), R.inference("medium", range_ms=20.0)]))
    assert f.cells == 2 and f.matches_timer and f.over_timer.low == pytest.approx(10.0 / 10.1)
    f = facts.forward_check(frame([R.inference(range_ms=12.0, timer_ms=10.0), R.inference("medium", range_ms=20.0)]))
    assert not f.matches_timer and f.timer_verdicts == {"faster": 0, "within noise": 1, "slower": 1}


def test_profiled_forward_against_e2e_flips_beyond_the_noise_and_says_why_only_where_idle():
    recs = [R.inference(range_ms=10.0), R.inference("medium", range_ms=20.0)]
    same = facts.forward_check(frame(recs, [R.e2e(forward_ms=9.9), R.e2e("medium", forward_ms=20.2)]))
    assert same.e2e_verdicts == {"faster": 0, "within noise": 2, "slower": 0} and not same.slowed_where_idle
    # both slowed to 20 ms from an unprofiled 10: 9.8 ms of kernels keep the GPU busy, 2 ms leave it idle
    busy = facts.forward_check(frame([R.inference(class_ms={"matmul": 9.8}, range_ms=20.0)], [R.e2e(forward_ms=10.0)]))
    idle = facts.forward_check(frame([R.inference(class_ms={"matmul": 2.0}, range_ms=20.0)], [R.e2e(forward_ms=10.0)]))
    assert busy.e2e_verdicts["slower"] == idle.e2e_verdicts["slower"] == 1
    assert idle.slower_busy.median == pytest.approx(0.2) and idle.slowed_where_idle and not busy.slowed_where_idle


def test_a_profiled_forward_inside_the_e2e_trials_interval_is_within_the_noise():
    recs = [R.inference(range_ms=36.0)]
    wide = facts.forward_check(frame(recs, [R.e2e(forward_ms=45.0, interval=[29.0, 56.0])]))
    assert wide.e2e_verdicts == {"faster": 0, "within noise": 1, "slower": 0}
    tight = facts.forward_check(frame(recs, [R.e2e(forward_ms=45.0, interval=[44.0, 46.0])]))
    assert tight.e2e_verdicts == {"faster": 1, "within noise": 0, "slower": 0}


def test_only_eager_fp32_e2e_records_of_the_usual_warm_up_count_are_matched():
    odd, usual = R.e2e(forward_ms=5.0, warmup=0), [R.e2e(forward_ms=10.0), R.e2e("medium", forward_ms=5.0)]
    f = facts.forward_check(frame([R.inference(range_ms=10.0)], [odd, *usual]))
    assert f.e2e_verdicts == {"faster": 0, "within noise": 1, "slower": 0}


def test_top_kernel_is_the_most_frequent_and_backward_keeps_it_or_not():
    a, b = [("gemm_a", "matmul", 8.0)], [("gemm_b", "matmul", 8.0)]
    recs = [R.inference("small", 128, top=a), R.inference("small", 256, top=a), R.inference("medium", 128, top=b)]
    recs += [
        R.training("small", 128, fb_top=a),
        R.training("small", 256, fb_top=a),
        R.training("medium", 128, fb_top=b),
    ]
    f = facts.top_kernel(frame(recs))
    assert (f.top, f.top_cells, f.cells, f.launches.median) == ("gemm_a", 2, 3, 72.0)
    assert f.fb_same == f.fb_cells == 3
    recs[-1] = R.training("medium", 128, fb_top=[("gemm_dgrad", "matmul", 9.0)])
    f = facts.top_kernel(frame(recs))
    assert (f.fb_same, f.fb_cells, f.fb_most) == (2, 3, ("gemm_a", 2))


def test_kernels_other_than_matmuls_are_listed_only_above_the_share():
    above = {"matmul": 9.0, "elementwise": 0.7, "memory": 0.3}  # 7% and 3%
    f = facts.non_matmul(frame([R.inference(class_ms=above)]), facts.kernels_frame([R.inference(class_ms=above)]))
    assert list(f.kernels.label) == ["elementwise_kernel", "memory_kernel"]
    assert f.kernels.max_share.iloc[0] == pytest.approx(0.07) and f.share.median == pytest.approx(0.1)
    below = [R.inference(class_ms={"matmul": 9.8, "elementwise": 0.15, "memory": 0.05})]
    assert facts.non_matmul(frame(below), facts.kernels_frame(below)).kernels.empty


def test_fused_attention_is_not_a_matmul_and_plain_attention_has_none():
    """Issue 51: with a fused attention kernel the matmul share is the GEMMs' alone, and the attention
    kernel is listed in (c) by its own class; the plain model's kernels are matmuls and softmax pieces."""
    fused = R.inference(class_ms={"matmul": 6.0, "attention": 3.0, "elementwise": 1.0})
    f = facts.non_matmul(frame([fused]), facts.kernels_frame([fused]))
    assert f.share.median == pytest.approx(0.4) and dict(zip(f.kernels.label, f.kernels["class"])) == {
        "attention_kernel": "attention",
        "elementwise_kernel": "elementwise",
    }
    plain = R.inference()
    assert "attention" not in set(facts.kernels_frame([plain])["class"])
    assert facts.non_matmul(frame([plain]), facts.kernels_frame([plain])).share.median == pytest.approx(0.2)


def test_matmul_share_lower_or_higher_in_training():
    lower = facts.training_step(frame([R.inference(), R.training()]))  # 80% against 72%
    assert lower.cells == 1 and lower.change_points.median == pytest.approx(100 * (24 / 33.5 - 0.8))
    assert lower.backward_over_forward.median == pytest.approx(2.0)
    higher = facts.training_step(frame([R.inference(), R.training(class_ms={"matmul": 60.0, "elementwise": 2.0})]))
    assert higher.change_points.median > 0 and set(higher.classes) == {"elementwise"}


def test_adamw_named_or_counted_by_its_range():
    named = facts.training_step(frame([R.inference(), R.training()]))
    assert named.optimizer_named and named.optimizer.median == pytest.approx(3.0 / 33.5)
    rec = R.training(class_ms={"matmul": 24.0, "elementwise": 8.0})  # AdamW's kernels counted as elementwise
    rec["metrics"]["phases"]["optimizer_step"]["kernel_ms_per_step"] = 3.2
    unnamed = facts.training_step(frame([R.inference(), rec]))
    assert not unnamed.optimizer_named and unnamed.optimizer.median == pytest.approx(0.1)


def test_training_facts_leave_out_the_cells_that_ran_out_of_memory():
    recs = [R.inference(), R.training(), R.inference("xl", 1024), R.training("xl", 1024, status="oom")]
    assert facts.training_step(frame(recs)).cells == 1
    assert facts.oom_cells(recs) == ["xl ctx 1024 fp32 training"]
    assert facts.training_step(frame([R.inference()])) is None


def test_softmax_slower_per_flop_or_not_and_fp32_cells_first():
    slow = facts.attention(frame([R.inference(att=R.attention(0.2, 0.5, 0.2))]))
    assert slow.time_ratio.median == pytest.approx(0.5 / 0.4) and slow.flops_ratio.median == pytest.approx(5 / 256)
    assert slow.per_flop.median == pytest.approx(1.25 * 256 / 5)
    assert slow.matmul_rate.median == pytest.approx(2e10 / 0.4e-3)
    fast = facts.attention(frame([R.inference(att=R.attention(0.2, 0.001, 0.2))]))
    assert fast.per_flop.median < 1
    both = [R.inference(precision="bf16", att=R.attention(0.05, 0.5, 0.05)), R.inference(att=R.attention())]
    assert (facts.attention(frame(both)).cells, facts.attention(frame(both)).precision) == (1, "fp32")
