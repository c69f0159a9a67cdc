"""nsys_profile's facts: every verdict with synthetic records on both sides of it."""

from __future__ import annotations

import pytest

from lmperf.kinds.nsys import cells, facts

from . import records as R


def frame(recs: list[dict], e2e: list[dict] = ()) -> tuple:
    return cells.frame(recs, list(e2e)), cells.kernels_frame(recs)


# -- (a) the profiler against the timer and the unprofiled runs ----------------------------------


def test_profiler_matches_the_timer_only_within_the_noise():
    df, _ = frame([R.inference(range_ms=10.0, timer_ms=10.1), R.inference("medium", range_ms=20.0, timer_ms=20.0)])
    f = facts.forward_check(df)
    assert f.cells == 2 and f.matches_timer and f.over_timer.low == pytest.approx(10.0 / 10.1)
    df, _ = frame([R.inference(range_ms=12.0, timer_ms=10.0), R.inference("medium", range_ms=20.0, timer_ms=20.0)])
    f = facts.forward_check(df)
    assert not f.matches_timer and f.timer_verdicts == {"faster": 0, "within noise": 1, "slower": 1}


def test_profiled_forward_against_e2e_flips_beyond_the_noise():
    recs = [R.inference(range_ms=10.0), R.inference("medium", range_ms=20.0)]
    same = facts.forward_check(frame(recs, [R.e2e(forward_ms=9.9), R.e2e("medium", forward_ms=20.2)])[0])
    assert same.e2e_cells == 2 and same.e2e_verdicts["within noise"] == 2 and not same.slower_models
    slow = facts.forward_check(frame(recs, [R.e2e(forward_ms=5.0), R.e2e("medium", forward_ms=20.2)])[0])
    assert slow.e2e_verdicts == {"faster": 0, "within noise": 1, "slower": 1}
    assert slow.slower_models == (("small", pytest.approx(2.0)),)


def test_only_fp32_eager_e2e_records_of_the_usual_warm_up_count_are_matched():
    recs = [R.inference(range_ms=10.0)]
    odd = R.e2e(forward_ms=5.0)
    odd["cell"]["warmup_steps"] = 0
    other = R.e2e("medium", forward_ms=5.0)  # the usual count (5) is the one most records share
    f = facts.forward_check(frame(recs, [odd, R.e2e(forward_ms=10.0), other])[0])
    assert f.e2e_cells == 1 and f.e2e_verdicts["within noise"] == 1


def test_slowdown_is_put_down_to_launches_only_where_the_slowed_forwards_leave_the_gpu_idle():
    # the busy fraction: kernel time over the unprofiled (e2e) forward
    idle = R.inference(class_ms={"matmul": 4.0}, range_ms=20.0)  # 4 ms of kernels, e2e 8 ms: busy 50%
    busy = R.inference("medium", class_ms={"matmul": 19.0}, range_ms=20.0)  # e2e 19.5 ms: busy 97%
    f = facts.forward_check(frame([idle, busy], [R.e2e(forward_ms=8.0), R.e2e("medium", forward_ms=19.5)])[0])
    assert f.slower_idle == 1 and f.other_idle == 0 and f.slowdown_where_idle
    # the slowed cell keeps the GPU busy (95%) while the one within the noise does not: no such verdict
    slowed_busy = R.inference(class_ms={"matmul": 9.5}, range_ms=20.0)
    within_idle = R.inference("medium", class_ms={"matmul": 5.0}, range_ms=10.0)
    f = facts.forward_check(
        frame([slowed_busy, within_idle], [R.e2e(forward_ms=10.0), R.e2e("medium", forward_ms=10.0)])[0]
    )
    assert f.e2e_verdicts["slower"] == 1 and f.slower_idle == 0 and not f.slowdown_where_idle


def test_nvtx_cost_is_slower_only_beyond_the_noise_of_its_forwards():
    off = [10.0, 10.1, 9.9, 10.05, 9.95, 10.0, 10.02, 9.98, 10.01, 9.99]
    on_same = [v * 1.001 for v in off]
    on_slow = [v * 1.3 for v in off]
    same = facts.forward_check(frame([R.inference(nvtx=(off, on_same))])[0])
    slow = facts.forward_check(frame([R.inference(nvtx=(off, on_slow))])[0])
    assert same.nvtx_pairs == 1 and same.nvtx_verdicts["within noise"] == 1
    assert slow.nvtx_verdicts["slower"] == 1 and slow.nvtx_cost.median == pytest.approx(1.3)


# -- (b) the top kernel; bf16 beside fp32 ----------------------------------------------------------


def test_top_kernel_is_the_most_frequent_and_backward_keeps_it_or_not():
    a, b = [("gemm_a", "matmul", 8.0)], [("gemm_b", "matmul", 8.0)]
    recs = [
        R.inference("small", 128, top=a),
        R.inference("small", 256, top=a),
        R.inference("medium", 128, top=b),
        R.training("small", 128, fb_top=a),
        R.training("small", 256, fb_top=a),
        R.training("medium", 128, fb_top=b),
    ]
    f = facts.top_kernel(frame(recs)[0])
    assert (f.top, f.top_cells, f.others) == ("gemm_a", 2, (("gemm_b", 1),))
    assert f.launches == (("small", ((128, 72.0), (256, 72.0))),) and f.same_in_backward
    recs[-1] = R.training("medium", 128, fb_top=[("gemm_dgrad", "matmul", 9.0)])
    f = facts.top_kernel(frame(recs)[0])
    assert not f.same_in_backward and f.fb_same == 2 and f.fb_cells == 3


def test_bf16_faster_and_what_its_class_shares_show():
    """Issue 50: the bf16 ratio says faster or within the noise; what the time goes to comes from the
    class shares (matmul share of forward kernel time), not from the ratio."""
    recs = [R.inference(), R.inference(precision="bf16")]
    f = facts.bf16_forward(*frame(recs))
    assert f.time_verdicts["faster"] == 1 and f.time_ratio.median == pytest.approx(4.0 / 10.0)
    assert f.matmul_ratio.median == pytest.approx(0.1) and f.other_ratio.median == pytest.approx(3.2 / 2.0)
    assert f.matmul_share_bf16.median == pytest.approx(0.2) and not f.mostly_matmul
    assert f.top == ("elementwise_kernel", 1) and f.top_class == "elementwise"
    still = {"matmul": 7.0, "elementwise": 1.5, "reduction": 0.3, "memory": 1.2}  # 10.0 ms, matmuls 70%
    f = facts.bf16_forward(*frame([R.inference(), R.inference(precision="bf16", class_ms=still)]))
    assert f.time_verdicts["within noise"] == 1 and f.mostly_matmul


def test_bf16_runs_other_matmul_kernels_or_the_same():
    fp32 = R.inference(top=[("sgemm", "matmul", 8.0)])
    same = R.inference(precision="bf16", top=[("sgemm", "matmul", 0.8)])
    other = R.inference(precision="bf16", top=[("nvjet_bf16", "matmul", 0.8)])
    assert not facts.bf16_forward(*frame([fp32, same])).new_matmuls
    assert facts.bf16_forward(*frame([fp32, other])).new_matmuls


# -- (c) non-matmul kernels above the share ---------------------------------------------------------


def test_non_matmul_kernels_are_listed_only_above_the_share():
    above = {"matmul": 9.0, "elementwise": 0.7, "memory": 0.3}  # 7% and 3%
    below = {"matmul": 9.8, "elementwise": 0.15, "memory": 0.05}  # 1.5% and 0.5%
    f = facts.non_matmul(*frame([R.inference(class_ms=above)]))
    assert f.any and list(f.kernels.label) == ["elementwise_kernel", "memory_kernel"]
    assert f.kernels.max_share.iloc[0] == pytest.approx(0.07)
    f = facts.non_matmul(*frame([R.inference(class_ms=below)]))
    assert not f.any and f.share.median == pytest.approx(0.02)


# -- (d) a training step against inference ----------------------------------------------------------


def test_matmul_share_lower_or_higher_in_training():
    lower = facts.training_step(frame([R.inference(), R.training()])[0])  # 80% against 72%
    assert lower.cells == 1 and lower.matmul_lower and lower.lower_in_training == 1
    heavy = {"matmul": 60.0, "elementwise": 2.0, "optimizer": 1.0}
    higher = facts.training_step(frame([R.inference(), R.training(class_ms=heavy)])[0])
    assert not higher.matmul_lower and higher.change_points > 0
    assert lower.backward_over_forward.median == pytest.approx(2.0)


def test_adamw_named_or_counted_by_its_range():
    named = facts.training_step(frame([R.inference(), R.training()])[0])
    assert named.optimizer_named and named.optimizer.median == pytest.approx(3.0 / 33.5)
    elementwise = {"matmul": 24.0, "elementwise": 8.0}  # AdamW's kernels counted as elementwise
    rec = R.training(class_ms=elementwise)
    rec["metrics"]["phases"]["optimizer_step"]["kernel_ms_per_step"] = 3.2
    unnamed = facts.training_step(frame([R.inference(), rec])[0])
    assert not unnamed.optimizer_named and unnamed.optimizer.median == pytest.approx(0.1)


def test_training_facts_leave_out_the_cells_that_ran_out_of_memory():
    recs = [R.inference(), R.training(), R.inference("xl", 1024), R.training("xl", 1024, status="oom")]
    assert facts.training_step(frame(recs)[0]).cells == 1
    assert cells.oom_cells(recs) == ["xl ctx 1024 fp32 training"]


# -- (e) softmax against the attention matmuls ------------------------------------------------------


def test_softmax_slower_per_flop_or_not():
    slow = facts.attention(frame([R.inference(att=R.attention(0.2, 0.5, 0.2))])[0])
    assert slow.time_ratio.median == pytest.approx(0.5 / 0.4) and slow.flops_ratio.median == pytest.approx(5 / 256)
    assert slow.softmax_slower_per_flop and slow.per_flop.median == pytest.approx(1.25 * 256 / 5)
    fast = facts.attention(frame([R.inference(att=R.attention(0.2, 0.005, 0.2))])[0])
    assert not fast.softmax_slower_per_flop


def test_attention_reads_fp32_cells_and_gives_bf16_apart():
    recs = [
        R.inference(att=R.attention(0.2, 0.5, 0.2)),
        R.inference(precision="bf16", att=R.attention(0.05, 0.5, 0.05)),
    ]
    f = facts.attention(frame(recs)[0])
    assert f.cells == 1 and f.precision == "fp32" and f.bf16_time_ratio.median == pytest.approx(5.0)
