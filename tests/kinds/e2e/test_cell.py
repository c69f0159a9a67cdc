"""The e2e cell: a CPU grid job through the runner, errors, the GPU's busy share, compiled blocks."""

from __future__ import annotations

import copy
import dataclasses
import random
from pathlib import Path

import pytest
import torch

from lmperf.core import device
from lmperf.core.record import load_record
from lmperf.kinds.e2e import cell
from tests.conftest import cpu_jobs, run_job


def job_of(tmp_path, **settings):
    """The CPU grid's tiny fp32 eager plain cell at the default warm-up, with ``settings`` changed."""
    (job,) = [j for j in cpu_jobs("e2e", tmp_path) if j.name == "e2e__tiny_ctx32_fp32_eager_w2"]
    return dataclasses.replace(job, settings={**job.settings, **settings})


def run_in_process(job, slug: str = "cpu") -> dict:
    assert cell.main(["--device", slug, "--job", job.argument()]) == 0
    return load_record(job.output)


def test_a_grid_job_records_every_phase_through_the_runner(tmp_path):
    job = job_of(tmp_path)
    run_job(job)
    r, n = load_record(job.output), job.settings["measured_steps"]
    m = r["metrics"]
    assert r["status"] == "ok" and r["provenance"]["settings"] == job.settings
    for phase in ("forward", "backward", "optimizer_step", "training_step", "inference_forward"):
        assert len(m[f"{phase}_ms_samples"]) == n and m[f"{phase}_ms_mean"] > 0
    for i in range(n):  # the step is the sum of its phases, sample by sample
        parts = sum(m[f"{p}_ms_samples"][i] for p in cell.TRAINING_PHASES)
        assert m["training_step_ms_samples"][i] == pytest.approx(parts)
    tokens = job.settings["batch_size"] * job.settings["context_length"]
    assert m["training_step_tokens_per_s"] == pytest.approx(tokens / (m["training_step_ms_mean"] / 1e3))
    # the first (warm-up) step is timed apart, between start-up and the first measured step (ticks of 10 ms)
    first_step_end = m["process_start_to_first_step_s"] + m["training_first_step_ms"] / 1e3
    assert first_step_end <= m["process_start_to_first_measured_step_s"] + 0.02
    assert "gpu_busy_fraction" not in m  # measured on CUDA only


def test_out_of_memory_ends_a_part_alone_and_any_other_error_propagates_without_a_record(tmp_path, monkeypatch):
    def raises(error):
        def part(*args):
            raise error

        return part

    monkeypatch.setattr(cell, "measure_training", raises(torch.OutOfMemoryError("CUDA out of memory. Tried 9 GiB")))
    r = run_in_process(job_of(tmp_path))
    assert r["status"] == "oom" and r["reason"].startswith("training: CUDA out of memory")
    assert r["metrics"]["training_status"] == "oom" and r["metrics"]["inference_status"] == "ok"
    assert "forward_ms_mean" not in r["metrics"] and r["metrics"]["inference_forward_ms_mean"] > 0
    monkeypatch.setattr(cell, "measure_training", raises(RuntimeError("shape mismatch")))
    job = job_of(tmp_path / "broken")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_in_process(job)
    assert not Path(job.output).exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without CUDA does")
def test_without_cuda_another_devices_slug_is_refused_and_a_cuda_attention_unsupported(tmp_path):
    with pytest.raises(device.DeviceMismatch, match="results/h100/"):
        run_in_process(job_of(tmp_path), "h100")
    r = run_in_process(job_of(tmp_path, attention="sdpa_cudnn"))
    assert r["status"] == "unsupported" and "sdpa_cudnn" in r["reason"]


def test_covered_counts_overlapping_spans_once(fresh_seed):
    spans = [(a, a + random.randrange(1, 50)) for a in (random.randrange(0, 200) for _ in range(30))]
    timeline = {t for start, end in spans for t in range(start, end)}  # the reference: each covered unit once
    assert cell.covered(spans) == len(timeline) and cell.covered([]) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_events_agree_with_the_timer_and_the_profiled_step_gives_the_gpu_busy_share(tmp_path):
    job = job_of(tmp_path, model="small", context_length=256, measured_steps=5)
    m = run_in_process(job, device.device_slug())["metrics"]
    for timer_ms, event_ms in zip(m["backward_ms_samples"], m["backward_event_ms_samples"]):
        assert event_ms == pytest.approx(timer_ms, rel=0.05)
    # kernels run inside the event-bracketed phases of a step, and the busy share is of a measured step
    event_steps = [sum(phases) for phases in zip(*(m[f"{p}_event_ms_samples"] for p in cell.TRAINING_PHASES))]
    assert 0 < m["gpu_kernel_ms"] <= min(m["profiled_step_ms"], 1.05 * max(event_steps))
    assert m["gpu_busy_fraction"] == pytest.approx(m["gpu_kernel_ms"] / m["training_step_ms_median"])


@pytest.mark.slow
def test_compiled_blocks_share_one_graph_reach_the_final_norms_and_match_eager():
    """Block by block, Dynamo compiles one block graph and one final-norm graph per grad mode however
    many blocks; the final norm compiled first on a stand-in (the compile job's order) is reached by the
    model without compiling again; the compiled model computes what the eager one does."""
    from torch._dynamo.utils import counters

    from lmperf.model import TransformerLM, config_from_name

    torch._dynamo.reset()
    counters.clear()
    eager = TransformerLM(config_from_name("tiny", context_length=16, vocab_size=64, num_layers=3))
    compiled = cell.compile_blocks(copy.deepcopy(eager))
    tokens = torch.randint(0, 64, (2, 16))
    for grad in (True, False):
        cell.compile_final_norm(compiled, tokens, "fp32", torch.device("cpu"), grad)
    assert counters["stats"]["unique_graphs"] == 2
    out, ref = compiled(tokens), eager(tokens)
    out.square().mean().backward()
    ref.square().mean().backward()
    with torch.no_grad():
        no_grad_out = compiled(tokens)
    assert counters["stats"]["unique_graphs"] == 4 and not counters["recompiles"]  # + the block's, per grad mode
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(no_grad_out, ref.detach(), rtol=1e-5, atol=1e-5)
    for p, q in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    torch._dynamo.reset()
