"""Facts of memory_profiling (d) and (e): the residual-stream tensor and the largest allocations."""

from __future__ import annotations

from lmperf.core.units import MIB
from lmperf.kinds.memory import allocations as A

from .records import cell, record, training_metrics


def _matches(ctx: int, count: int, precision: str = "fp32", mode: str = "training") -> dict:
    size = 4 * ctx * 2560 * 4
    match = {"size_bytes": size, "count": count, "by_phase": {"forward": count}, "sites": [{"frames": "m.py:1 f"}]}
    return record(cell(ctx, precision, mode), training_metrics(size_matches={"residual_stream": match}))


def test_residual_stream_of_the_reference_hyper_parameters():
    # 2.7B: d_model 2560; batch 4 at context 512, fp32: 4 · 512 · 2560 · 4 bytes, counted by hand
    f = A.residual_facts([], "2.7B", 4, 512)
    assert f.nbytes == 20_971_520 and f.mib == 20.0
    assert f.mib_at(128) == 5.0
    assert f.confirmation is None and f.other_contexts == ()


def test_the_trace_confirms_at_the_reference_context_and_longest_flips():
    records = [_matches(128, 7), _matches(512, 3), _matches(512, 11, "bf16"), _matches(512, 0, mode="inference")]
    f = A.residual_facts(records, "2.7B", 4, 512)
    assert (f.confirmation.count, f.confirmation.precision) == (11, "bf16")
    assert f.other_contexts == (128,) and f.longest
    assert not A.residual_facts(records, "2.7B", 4, 128).longest  # 512 was profiled too


def test_score_sized_only_at_exactly_one_layers_scores():
    shape = (4, 32, 512, 512)
    elements = 4 * 32 * 512 * 512
    assert A.score_sized(elements * 4, shape) == "score-sized (fp32)"
    assert A.score_sized(elements * 2, shape) == "score-sized (bf16)"
    assert A.score_sized(elements * 4 + 512, shape) == "—"


def _top(size_bytes: int, frames: list[str], category=None, name=None, phase="forward") -> dict:
    return {
        "size_bytes": size_bytes,
        "size_mib": size_bytes / MIB,
        "allocated_in": phase,
        "category": category,
        "name": name,
        "frames": frames,
    }


def test_largest_allocations_grouped_and_counted():
    scores = 4 * 32 * 512 * 512 * 4
    tops = [_top(scores, ["attention.py:35 softmax"])] * 3 + [
        _top(scores, ["attention.py:46 plain_attention"]),
        _top(100 * MIB, ["model.py:30 __init__"], "parameters", "layers.0.ffn.w1.weight", "before recording"),
    ]
    metrics = training_metrics(top_allocations=tops, live_allocations_at_peak=42)
    fp32 = record(cell(512), metrics)
    bf16 = record(cell(512, "bf16"), metrics)
    shorter = record(cell(128), training_metrics(top_allocations=tops[:1]))
    assert A.representative([bf16, shorter, fp32], "training") is fp32
    f = A.top_facts([bf16, fp32], "training")
    assert f.count == 5 and len(f.groups) == 3
    assert f.kinds() == [("score-sized (fp32)", 4, 128.0), ("parameters", 1, 100.0)]
    assert f.model_lines() == ("attention.py:35 softmax", "attention.py:46 plain_attention", "model.py:30 __init__")
    assert A.top_facts([fp32], "inference") is None
