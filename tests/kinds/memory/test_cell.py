"""The memory cell: the grid's job through the runner, the recording glue with a stand-in for the allocator's
history, out of memory, and the account's weight copies against what autograd saves."""

from __future__ import annotations

import collections
import pickle
import random
import subprocess
import sys

import pytest
import torch
from conftest import cpu_grid, cpu_jobs, redirect

from lmperf.core.cell import CellJob
from lmperf.core.device import device_slug
from lmperf.core.record import PartialOutOfMemory, load_record
from lmperf.core.units import MIB
from lmperf.kinds.memory import account, cell, grid
from lmperf.model import Linear, TransformerLM, config_from_name

from .test_snapshot import marker, snapshot


def test_the_grid_job_through_the_runner(tmp_path):
    """On a CPU the steps run and each record says unsupported; on a GPU the allocator's history is recorded."""
    slug = device_slug()
    (job,) = [redirect(j, tmp_path) for j in grid.jobs(cpu_grid()["memory"] | {"precisions": ["bf16"]}, slug)]
    subprocess.run([sys.executable, "-m", "lmperf", job.cell, "--device", slug, "--job", job.argument()], check=True)
    for path, c in job.records.items():
        r = load_record(path)
        assert r["cell"] == c and r["provenance"]["settings"] == job.settings
        if slug == "cpu":
            assert r["status"] == "unsupported" and "CUDA" in r["reason"] and not list(tmp_path.rglob("*.pickle"))
            continue
        m = r["metrics"]
        assert [p["phase"] for p in m["phase_marks"]] == cell.PHASES[c["mode"]]
        # the replay counts requested bytes, the allocator whole 512-byte blocks
        assert 0.9 * m["peak_allocated_mib"] < m["replay_peak_active_mib"] <= m["peak_allocated_mib"] + 1e-6
        assert c["mode"] == "training" or any(a["category"] == "parameters" for a in m["top_allocations"])


class StandIn(cell.History):
    """The allocator's history on a CPU: the phase markers as the trace, and as the end state a block of 1 MiB
    at every storage the session names (parameters, AdamW's moments), live throughout."""

    def start(self):
        self.trace = []

    keep_state = start

    def mark(self, index):
        self.trace += marker(index)

    def stop(self):
        blocks = [(addr, MIB, []) for addr in self.session.labels()]
        return snapshot(self.trace, blocks), {"peak_allocated_mib": 1.0, "peak_reserved_mib": 1.0}


def measure(tmp_path, precision: str, mode: str = "training") -> tuple[dict, cell.Session]:
    job = cpu_jobs("memory", tmp_path, context_lengths=[16], precisions=[precision], top_allocations=1000)[0]
    stand_in = StandIn(torch.device("cpu"), 0)
    stand_in.session = cell.Session(CellJob("memory", "cpu", job.settings, job.output).args, stand_in.device, stand_in)
    return stand_in.session.measure(mode, job.output.format(mode=mode)), stand_in.session


def test_recording_glue_marks_the_phases_and_names_the_storages(tmp_path):
    m, s = measure(tmp_path, "bf16")
    assert [p["phase"] for p in m["phase_marks"]] == cell.PHASES["training"] and m["warmup_completed"]
    assert {"parameters", "optimizer_state"} <= {a["category"] for a in m["top_allocations"]}
    # what autograd saved holds the bf16 copy of every matmul weight (not excluded as a parameter)
    assert m["saved_for_backward_mib"] * MIB > account.weight_copy_bytes(s.config, "bf16")
    with open(m["snapshot_path"], "rb") as f:
        assert pickle.load(f)["device_traces"]  # the pickle PyTorch's memory viewer opens
    assert [p["phase"] for p in measure(tmp_path, "fp32", "inference")[0]["phase_marks"]] == ["forward", "end"]


def test_out_of_memory_keeps_the_history_up_to_the_failure(tmp_path, monkeypatch):
    real = cell.Session.step

    def failing(self, mode, mark, saved=None):
        if saved is None:  # the warm-up runs; the recorded step fails in the backward
            return real(self, mode, mark, saved)
        mark("forward")
        mark("backward")
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(cell.Session, "step", failing)
    with pytest.raises(PartialOutOfMemory, match="recorded step") as failure:
        measure(tmp_path, "fp32")
    assert failure.value.metrics["phase_marks"][-1]["phase"] == "backward" and failure.value.metrics["warmup_completed"]


def test_autocast_saves_a_bf16_copy_of_every_matmul_weight(fresh_seed):
    """The account's weight copies against the tensors autograd saves under CPU bf16 autocast."""
    rng = random.Random(fresh_seed)
    heads = rng.choice([2, 4])
    sizes = dict(d_model=16 * heads, d_ff=rng.choice([48, 96]), num_layers=rng.randint(1, 3), num_heads=heads)
    config = config_from_name("tiny", **sizes, vocab_size=rng.randint(50, 300), context_length=64)
    torch.manual_seed(fresh_seed)
    model, tokens = TransformerLM(config), torch.randint(0, config.vocab_size, (3, 7))
    saved = {}
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.setdefault(t.data_ptr(), t), lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    shapes = collections.Counter(tuple(m.weight.T.shape) for m in model.modules() if isinstance(m, Linear))
    copies = [t for t in saved.values() if t.dtype == torch.bfloat16 and tuple(t.shape) in shapes]
    assert collections.Counter(tuple(t.shape) for t in copies) == shapes
    assert sum(t.untyped_storage().nbytes() for t in copies) == account.weight_copy_bytes(config, "bf16")
