"""The end-to-end cell CLI: a real tiny run, the OOM path and the device check."""

from __future__ import annotations

import pytest
import torch

from lmperf.core import device
from lmperf.core.record import load_record
from lmperf.kinds.e2e import cell as e2e

ARGS = [
    "--device",
    "cpu",
    "--model",
    "tiny",
    "--context-length",
    "16",
    "--warmup-steps",
    "1",
    "--measured-steps",
    "3",
    "--batch-size",
    "2",
]


def test_tiny_cell_records_every_phase(tmp_path):
    out = tmp_path / "cell.json"
    assert e2e.main(["--output", str(out), *ARGS, "--precision", "bf16"]) == 0
    r = load_record(out)
    m = r["metrics"]
    assert r["status"] == "ok" and r["cell"]["precision"] == "bf16"
    for phase in ("forward", "backward", "optimizer_step", "training_step", "inference_forward"):
        assert len(m[f"{phase}_ms_samples"]) == 3 and m[f"{phase}_ms_mean"] > 0
    # the step total is the sum of its phases, sample by sample
    for i in range(3):
        parts = sum(m[f"{p}_ms_samples"][i] for p in ("forward", "backward", "optimizer_step"))
        assert m["training_step_ms_samples"][i] == pytest.approx(parts)
    assert m["training_step_tokens_per_s"] == pytest.approx(2 * 16 / (m["training_step_ms_mean"] / 1e3))
    assert m["process_start_to_first_measured_step_s"] > 0
    # the first (warm-up) step and forward are timed apart: under torch.compile they hold the compilation
    assert m["training_first_step_ms"] > 0 and m["inference_first_forward_ms"] > 0
    tick_s = 0.02  # process ages come from /proc in clock ticks (10 ms)
    assert m["process_start_to_first_step_s"] + m["training_first_step_ms"] / 1e3 <= (
        m["process_start_to_first_measured_step_s"] + tick_s
    )
    assert r["provenance"]["settings"]["measured_steps"] == 3


def test_out_of_memory_in_training_still_measures_inference(tmp_path, monkeypatch):
    def fake_training(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    monkeypatch.setattr(e2e, "measure_training", fake_training)
    out = tmp_path / "cell.json"
    assert e2e.main(["--output", str(out), *ARGS]) == 0
    r = load_record(out)
    assert r["status"] == "oom" and "training step" in r["reason"]
    assert r["metrics"]["training_status"] == "oom" and r["metrics"]["inference_status"] == "ok"
    assert "forward_ms_mean" not in r["metrics"] and r["metrics"]["inference_forward_ms_mean"] > 0


def test_unexpected_error_propagates_without_record(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(e2e, "measure_training", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        e2e.main(["--output", str(tmp_path / "c.json"), *ARGS])
    assert not (tmp_path / "c.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without that GPU")
def test_refuses_to_write_under_another_devices_slug(tmp_path):
    with pytest.raises(device.DeviceMismatch, match="results/h100/"):
        e2e.main(
            ["--output", str(tmp_path / "c.json"), "--device", "h100", "--model", "tiny", "--context-length", "16"]
        )


def test_slug_from_device_names():
    assert device.slug_from_name("NVIDIA H100 80GB HBM3") == "h100"
    assert device.slug_from_name("NVIDIA H200") == "h200"
    assert device.slug_from_name("NVIDIA A100-SXM4-80GB") == "a100"
    assert device.slug_from_name("NVIDIA A10") == "a10"
    assert device.slug_from_name("NVIDIA GeForce RTX 4090 D") == "rtx4090"
    assert device.slug_from_name("Tesla T4") == "tesla-t4"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_cell_records_events_that_agree_with_the_timer(tmp_path):
    slug = device.device_slug()
    out = tmp_path / "cell.json"
    e2e.main(["--output", str(out), "--device", slug, "--model", "small", "--context-length", "256"])
    m = load_record(out)["metrics"]
    for timer_ms, event_ms in zip(m["backward_ms_samples"], m["backward_event_ms_samples"]):
        assert event_ms == pytest.approx(timer_ms, rel=0.05)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_an_attention_that_cannot_run_here_is_an_unsupported_record(tmp_path):
    out = tmp_path / "cell.json"
    assert e2e.main(["--output", str(out), *ARGS, "--attention", "sdpa_cudnn"]) == 0
    r = load_record(out)
    assert r["status"] == "unsupported" and "sdpa_cudnn" in r["reason"]


@pytest.mark.slow
def test_a_compiled_cell_counts_its_compiler_cache_hits(tmp_path):
    """A cold compile finds nothing in torch.compile's on-disk caches; the same cell again, in a new
    process with the same cache directory, does (its first step is then no compile-time measurement)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    counts = []
    for run in ("cold", "warm"):
        out = tmp_path / f"{run}.json"
        cmd = [sys.executable, "-m", "lmperf.cells", "e2e", "--output", str(out), *ARGS, "--compile", "compiled"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        counts.append(load_record(out)["metrics"])
    cold, warm = counts
    assert cold["compile_cache_hits"] == 0 and cold["inductor_fxgraph_cache_misses"] > 0
    assert warm["compile_cache_hits"] > 0
    assert warm["compile_cache_hits"] == warm["inductor_fxgraph_cache_hits"] + warm["aot_autograd_cache_hits"]


@pytest.mark.slow
def test_compiled_blocks_share_one_graph_and_match_eager():
    """Regional compilation: however many blocks, Dynamo compiles one block graph and one final-norm
    graph per grad mode (a whole-model compile would make one graph per mode, a compile per block
    instance one per block), and the compiled model computes what the eager one does."""
    import copy

    from torch._dynamo.utils import counters

    from lmperf.model import TransformerLM, config_from_name

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    eager = TransformerLM(config_from_name("tiny", context_length=16, vocab_size=64, num_layers=3))
    compiled = e2e.compile_blocks(copy.deepcopy(eager))
    tokens = torch.randint(0, 64, (2, 16))
    out, ref = compiled(tokens), eager(tokens)
    out.square().mean().backward()
    ref.square().mean().backward()
    with torch.no_grad():
        no_grad_out = compiled(tokens)
    assert counters["stats"]["unique_graphs"] == 4  # (block, final norm) x (training, no_grad)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(no_grad_out, ref.detach(), rtol=1e-5, atol=1e-5)
    for p, q in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_the_final_norm_compiled_alone_is_the_graph_the_model_reaches():
    """compile_final_norm (the compile job's, before executing the model) makes the final norm's two
    graphs on a stand-in input; the model then reaches them without compiling the norm again (its
    guards pass), so only the block's two graphs are added."""
    from torch._dynamo.utils import counters

    from lmperf.model import TransformerLM, config_from_name

    torch._dynamo.reset()
    counters.clear()
    model = e2e.compile_blocks(TransformerLM(config_from_name("tiny", context_length=16, vocab_size=64, num_layers=2)))
    tokens = torch.randint(0, 64, (2, 16))
    for grad in (True, False):
        e2e.compile_final_norm(model, tokens, "fp32", torch.device("cpu"), grad=grad)
    assert counters["stats"]["unique_graphs"] == 2
    model(tokens).sum().backward()
    with torch.no_grad():
        model(tokens)
    assert counters["stats"]["unique_graphs"] == 4  # the block's, training and no_grad: nothing else
    assert not counters["recompiles"]


@pytest.mark.slow
def test_the_compile_job_compiles_the_final_norm_though_the_blocks_run_out_of_memory(tmp_path, monkeypatch):
    """In its memory share a compile-only process runs out of memory executing the blocks, after their
    graphs compiled: the final norm's two graphs are compiled all the same, first."""
    from torch._dynamo.utils import counters

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")

    monkeypatch.setattr(e2e, "forward_backward", out_of_memory)
    monkeypatch.setattr(e2e, "inference_forward", out_of_memory)
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # --compile-cache sets them: restored after
        monkeypatch.setenv(name, str(tmp_path / "cache"))
    torch._dynamo.reset()
    counters.clear()
    out = tmp_path / "job.json"
    argv = ["--output", str(out), *ARGS, "--compile", "compiled", "--compile-only"]
    argv += ["--compile-cache", str(tmp_path / "cache")]
    assert e2e.main(argv) == 0
    r = load_record(out)
    assert r["status"] == "oom" and "training" in r["reason"] and "inference" in r["reason"]
    assert counters["stats"]["unique_graphs"] == 2  # the final norm, training and no_grad
    assert r["metrics"]["training_compile_s"] > 0 and r["metrics"]["inference_compile_s"] > 0
    torch._dynamo.reset()


def test_a_compiled_cell_records_what_it_compiled(monkeypatch, tmp_path):
    """The record's settings say the compiled cell compiled block by block; an eager one says nothing."""
    monkeypatch.setattr(e2e, "compile_blocks", lambda model: model)  # no compile: only the record is checked
    for mode in ("compiled", "eager"):
        out = tmp_path / f"{mode}.json"
        assert e2e.main(["--output", str(out), *ARGS, "--compile", mode]) == 0
        settings = load_record(out)["provenance"]["settings"]
        assert settings.get("compile_scope") == ("blocks" if mode == "compiled" else None)
