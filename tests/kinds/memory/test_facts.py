"""The memory report's facts from synthetic records: every verdict with records on both sides of it."""

from __future__ import annotations

import pytest

from lmperf.core.sizes import config_from_name, parameter_count
from lmperf.core.units import MIB
from lmperf.kinds.memory import facts as F

from .records import cell, inference, record, training

PEAK, PARAMS = 10_000.0, 4 * parameter_count(config_from_name("2.7B")) / MIB


def steps(*records) -> list[F.Step]:
    return F.steps(list(records))


def test_each_stage_shows_only_beyond_the_visible_share_and_the_verdict_counts_cells():
    names = ("forward rises", "optimizer step has a transient", "zero_grad drops")
    for move, name in zip(("forward_rise", "transient", "gradients"), names):
        for share, hidden in ((0.5, True), (2, False)):  # a stage moves active memory by share × VISIBLE_SHARE × PEAK
            base = dict(start=5000.0, forward_rise=3000.0, gradients=1000.0, transient=1000.0)
            base[move] = F.VISIBLE_SHARE * PEAK * share
            (s,) = steps(record(cell(), training(backward_rise=PEAK - base["start"] - base["forward_rise"], **base)))
            assert (name in s.hidden) == hidden and len(s.hidden) == hidden
    still = record(cell(256), training(forward_rise=3000.0, gradients=3000.0, transient=5000.0))
    shown = record(cell(), training(forward_rise=3000.0, gradients=1000.0))
    assert steps(still)[0].hidden == ("backward changes active memory",)  # no net change, no excursion
    forward_only = record(cell(mode="inference"), inference())
    verdicts = [F.stage_facts(steps(*r)).verdict for r in ([shown], [shown, still], [still], [forward_only])]
    assert verdicts == ["yes", "partly", "no", None]


def test_stages_and_peaks_read_from_the_phases_and_the_account_from_what_autograd_saved():
    a = record(cell(128), training(start=1000, forward_rise=300, gradients=100, transient=100))
    b = record(cell(512), training(start=1000, forward_rise=900, gradients=100, transient=200))
    f = F.stage_facts(steps(a, b, record(cell(128, mode="inference"), inference(base=400, rise=30))))
    assert f.spans == {"forward": (300, 900), "gradients": (100, 100), "transient": (100, 200), "zero_grad": (100, 100)}
    assert (f.inference_base, f.inference_rise, f.parameters_mib) == ((400, 400), 30, pytest.approx(PARAMS))
    for saved, phase in ((2 * PARAMS * 0.9, "optimizer step"), (2 * PARAMS * 1.1, "end of forward")):
        (s,) = steps(record(cell(), training(saved_for_backward_mib=saved)))  # 3 P + saved against 5 P
        assert s.predicted == (pytest.approx(max(3 * PARAMS + saved, 5 * PARAMS)), phase)
    records = []
    for c, phase in ((128, "optimizer_step"), (256, "optimizer_step"), (512, "backward")):
        m = training(saved_for_backward_mib=1.0) | {"replay_peak_active_mib": 5 * PARAMS * 1.01, "peak_phase": phase}
        records.append(record(cell(c), m))
    oom = record(cell(1024), {"oom_events": []}, status="oom", reason="CUDA out of memory")
    p = F.peak_facts(steps(*records, oom, record(cell(128, mode="inference"), inference(base=100, rise=20))))
    assert p.by_phase == {"optimizer_step": (128, 256), "backward": (512,)}
    assert p.span("inference") == (120, 120)
    assert p.account_error == pytest.approx(0.01 / 1.01) and [s.context for s in p.out_of_memory] == [1024]


def peak(precision: str, value: float, interval=None, ctx: int = 128) -> dict:
    metrics = inference() | {"peak_allocated_mib": value}
    if interval:  # a cell measured in three trials
        metrics |= {"peak_allocated_mib_interval": list(interval), "trials": [{}, {}, {}]}
    return record(cell(ctx, precision, "inference"), metrics)


def test_bf16_against_fp32_beyond_the_margin_or_the_intervals_only():
    edge = 2 * F.SAME_MEMORY_MARGIN  # stats.compare doubles the margin for cells measured once
    for factor, verdict in ((1 - 2 * edge, "lower"), (1 + 2 * edge, "higher"), (1 + edge / 2, "within noise")):
        assert F.precision_facts(steps(peak("fp32", 1000.0), peak("bf16", 1000.0 * factor))).peaks[0].verdict == verdict
    fp32 = peak("fp32", 1000.0, (995.0, 1005.0))
    assert F.precision_facts(steps(fp32, peak("bf16", 900.0, (895.0, 905.0)))).peaks[0].verdict == "lower"
    assert F.precision_facts(steps(fp32, peak("bf16", 900.0, (800.0, 1100.0)))).peaks[0].verdict == "within noise"
    oom = record(cell(512, "fp32", "inference"), {"oom_events": []}, status="oom", reason="out of memory")
    f = F.precision_facts(steps(peak("bf16", 900.0, ctx=512), oom))
    assert f.fit_changes == ((512, "inference", "oom", "ok"),) and f.peaks == ()


def test_the_largest_allocations_named_grouped_and_counted():
    shape, scores = (4, 32, 512, 512), 4 * 32 * 512 * 512 * 4
    names = [F.allocation_name({"size_bytes": b}, shape) for b in (scores, scores // 2, scores + 512)]
    assert names == ["score-sized (fp32)", "score-sized (bf16)", "—"]

    def top(frames, size=scores, category=None, name=None, phase="forward"):
        return dict(size_bytes=size, size_mib=size / MIB, allocated_in=phase, category=category, name=name) | {
            "frames": frames
        }

    tops = [top(["attention.py:35 softmax"])] * 3 + [top(["attention.py:46 plain_attention"])]
    tops.append(top(["model.py:30 __init__"], 100 * MIB, "parameters", "w1", "before recording"))
    fp32, bf16 = (record(cell(512, p), training(top_allocations=tops)) for p in ("fp32", "bf16"))
    f = F.top_facts(steps(bf16, record(cell(128), training(top_allocations=tops[:1])), fp32), "training")
    assert (f.step.precision, f.step.context, len(f.groups)) == ("fp32", 512, 3)
    assert f.kinds() == [("score-sized (fp32)", 4, 128.0), ("parameters", 1, 100.0)]
    assert F.top_facts(steps(fp32), "inference") is None
