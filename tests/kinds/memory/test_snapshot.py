"""Snapshot analysis on synthetic ``torch.cuda.memory._snapshot()``s, against a random walk and counts by hand."""

from __future__ import annotations

import itertools
import random

import pytest

from lmperf.core.units import MIB
from lmperf.kinds.memory import snapshot as S

MARKER_FRAME = {"filename": "/x/src/lmperf/kinds/memory/cell.py", "line": 40, "name": S.MARKER_FUNCTION}
MODEL_FRAME = {"filename": "/x/src/lmperf/model.py", "line": 65, "name": "forward"}
TORCH_FRAME = {"filename": "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py", "line": 1, "name": "f"}


def alloc(addr, size, frames=()):
    return {"action": "alloc", "addr": addr, "size": size, "frames": list(frames)}


def free(addr, size):
    return [{"action": a, "addr": addr, "size": size} for a in ("free_requested", "free_completed")]


def marker(index, addr=10**9):
    size = S.MARKER_UNIT_BYTES * (index + 1)
    return [alloc(addr + index, size, [MARKER_FRAME, TORCH_FRAME]), *free(addr + index, size)]


def snapshot(trace, active_blocks):
    """One segment holding the blocks active at the end: (address, size, frames)."""
    blocks = [{"address": a, "size": s, "state": "active_allocated", "frames": list(f)} for a, s, f in active_blocks]
    return {"segments": [{"device": 0, "total_size": 1 << 30, "blocks": blocks}], "device_traces": [trace]}


def test_replay_recovers_allocations_from_before_recording_and_drops_stale_entries():
    # P lives throughout (end state only); Q is freed during recording (its alloc unseen);
    # D is a stale alloc whose free went unrecorded (not live at the end): dropped.
    trace = [alloc(5000, 999), alloc(100, 100, [MODEL_FRAME]), alloc(200, 200), *free(100, 100), alloc(300, 50)]
    trace += free(900, 300)  # Q
    rep = S.replay(snapshot(trace, [(10, 1000, [MODEL_FRAME]), (200, 200, []), (300, 50, [])]))
    assert rep.initial_active == 1000 + 300
    assert rep.active == [1300, 1400, 1600, 1600, 1500, 1550, 1550, 1250]
    assert rep.dropped_allocations == 1
    assert sorted((a.addr, a.size) for a in rep.allocations if a.live_at(2)) == [
        (10, 1000),
        (100, 100),
        (200, 200),
        (900, 300),
    ]


def test_replay_matches_an_independent_random_walk(fresh_seed):
    rng = random.Random(fresh_seed)
    trace, live, expected = [], {}, [0]
    for i in range(400):
        if live and rng.random() < 0.45:
            addr = rng.choice(sorted(live))
            trace += free(addr, live[addr])
            expected += [expected[-1], expected[-1] - live.pop(addr)]  # free_requested changes nothing
        else:
            live[1000 + i] = 512 * rng.randint(1, 64)
            trace.append(alloc(1000 + i, live[1000 + i]))
            expected.append(expected[-1] + live[1000 + i])
    assert S.replay(snapshot(trace, [(a, s, []) for a, s in live.items()])).active == expected[1:]


def test_downsample_keeps_the_peak_and_the_ends(fresh_seed):
    rng = random.Random(fresh_seed)
    series = list(itertools.accumulate(rng.randint(-100, 100) for _ in range(20000)))
    keep = S.downsample(series, 2000)
    assert len(keep) <= 2000 and keep == sorted(set(keep)) and keep[0] == 0 and keep[-1] == len(series) - 1
    assert max(series[i] for i in keep) == max(series) and min(series[i] for i in keep) == min(series)
    assert S.downsample(list(range(10)), 2000) == list(range(10))


def test_analyse_names_the_peak_and_its_largest_allocations():
    """Parameters and AdamW state (before recording, named by address), an activation, a gradient and an
    AdamW temporary: the peak is 2 + 4 + 3 + 2 = 11 MiB, in the backward, before the activation is freed."""
    stdlib = {"filename": "/usr/lib/python3.12/contextlib.py", "line": 1, "name": "x"}
    trace = marker(0) + [alloc(2000, 3 * MIB, [TORCH_FRAME, stdlib, MODEL_FRAME, TORCH_FRAME])] + marker(1)
    trace += [alloc(3000, 2 * MIB), *free(2000, 3 * MIB), alloc(1, 3 * S.MARKER_UNIT_BYTES)] + marker(
        2
    )  # no marker frame
    trace += [alloc(4000, 2 * MIB), *free(4000, 2 * MIB)] + marker(3) + free(3000, 2 * MIB) + marker(4)
    snap = snapshot(trace, [(1000, 2 * MIB, []), (1500, 4 * MIB, [])])
    labels = {1000: {"category": "parameters", "name": "w"}, 1500: {"category": "optimizer_state", "name": "exp_avg"}}
    phases = ["forward", "backward", "optimizer_step", "zero_grad", "end"]
    m = S.analyse(snap, phases, labels, top_k=3, max_points=8)
    assert m["replay_peak_active_mib"] == pytest.approx(11) and m["peak_phase"] == "backward"
    assert [(k["phase"], k["event"]) for k in m["phase_marks"]] == list(zip(phases, (0, 4, 11, 17, 22)))
    with pytest.raises(ValueError, match="out of order"):
        S.phase_marks(marker(1) + marker(0), phases)
    forward, _, step, zero_grad = m["phases"]
    assert (forward["start_active_mib"], forward["end_active_mib"]) == pytest.approx((6, 9))
    assert step["peak_active_mib"] - step["start_active_mib"] == pytest.approx(2, abs=1e-3)
    assert zero_grad["end_active_mib"] - zero_grad["start_active_mib"] == pytest.approx(-2, abs=1e-3)
    top = m["top_allocations"]
    assert [t["size_mib"] for t in top] == [4, 3, 2] and m["live_allocations_at_peak"] == 4
    assert (top[0]["category"], top[0]["allocated_in"]) == ("optimizer_state", "before recording")
    # frames outside torch, other packages and the standard library, innermost first
    assert (top[1]["category"], top[1]["allocated_in"]) == (None, "forward")
    assert top[1]["frames"] == ["lmperf/model.py:65 forward"]
    assert len(m["timeline"]["event"]) <= 8 and max(m["timeline"]["active_mib"]) == pytest.approx(11)
