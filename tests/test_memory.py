"""Memory snapshot analysis on synthetic snapshots, the analytic account against autograd's
saved tensors, the memory cell's CPU (unsupported) path, its recording glue with a stand-in
history, and the report built from those records."""

from __future__ import annotations

import json
import pickle
import random
from dataclasses import replace

import pytest
import torch

from lmperf.core.record import load_record
from lmperf.kinds.memory import cell as memory_cell
from lmperf.kinds.memory import report as memory_report
from lmperf.kinds.memory import snapshot as memory
from lmperf.model import TransformerLM, config_from_name, parameter_count

MARKER_FRAME = {"filename": "/x/src/lmperf/cells/memory.py", "line": 80, "name": memory.MARKER_FUNCTION}
MODEL_FRAME = {"filename": "/x/src/lmperf/model.py", "line": 65, "name": "forward"}
TORCH_FRAME = {
    "filename": "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py",
    "line": 1775,
    "name": "_call_impl",
}


def alloc(addr, size, frames=()):
    return {"action": "alloc", "addr": addr, "size": size, "stream": 0, "frames": list(frames)}


def free(addr, size):
    return [
        {"action": "free_requested", "addr": addr, "size": size, "stream": 0},
        {"action": "free_completed", "addr": addr, "size": size, "stream": 0},
    ]


def marker(index, addr=10**9):
    size = memory.MARKER_UNIT_BYTES * (index + 1)
    return [alloc(addr + index, size, [MARKER_FRAME, TORCH_FRAME])] + free(addr + index, size)


def snapshot(trace, active_blocks, segment_total):
    """A snapshot dict shaped like torch.cuda.memory._snapshot()'s: one segment holding the
    blocks active at the end (address, size, requested_size, state, frames)."""
    blocks = [
        {"address": a, "size": s, "requested_size": s, "state": "active_allocated", "frames": list(f)}
        for a, s, f in active_blocks
    ]
    return {
        "segments": [{"device": 0, "address": 0, "total_size": segment_total, "blocks": blocks}],
        "device_traces": [trace],
    }


def test_replay_recovers_allocations_from_before_recording_and_drops_stale_entries():
    # P lives throughout (end state only); Q is freed during recording (its alloc unseen);
    # D is a stale alloc whose free went unrecorded (not live at the end): dropped.
    trace = [alloc(5000, 999)]  # 0: stale D
    trace += [alloc(100, 100, [MODEL_FRAME]), alloc(200, 200)]  # 1, 2
    trace += free(100, 100)  # 3, 4
    trace += [{"action": "segment_alloc", "addr": 0, "size": 2 << 20, "stream": 0}]  # 5
    trace += [alloc(300, 50)]  # 6
    trace += free(900, 300)  # 7, 8: Q
    snap = snapshot(trace, [(10, 1000, [MODEL_FRAME]), (200, 200, []), (300, 50, [])], 4 << 20)
    rep = memory.replay(snap)
    assert rep.initial_active == 1000 + 300
    assert rep.active == [1300, 1400, 1600, 1600, 1500, 1500, 1550, 1550, 1250]
    assert rep.peak_event == 2
    assert rep.dropped_allocations == 1
    assert rep.initial_reserved == 2 << 20 and rep.reserved[5:] == [4 << 20] * 4
    live = {(a.addr, a.size) for a in memory.live_at(rep, 2)}
    assert live == {(10, 1000), (900, 300), (100, 100), (200, 200)}


def test_replay_matches_an_independent_random_walk(fresh_seed):
    rng = random.Random(fresh_seed)
    trace, live, expected, current = [], {}, [], 0
    for i in range(400):
        if live and rng.random() < 0.45:
            addr = rng.choice(sorted(live))
            size = live.pop(addr)
            trace += free(addr, size)
            current -= size
            expected += [current + size, current]  # free_requested leaves active memory unchanged
        else:
            addr, size = 1000 + i, 512 * rng.randint(1, 64)
            live[addr] = size
            trace.append(alloc(addr, size))
            current += size
            expected.append(current)
    rep = memory.replay(snapshot(trace, [(a, s, []) for a, s in live.items()], 1 << 30))
    assert rep.active == expected and rep.initial_active == 0
    assert rep.active[rep.peak_event] == max(expected)


def test_phase_marks_read_the_marker_sizes_in_order():
    phases = ["forward", "backward", "end"]
    trace = marker(0) + [alloc(1, 4096, [MODEL_FRAME])] + marker(1) + free(1, 4096) + marker(2)
    # a plain allocation of a marker-like size without the marker frame is not a mark
    trace.insert(4, alloc(2, memory.MARKER_UNIT_BYTES * 2, [MODEL_FRAME]))
    marks = memory.phase_marks(trace, phases)
    assert marks == [{"phase": "forward", "event": 0}, {"phase": "backward", "event": 5}, {"phase": "end", "event": 10}]
    assert memory.phase_of_event(marks, 3) == "forward" and memory.phase_of_event(marks, -1) == "before recording"
    with pytest.raises(ValueError, match="out of order"):
        memory.phase_marks(marker(1) + marker(0), phases)


def test_downsample_keeps_the_peak_and_the_ends(fresh_seed):
    rng = random.Random(fresh_seed)
    series = [0]
    for _ in range(20000):
        series.append(series[-1] + rng.choice((-1, 1)) * rng.randint(0, 100))
    keep = memory.downsample(len(series), series, 2000)
    assert len(keep) <= 2000 and keep == sorted(set(keep))
    assert keep[0] == 0 and keep[-1] == len(series) - 1
    assert max(series[i] for i in keep) == max(series) and min(series[i] for i in keep) == min(series)
    assert memory.downsample(10, list(range(10)), 2000) == list(range(10))


def test_top_frames_skip_torch_internals_innermost_first():
    frames = [
        TORCH_FRAME,
        {"filename": "/venv/lib/python3.12/contextlib.py", "line": 1, "name": "x"},
        MODEL_FRAME,
        {"filename": "/x/src/lmperf/cells/memory.py", "line": 7, "name": "training_step"},
    ]
    assert memory.top_frames(frames, 2) == ["lmperf/model.py:65 forward", "lmperf/kinds/memory/cell.py:7 training_step"]
    assert memory.top_frames([TORCH_FRAME]) == []


def build_training_snapshot():
    """Parameters (before recording), an activation, a gradient and an AdamW temporary, with
    the marks of a training step; returns the snapshot, labels and what the peak must hold."""
    MiB = memory.MIB
    trace = marker(0)  # forward
    trace += [alloc(2000, 3 * MiB, [MODEL_FRAME, TORCH_FRAME])]  # activation
    trace += marker(1)  # backward
    trace += [alloc(3000, 2 * MiB)]  # gradient (no Python frames)
    trace += free(2000, 3 * MiB)
    trace += marker(2)  # optimizer_step
    trace += [
        alloc(
            4000,
            2 * MiB,
            [
                {"filename": "/v/site-packages/torch/optim/adamw.py", "line": 1, "name": "f"},
                {"filename": "/x/src/lmperf/cells/memory.py", "line": 9, "name": "training_step"},
            ],
        )
    ]
    trace += free(4000, 2 * MiB)
    trace += marker(3)  # zero_grad
    trace += free(3000, 2 * MiB)
    trace += marker(4)  # end
    param_frames = [{"filename": "/x/src/lmperf/model.py", "line": 60, "name": "__init__"}]
    snap = snapshot(trace, [(1000, 2 * MiB, param_frames), (1500, 4 * MiB, [])], 64 * MiB)
    labels = [
        {"mark": "forward", "addr": 1000, "category": "parameters", "name": "w"},
        {"mark": "forward", "addr": 1500, "category": "optimizer_state", "name": "exp_avg of w"},
        {"mark": "optimizer_step", "addr": 3000, "category": "gradients", "name": "grad of w"},
        # the activation's address seen at a mark where it is not live: must not label it
        {"mark": "zero_grad", "addr": 2000, "category": "gradients", "name": "stale"},
    ]
    return snap, labels


def test_analyse_names_the_peak_and_its_largest_allocations():
    snap, labels = build_training_snapshot()
    phases = memory_cell.PHASES["training"]
    m = memory.analyse(snap, phases, labels, top_k=3, max_points=8, match_sizes={"three_mib": 3 * memory.MIB})
    MiB = 1.0
    # peak: params 2 + AdamW 4 + activation 3 + gradient 2 = 11 MiB, in backward (before the activation is freed)
    assert m["replay_peak_active_mib"] == pytest.approx(11 * MiB)
    assert m["peak_phase"] == "backward"
    assert [p["phase"] for p in m["phases"]] == phases[:-1]
    fwd = m["phases"][0]
    assert fwd["start_active_mib"] == pytest.approx(6) and fwd["end_active_mib"] == pytest.approx(9)
    opt = m["phases"][2]
    assert opt["peak_active_mib"] - opt["start_active_mib"] == pytest.approx(2, abs=1e-3)
    assert m["phases"][3]["end_active_mib"] - m["phases"][3]["start_active_mib"] == pytest.approx(-2, abs=1e-3)
    top = m["top_allocations"]
    assert [t["size_mib"] for t in top] == [4, 3, 2]
    assert top[0]["category"] == "optimizer_state" and top[0]["allocated_in"] == "before recording"
    assert top[1]["category"] is None and top[1]["frames"][0] == "lmperf/model.py:65 forward"
    assert top[1]["allocated_in"] == "forward"
    assert m["breakdown_at_peak_mib"] == {"parameters": 2, "gradients": 2, "optimizer_state": 4, "other": 3}
    assert len(m["timeline"]["event"]) <= 8 and max(m["timeline"]["active_mib"]) == pytest.approx(11)
    match = m["size_matches"]["three_mib"]
    assert match["count"] == 1 and match["by_phase"] == {"forward": 1}
    assert match["sites"][0]["frames"].startswith("lmperf/model.py:65 forward")


def saved_bytes_by_hooks(config, batch, ctx, precision):
    """Distinct storages autograd saves in one forward + loss (parameters and tokens excluded)."""
    model = TransformerLM(config)
    tokens = torch.randint(0, config.vocab_size, (batch, ctx))
    saved = memory_cell.SavedBytes(
        {p.untyped_storage().data_ptr() for p in model.parameters()} | {tokens.untyped_storage().data_ptr()}
    )
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else torch.autocast("cpu", enabled=False)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t), amp:
        torch.nn.functional.cross_entropy(model(tokens).view(-1, config.vocab_size), tokens.view(-1))
    return saved.total


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_saved_activation_formula_matches_autograd(precision, fresh_seed):
    rng = random.Random(fresh_seed)
    heads = rng.choice([2, 4])
    config = replace(
        config_from_name("tiny"),
        d_model=16 * heads * rng.choice([1, 2]),
        d_ff=rng.choice([48, 96, 160]),
        num_layers=rng.randint(1, 3),
        num_heads=heads,
        vocab_size=rng.randint(50, 300),
        context_length=64,
    )
    batch, ctx = rng.randint(1, 3), rng.choice([8, 12, 20])
    torch.manual_seed(fresh_seed)
    expected = memory.saved_activation_bytes(
        config, batch, ctx, precision, autocast_device="cpu"
    ) + memory.autocast_weight_copy_bytes(config, precision)
    assert saved_bytes_by_hooks(config, batch, ctx, precision) == expected


def test_analytic_account_by_hand():
    config = config_from_name("2.7B")
    P = parameter_count(config)
    assert P == 3_406_809_600
    a = memory.analytic_account(config, 4, 128, "fp32", "training")
    assert a["parameters_mib"] == pytest.approx(4 * P / 2**20)
    assert a["optimizer_step_mib"] == pytest.approx(20 * P / 2**20)  # params, grads, m, v, sqrt(v) temp
    assert a["predicted_peak_mib"] == pytest.approx(max(a["end_of_forward_mib"], a["optimizer_step_mib"]))
    # training under autocast: autograd saves a bf16 copy of every matmul weight (32 blocks of
    # 4·d² + 3·d·d_ff, plus the head) for the backward
    bf16_train = memory.analytic_account(config, 4, 128, "bf16", "training")
    assert bf16_train["weight_copies_mib"] == pytest.approx(
        2 * (32 * (4 * 2560**2 + 3 * 2560 * 10240) + 10000 * 2560) / 2**20
    )
    # inference: autocast caches no copy of weight.T (a view), so one copy (the largest, the
    # feed-forward's 2560·10240, above the head's 10000·2560) is alive at a time
    bf16 = memory.analytic_account(config, 4, 128, "bf16", "inference")
    assert bf16["weight_copies_mib"] == pytest.approx(2 * 2560 * 10240 / 2**20)
    assert bf16["predicted_peak_mib"] == pytest.approx(
        memory.analytic_account(config, 4, 128, "fp32", "inference")["predicted_peak_mib"] + bf16["weight_copies_mib"]
    )
    # (d): one fp32 residual-stream tensor at batch 4, context 512: 4·512·2560·4 bytes = 20 MiB
    assert memory.residual_stream_bytes(config, 4, 512) == 20_971_520


TINY_ARGS = ["--device", "cpu", "--model", "tiny", "--context-length", "16", "--batch-size", "2"]


def test_cpu_cell_runs_the_steps_and_records_unsupported(tmp_path):
    out = str(tmp_path / "tiny_ctx16_fp32_{mode}.json")
    assert memory_cell.main(["--output", out, *TINY_ARGS]) == 0
    for mode in ("inference", "training"):
        r = load_record(out.format(mode=mode))
        assert r["status"] == "unsupported" and "CUDA" in r["reason"] and r["cell"]["mode"] == mode
    assert not list(tmp_path.glob("*.pickle"))


class StandInHistory(memory_cell.History):
    """Records marks and labels like History, on the CPU, and builds the snapshot from them:
    labelled parameters and AdamW state live throughout, gradients allocated in backward and freed
    by zero_grad, one activation per forward."""

    def __init__(self):
        super().__init__(torch.device("cpu"), 1000)

    @staticmethod
    def keep_state():
        pass

    def start(self, phases, label_fns):
        self.phases, self.labels, self.label_fns, self.recording, self._next = list(phases), [], label_fns, True, 0
        self.trace = []

    def mark(self, phase):
        if not self.recording:
            return
        assert self.phases[self._next] == phase
        for category, name, tensor in self.label_fns.get(phase, lambda: [])():
            self.labels.append(
                {
                    "mark": phase,
                    "addr": tensor.untyped_storage().data_ptr(),
                    "category": category,
                    "name": name,
                    "size": tensor.untyped_storage().nbytes(),
                }
            )
        self.trace += marker(self._next)
        if phase == "forward":
            self.trace.append(alloc(77, 3 << 20, [MODEL_FRAME]))
        if phase in ("backward", "end") and any(e["addr"] == 77 and e["action"] == "alloc" for e in self.trace):
            if not any(e["addr"] == 77 and e["action"] == "free_completed" for e in self.trace):
                self.trace += free(77, 3 << 20)
        if phase == "optimizer_step":
            for label in self.labels:
                if label["category"] == "gradients":
                    self.trace.insert(len(self.trace) - 3, alloc(label["addr"], label["size"]))
        if phase == "end":
            self.trace += [
                e
                for label in self.labels
                if label["category"] == "gradients"
                for e in free(label["addr"], label["size"])
            ]
        self._next += 1

    def stop(self):
        blocks = {(l["addr"], l["size"]) for l in self.labels if l["category"] != "gradients"}
        snap = snapshot(self.trace, [(a, s, []) for a, s in blocks], 1 << 30)
        self.recording = False
        rep = memory.replay(snap)
        return snap, {"peak_allocated_mib": max(rep.active) / memory.MIB, "peak_reserved_mib": 1024.0}


REAL_SESSION = memory_cell.Session


def run_stand_in(tmp_path, monkeypatch, precision="fp32"):
    monkeypatch.setattr(memory_cell, "Session", lambda args, device: REAL_SESSION(args, device, StandInHistory()))
    output = str(tmp_path / f"tiny_ctx16_{precision}_{{mode}}.json")
    assert memory_cell.main(["--output", output, *TINY_ARGS, "--precision", precision]) == 0
    return [load_record(output.format(mode=m)) for m in ("inference", "training")]


def test_recording_glue_labels_phases_and_writes_a_loadable_snapshot(tmp_path, monkeypatch):
    inference, training = run_stand_in(tmp_path, monkeypatch)
    assert inference["status"] == training["status"] == "ok"
    m = training["metrics"]
    assert [p["phase"] for p in m["phases"]] == ["forward", "backward", "optimizer_step", "zero_grad"]
    config = config_from_name("tiny", context_length=16)
    P = parameter_count(config)
    # labels found parameters, gradients and both AdamW moments by address
    assert m["breakdown_at_peak_mib"]["parameters"] == pytest.approx(4 * P / memory.MIB)
    assert m["breakdown_at_peak_mib"]["optimizer_state"] == pytest.approx(8 * P / memory.MIB)
    assert m["breakdown_at_peak_mib"]["gradients"] == pytest.approx(4 * P / memory.MIB)
    assert m["saved_for_backward_mib"] * memory.MIB == memory.saved_activation_bytes(config, 2, 16, "fp32", "cpu")
    assert m["analytic"]["parameter_count"] == P and m["warmup_completed"] is True
    assert m["residual_stream"]["reference"]["bytes"] == 2 * 512 * 64 * 4
    with open(m["snapshot_path"], "rb") as f:
        snap = pickle.load(f)
    assert set(snap) >= {"segments", "device_traces"}
    json.dumps(training)  # the record holds plain JSON


def test_out_of_memory_keeps_the_history_up_to_the_failure(tmp_path, monkeypatch):
    real_step = memory_cell.training_step
    calls = {"n": 0}

    def failing_step(model, optimizer, tokens, targets, args, device, history, saved=None):
        calls["n"] += 1
        if calls["n"] > args.warmup_steps:  # the recorded step fails in backward
            history.mark("forward")
            history.mark("backward")
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real_step(model, optimizer, tokens, targets, args, device, history, saved)

    monkeypatch.setattr(memory_cell, "training_step", failing_step)
    _, training = run_stand_in(tmp_path, monkeypatch)
    assert training["status"] == "oom" and "recorded step" in training["reason"]
    assert training["metrics"]["phase_marks"][-1]["phase"] == "backward"
    assert training["metrics"]["warmup_completed"] is True


def test_report_from_records(tmp_path, monkeypatch):
    records = run_stand_in(tmp_path / "fp32", monkeypatch, "fp32") + run_stand_in(
        tmp_path / "bf16", monkeypatch, "bf16"
    )
    paths = []
    for r in records:
        p = tmp_path / f"{r['cell']['precision']}_{r['cell']['mode']}.json"
        p.write_text(json.dumps(r))
        paths.append(str(p))
    out = tmp_path / "out"
    assert (
        memory_report.main(
            [
                "--device",
                "cpu",
                "--csv",
                str(out / "m.csv"),
                "--top-csv",
                str(out / "t.csv"),
                "--sections-dir",
                str(out),
                "--figures-dir",
                str(out / "fig"),
                "--reference-model",
                "tiny",
                "--batch-size",
                "2",
                "--reference-context-length",
                "16",
                "--records",
                *paths,
            ]
        )
        == 0
    )
    text = (out / "memory_profiling.md").read_text()
    for part in ("### (a)", "### (b)", "### (c)", "### (d)", "### (e)"):
        assert part in text
    # (d): 2 · 16 · 64 · 4 bytes, derived and matched
    assert "2 · 16 · 64 · 4 bytes = 8,192 bytes" in text
    # (b): the peak read from the records
    fp32_training = next(r for r in records if r["cell"]["precision"] == "fp32" and r["cell"]["mode"] == "training")
    assert f"| {fp32_training['metrics']['peak_allocated_mib'] / 1024:.2f} " in text
    # (e): the labelled AdamW state and parameters appear among the largest allocations
    assert "optimizer_state: exp_avg" in text
    for r in records:
        assert (out / "fig" / memory_report.timeline_name(r["cell"])).stat().st_size > 1000
    assert (out / "fig" / "memory_peaks.png").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA memory history needs a GPU")
def test_cuda_cell_records_history_with_phases(tmp_path):
    from lmperf.core.device import device_slug

    out = str(tmp_path / "tiny_ctx64_{mode}.json")
    assert (
        memory_cell.main(
            [
                "--output",
                out,
                "--device",
                device_slug(),
                "--model",
                "tiny",
                "--context-length",
                "64",
                "--batch-size",
                "2",
                "--precision",
                "bf16",
            ]
        )
        == 0
    )
    for mode in ("inference", "training"):
        r = load_record(out.format(mode=mode))
        m = r["metrics"]
        assert r["status"] == "ok"
        assert [p["phase"] for p in m["phase_marks"]] == memory_cell.PHASES[mode]
        # the replayed peak (requested sizes) is the allocator's peak (512-byte blocks) within rounding
        assert m["replay_peak_active_mib"] <= m["peak_allocated_mib"] + 1e-6
        assert m["replay_peak_active_mib"] > 0.9 * m["peak_allocated_mib"]
        assert m["size_matches"]["residual_stream"]["count"] > 0
        assert m["breakdown_at_peak_mib"]["parameters"] > 0
