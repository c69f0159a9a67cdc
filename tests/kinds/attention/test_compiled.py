"""torch_compile (a): compiled against plain, verdicts on both sides of the noise, and the answer."""

from __future__ import annotations

import pytest

from lmperf.core.stats import SAME_MARGIN
from lmperf.kinds.attention import compiled, facts, sections

from .report_records import plain_oom, record


def _pair(plain_ms, compiled_ms, plain_interval=None, compiled_interval=None, trials=1, n=4096):
    return [
        record("plain", 64, n, fwd=plain_ms, bwd=3 * plain_ms, fwd_interval=plain_interval, trials=trials),
        record("compiled", 64, n, fwd=compiled_ms, bwd=compiled_ms, fwd_interval=compiled_interval, trials=trials),
    ]


def _verdict(records, phase="forward"):
    table = compiled.compile_frame(facts.frame(records))
    return table[f"{phase}_verdict"].iloc[0], table[f"{phase}_speedup"].iloc[0]


def test_faster_with_tight_intervals_within_noise_when_they_overlap():
    # compiled 1.3x faster, both measured in 5 trials with tight intervals: faster
    tight = _pair(1.3, 1.0, (1.29, 1.31), (0.99, 1.01), trials=5)
    assert _verdict(tight) == ("faster", pytest.approx(1.3))
    # the same medians with wide, overlapping intervals: within the noise
    wide = _pair(1.3, 1.0, (0.9, 1.7), (0.8, 1.4), trials=5)
    assert _verdict(wide)[0] == "within noise"


def test_single_trials_need_twice_the_margin():
    # no intervals: "the same" reaches 2 x SAME_MARGIN either side of 1
    assert _verdict(_pair(1 + 1.5 * SAME_MARGIN, 1.0))[0] == "within noise"
    assert _verdict(_pair(1 + 3 * SAME_MARGIN, 1.0))[0] == "faster"
    assert _verdict(_pair(1.0, 1 + 3 * SAME_MARGIN))[0] == "slower"


def test_backward_is_judged_on_its_own():
    verdict, speedup = _verdict(_pair(1.0, 1.0), "backward")  # plain backward 3.0 ms, compiled 1.0 ms
    assert verdict == "faster" and speedup == pytest.approx(3.0)


def test_phase_counts_and_ranges():
    records = []
    for n, plain_ms in ((256, 0.5), (1024, 1.01), (4096, 2.0), (8192, 2.5)):
        records += _pair(plain_ms, 1.0, n=n)
    p = compiled.phase_comparison(compiled.compile_frame(facts.frame(records)), "forward")
    assert (p.faster, p.slower, p.same) == (((64, 4096), (64, 8192)), ((64, 256),), ((64, 1024),))
    assert (p.speedup_min, p.speedup_max) == (pytest.approx(0.5), pytest.approx(2.5))
    assert sections.phase_sentence(p) == (
        "Forward: compiled is faster in 2 (N = 4096–8192), slower in 1 (N = 256) and within the noise in 1 of 4 "
        "cells; median speed-up 1.50× (0.50×–2.50×)."
    )


def _boundary_records(compiled_oom_at: int):
    records = [record(i, 64, 16384, n2=None if i == "plain" else 2) for i in ("plain", "compiled")]
    records.append(plain_oom(64, 32768))
    records.append(record("compiled", 64, compiled_oom_at, "oom", n2=2, bwd=None, oom_phase="backward warm-up"))
    return records


def test_out_of_memory_at_the_same_length_in_another_phase_is_said_to_be_the_same_length():
    records = _boundary_records(32768)
    c = compiled.compile_facts(facts.frame(records), records, {})
    assert len(c.oom_differs) == 1 and c.same_oom_length
    records = _boundary_records(65536)
    c = compiled.compile_facts(facts.frame(records), records, {})
    assert not c.same_oom_length
    assert (
        sections.compile_answer(c)
        .split("plain keeps 3")[1]
        .startswith(
            ", and runs out of memory at a different length: at d = 64, plain runs out at N = 32768 (forward warm-up), "
            "compiled at N = 65536 (backward warm-up)."
        )
    )


def test_compile_answer_golden():
    records = _boundary_records(32768)
    for n, plain_ms in ((1024, 1.0), (4096, 2.0)):
        records += _pair(plain_ms, 1.0, n=n)
    c = compiled.compile_facts(facts.frame(records), records, {})
    assert sections.compile_answer(c) == (
        "Backward: compiled is faster in 2 (N = 1024–4096) and within the noise in 1 of 3 cells; median speed-up "
        "3.00× (1.00×–6.00×). "
        "Forward: compiled is faster in 1 (N = 4096) and within the noise in 2 of 3 cells; median speed-up "
        "1.00× (1.00×–2.00×). Compiled attention keeps 2 N×N matrices for backward where plain keeps 3, yet runs "
        "out of memory at the same length (N = 32768), only in the backward warm-up instead of the forward "
        "warm-up. The first compiled call took 0.9 s (tracing and compiling), outside every timed pass."
    )
