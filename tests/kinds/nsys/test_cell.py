"""The nsys cell on a CPU (the torch.profiler fallback), from the CPU grid's jobs: its records, each size
reading its own blocks, the attention ranges' FLOPs, out of memory as a record, and nsys when required."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import cpu_jobs, run_job

from lmperf.core.record import load_record
from lmperf.kinds.nsys import cell
from lmperf.model import config_from_name
from lmperf.profiling.nsys import NsysError

SMALL = {"context_lengths": [8, 16], "vocab_size": 500, "batch_size": 2, "warmup_steps": 1, "measured_steps": 2}
PHASES = {
    "inference": {"inference_forward"},
    "training": {"forward", "backward", "optimizer_step", "forward_backward", "training_step"},
}


def job_of(root: Path, precision: str = "fp32", **changes):
    return next(j for j in cpu_jobs("nsys", root, **SMALL | changes) if j.settings["precision"] == precision)


def run(job) -> dict[tuple, dict]:
    assert cell.main(["--device", "cpu", "--job", job.argument()]) == 0
    return {(c["model"], c["context_length"], c["mode"]): load_record(p) for p, c in job.records.items()}


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    job = job_of(tmp_path_factory.mktemp("nsys"))
    assert job.settings["models"] == ["mini", "tiny"]  # largest first, in one process
    return job, run(job)


def test_every_record_is_written_with_its_phases_and_settings(fp32):
    job, records = fp32
    assert len(records) == 8
    for (_, _, mode), r in records.items():
        m = r["metrics"]
        assert r["status"] == "ok" and r["provenance"]["settings"] == job.settings
        assert m["profiler"] == "torch.profiler" and m["profiler_note"] == "no CUDA"
        assert set(m["phases"]) == PHASES[mode] and m["unattributed_kernels"] == 0
        fwd = m["phases"]["inference_forward" if mode == "inference" else "forward"]
        assert fwd["steps"] == 2 and len(fwd["range_ms_samples"]) == 2
        # operators' self times inside a forward add up to no more than the forward's range
        assert 0 < fwd["kernel_ms_per_step"] <= fwd["range_ms_mean"] * 1.01


def test_attention_ranges_count_every_layer_and_their_flops(fp32):
    for model in ("mini", "tiny"):
        att = fp32[1][(model, 16, "inference")]["metrics"]["attention"]["ranges"]
        c = config_from_name(model)
        scores = c.num_layers * 2 * c.num_heads * 16 * 16  # B = 2
        assert att["computing attention scores"]["flops_per_step"] == 2 * scores * c.d_head
        assert att["computing softmax"]["flops_per_step"] == 5 * scores
        assert {a["range_count_per_step"] for a in att.values()} == {c.num_layers}
        assert att["final matmul"]["matmul_ms_per_step"] > 0 and att["computing softmax"]["matmul_ms_per_step"] == 0


def test_out_of_memory_ends_its_block_alone_and_each_size_reads_its_own_blocks(fp32, tmp_path, monkeypatch):
    """tiny alone, its training at 16 out of memory: its other blocks are those of tiny beside mini (the same
    operators per step), so each size of the shared capture read only its own part."""
    real = cell.step

    def step(model, optimizer, batch, mode, *args):
        if mode == "training" and batch[0].shape[-1] == 16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB (simulated)")
        return real(model, optimizer, batch, mode, *args)

    monkeypatch.setattr(cell, "step", step)
    alone = run(job_of(tmp_path, main={"models": ["tiny"], "precisions": ["fp32"]}))
    assert {k: r["status"] for k, r in alone.items() if r["status"] != "ok"} == {("tiny", 16, "training"): "oom"}
    assert alone[("tiny", 16, "training")]["reason"].startswith("training warm-up, ctx 16: OutOfMemoryError")
    for key in (("tiny", 8, "training"), ("tiny", 16, "inference")):
        launches = {p: s["launches_per_step"] for p, s in alone[key]["metrics"]["phases"].items()}
        assert launches == {p: s["launches_per_step"] for p, s in fp32[1][key]["metrics"]["phases"].items()}
    mini, tiny = (fp32[1][(m, 8, "inference")]["metrics"]["phases"]["inference_forward"] for m in ("mini", "tiny"))
    assert mini["launches_per_step"] > tiny["launches_per_step"]  # more layers


def test_the_runner_runs_the_bf16_job(tmp_path):
    job = job_of(tmp_path, "bf16", context_lengths=[8])
    run_job(job)
    assert {load_record(p)["status"] for p in job.records} == {"ok"} and len(job.records) == 2


def test_nsys_required_without_cuda_fails_and_writes_nothing(tmp_path):
    with pytest.raises(NsysError, match="profiler: nsys, but no CUDA"):
        run(job_of(tmp_path, profiler="nsys"))
    assert not list(tmp_path.rglob("*.json"))
