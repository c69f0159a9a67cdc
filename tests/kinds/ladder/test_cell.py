"""The ladder's cells: the CPU ladder through the runner, FLOPs and MFU by hand, the chunked loss
against float64, the rung rules (parents, batch searches, out of memory, refusals), the profile."""

from __future__ import annotations

import json
import types

import pytest
import torch
from conftest import cpu_jobs, run_job

from lmperf.core.record import load_record
from lmperf.kinds.ladder import cell as ladder
from lmperf.kinds.ladder import profile as ladder_profile
from lmperf.kinds.ladder import step
from lmperf.profiling.phases import Kernel, Trace


def test_the_cpu_ladder_runs_every_rung_through_the_runner(tmp_path):
    jobs = {job.cell: job for job in cpu_jobs("ladder", tmp_path)}
    gemm_path = next(iter(jobs["gemm_peak"].records))
    run_job(jobs["gemm_peak"])
    gemm = load_record(gemm_path)["metrics"]
    assert gemm["precisions"] == ["fp32", "bf16"] and gemm["bf16_tflops"] > 0
    job = jobs["ladder"]
    job.settings["gemm_peak"] = gemm_path
    run_job(job)
    settings = job.settings
    records = {cell["rung"]: load_record(path) for path, cell in job.records.items()}
    assert list(records) == settings["rungs"]
    ok = [r for r in settings["rungs"] if records[r]["status"] == "ok"]
    assert set(ok) == set(settings["rungs"]) - set(ladder.CUDA_ONLY)
    for rung in set(settings["rungs"]) - set(ok):
        assert records[rung]["status"] == "unsupported" and "CPU" in records[rung]["reason"]
    for i, rung in enumerate(ok):
        m = records[rung]["metrics"]
        assert len(m["step_ms_samples"]) == settings["measured_steps"]
        assert m["tokens_per_s"] == pytest.approx(m["tokens_per_step"] / (m["step_ms_median"] / 1e3))
        # the unfused attention computes every score: FLOPs in full
        assert (m["attention_kernel"], m["flop_convention"]) == ("plain", ladder.FULL)
        assert m["achieved_tflops"] == pytest.approx(m["step_flops"] / (m["step_ms_median"] / 1e3) / 1e12)
        assert m["mfu_measured_bf16"] == pytest.approx(m["achieved_tflops"] / gemm["bf16_tflops"])
        assert m["mfu_datasheet"] is None and m["compile_s"] is None  # no datasheet for a CPU; eager
        if rung == "baseline":
            assert m["config"] == {**ladder.BASE, "batch_size": settings["batch_size"]}
            continue
        # the parent is the fastest kept rung before it; the rung changes one thing of its configuration
        kept = [r for r in ok[:i] if records[r]["metrics"]["kept"]]
        assert m["parent"] == max(kept, key=lambda r: records[r]["metrics"]["tokens_per_s"])
        before = records[m["parent"]]["metrics"]
        assert m["kept"] == (m["tokens_per_s"] > (1 + ladder.KEEP_MARGIN) * before["tokens_per_s"]), rung
        parent = before["config"]
        changed = {k for k in m["config"] if m["config"][k] != parent[k]}
        expected = set(ladder.CHANGES[rung][0]) | ({"batch_size"} if rung in ladder.BATCH_SEARCH else set())
        expected |= {"accumulation_steps"} if rung == "grad_accum" else set()
        assert changed <= expected and changed - {"batch_size"} == expected - {"batch_size"}, rung
    probes = records["activation_checkpointing"]["metrics"]["probes"]
    parent_batch = records[records["activation_checkpointing"]["metrics"]["parent"]]["metrics"]["config"]["batch_size"]
    assert probes[0]["batch_size"] == parent_batch  # checkpointing starts at its parent's batch
    profile_job = jobs["ladder_profile"]
    profile_job.settings["records"] = [str(tmp_path / path) for path in profile_job.settings["records"]]
    run_job(profile_job)
    profile = load_record(next(iter(profile_job.records)))
    assert profile["status"] == "unsupported" and "CUDA" in profile["reason"]


def test_flops_are_counted_as_the_attention_kernel_computes_them():
    B, T, d, f, L, H, V = 4, 1024, 768, 3072, 12, 12, 10_000
    attention = 2 * (2 * B * H * T * T * (d // H))  # QK^T and PV, every score
    fwd = L * (4 * 2 * B * T * d * d + attention + 3 * 2 * B * T * d * f) + 2 * B * T * d * V
    args = types.SimpleNamespace(model="small", context_length=T, vocab_size=V)
    gemm = {"bf16_tflops": 700.0, "fp8_tflops": 1300.0}
    config = {**ladder.BASE, "batch_size": B, "accumulation_steps": 3, "precision": "bf16"}
    plain = ladder.derive({"step_ms_median": 250.0}, config, args, "h100", gemm)
    assert plain["step_flops"] == pytest.approx(3 * 3 * fwd)
    assert plain["achieved_tflops"] == pytest.approx(9 * fwd / 0.25 / 1e12)
    assert plain["mfu_datasheet"] == plain["mfu_datasheet_bf16"] == pytest.approx(plain["achieved_tflops"] / 989.4)
    fused = ladder.derive({"step_ms_median": 250.0}, {**config, "attention": "sdpa_cudnn"}, args, "h100", gemm)
    half = 3 * 3 * (fwd - L * attention / 2)
    assert fused["flop_convention"] == ladder.HALF and fused["step_flops_causal_half"] == pytest.approx(half)
    assert fused["achieved_tflops"] == pytest.approx(half / 0.25 / 1e12)
    # FP8: its own peak and fp8's pair, and bf16-equivalent MFU against the bf16 ceilings
    fp8 = ladder.derive({"step_ms_median": 250.0}, {**config, "fp8": "rowwise"}, args, "h100", gemm)
    tflops = fp8["achieved_tflops"]
    assert fp8["ceiling_precision"] == "fp8"
    assert fp8["mfu_datasheet"] == fp8["mfu_datasheet_fp8"] == pytest.approx(tflops / 1978.9)
    assert fp8["mfu_measured_fp8"] == pytest.approx(tflops / 1300.0)
    assert fp8["mfu_measured_bf16"] == pytest.approx(tflops / 700.0)
    assert "mfu_datasheet_fp8" not in plain


def test_compile_modes_follow_the_flags():
    mode = lambda **flags: ladder.compile_mode({**ladder.BASE, **flags})  # noqa: E731
    assert mode() is None and mode(compile=True) == "default"
    assert mode(compile=True, cuda_graphs=True) == "reduce-overhead"
    assert mode(compile=True, max_autotune=True) == "max-autotune-no-cudagraphs"
    assert mode(compile=True, cuda_graphs=True, max_autotune=True) == "max-autotune"


@pytest.mark.parametrize("chunk", [7, 64])
def test_the_chunked_loss_and_its_gradients_match_float64(chunk, fresh_seed):
    torch.manual_seed(fresh_seed)
    n, d, v = 50, 16, 33
    h, w = torch.randn(n, d, requires_grad=True), torch.randn(v, d, requires_grad=True)
    targets = torch.randint(0, v, (n,))
    (2.0 * step.ChunkedCrossEntropy.apply(h, w, targets, chunk)).backward()
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    reference = torch.nn.functional.cross_entropy(h64 @ w64.T, targets)
    (2.0 * reference).backward()
    loss = step.ChunkedCrossEntropy.apply(h.detach(), w.detach(), targets, chunk)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    torch.testing.assert_close(h.grad.double(), h64.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=1e-4, atol=1e-6)


def args_for(tmp_path, **changes):
    settings = {"model": "tiny", "context_length": 16, "vocab_size": 100, "batch_size": 2, "max_batch_size": 8}
    settings |= {"accumulation_steps": 2, "loss_chunk_tokens": 8, "warmup_steps": 1, "measured_steps": 1, "seed": 0}
    return types.SimpleNamespace(**(settings | changes), gemm_peak=None, output=str(tmp_path / "{rung}.json"))


def run(args, first_trial: str | None = None) -> dict:
    """What the ladder writes, by rung (status, reason, metrics); with ``first_trial``, timed again from it."""
    written = {}
    on = (args, torch.device("cpu"), "cpu", lambda rung, *rest: written.setdefault(rung, rest))
    if first_trial:
        ladder.retime_ladder(*on, first_trial)
    else:
        ladder.run_ladder(*on)
    return written


def steps(*ms):
    return {"step_ms_samples": list(ms), "step_ms_median": sorted(ms)[len(ms) // 2]}


def test_out_of_memory_is_a_record_and_a_failing_fragile_change_is_unsupported(tmp_path, monkeypatch):
    def fake(config, args, device):
        if config["precision"] == "fp32":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if config["checkpoint"]:
            raise RuntimeError("checkpoint refused this shape")
        return steps(10.0)

    monkeypatch.setattr(ladder, "measure_config", fake)
    written = run(args_for(tmp_path, rungs=["baseline", "bf16", "activation_checkpointing"]))
    (status, reason, metrics), bf16 = written["baseline"], written["bf16"]
    assert status == "oom" and "out of memory" in reason and "tokens_per_s" not in metrics
    # nothing ran before: bf16 builds on the rung before it
    assert bf16[0] == "ok" and bf16[2]["parent"] == "baseline"
    assert written["activation_checkpointing"][0] == "unsupported"
    assert "checkpoint refused" in written["activation_checkpointing"][1]
    monkeypatch.setattr(ladder, "measure_config", lambda *a: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):  # a plain configuration's error is a bug: it fails
        run(args_for(tmp_path, rungs=["baseline"]))


def test_the_median_step_picks_the_parent_and_the_batch(tmp_path, monkeypatch):
    # baseline: median 10 ms (one slow step: mean 40); bf16: steady 20 ms. By the median the baseline
    # is the fastest so far, so max_batch builds on it; batch 4 (median 10 ms) beats 8 (25 ms a step)
    times = {("fp32", 2): steps(10.0, 100.0, 10.0), ("bf16", 2): steps(20.0, 20.0, 20.0)}
    times |= {("fp32", 4): steps(10.0, 100.0, 10.0), ("fp32", 8): steps(25.0, 25.0, 25.0)}
    monkeypatch.setattr(ladder, "measure_config", lambda c, a, d: dict(times[c["precision"], c["batch_size"]]))
    written = run(args_for(tmp_path, rungs=["baseline", "bf16", "max_batch"]))
    status, _, m = written["max_batch"]
    assert status == "ok" and m["parent"] == "baseline" and m["config"]["precision"] == "fp32"
    assert [p["batch_size"] for p in m["probes"]] == [4, 8] and m["config"]["batch_size"] == 4


def test_a_rung_is_kept_only_beyond_the_margin(tmp_path, monkeypatch):
    # bf16 is 2% faster than the baseline (within the margin): not kept, so fused AdamW builds on the
    # baseline, and being twice as fast, is kept
    times = {("fp32", False): 10.0, ("bf16", False): 9.8, ("fp32", True): 5.0, ("bf16", True): 4.0}
    monkeypatch.setattr(ladder, "measure_config", lambda c, a, d: steps(times[c["precision"], c["fused_adamw"]]))
    written = run(args_for(tmp_path, rungs=["baseline", "bf16", "fused_adamw"]))
    m = {rung: metrics for rung, (_status, _reason, metrics) in written.items()}
    assert m["baseline"]["kept"] and not m["bf16"]["kept"] and m["bf16"]["parent"] == "baseline"
    assert m["fused_adamw"]["parent"] == "baseline" and m["fused_adamw"]["config"]["precision"] == "fp32"
    assert m["fused_adamw"]["kept"]


def job_argv(tmp_path, **changes) -> list[str]:
    args = vars(args_for(tmp_path, rungs=["baseline", "bf16", "fused_adamw"], **changes))
    settings = {k: v for k, v in args.items() if k != "output"}
    return [
        "--device",
        "cpu",
        "--job",
        json.dumps({"settings": settings, "output": str(tmp_path / "x_{rung}.t0.json")}),
    ]


def test_a_killed_ladder_goes_on_from_the_rungs_it_finished(tmp_path, monkeypatch):
    def killed_at_bf16(config, args, device):
        if config["precision"] == "bf16":
            raise KeyboardInterrupt  # the runner's kill, or a lost machine
        return steps(10.0)

    monkeypatch.setattr(ladder, "measure_config", killed_at_bf16)
    with pytest.raises(KeyboardInterrupt):
        ladder.main(job_argv(tmp_path))
    first = load_record(tmp_path / "x_baseline.t0.json")
    assert load_record(tmp_path / ".partial" / "x_baseline.t0.json") == first
    measured = []
    monkeypatch.setattr(ladder, "measure_config", lambda c, a, d: measured.append(c) or steps(5.0))
    assert ladder.main(job_argv(tmp_path)) == 0
    # the baseline is the killed run's record; bf16 and fused AdamW are measured, on top of it
    assert load_record(tmp_path / "x_baseline.t0.json") == first
    assert [c["precision"] for c in measured] == ["bf16", "bf16"]
    assert load_record(tmp_path / "x_bf16.t0.json")["metrics"]["parent"] == "baseline"
    assert not list((tmp_path / ".partial").iterdir())  # the job ended: nothing left to resume
    # a killed run's record from other settings is measured again
    monkeypatch.setattr(ladder, "measure_config", killed_at_bf16)
    with pytest.raises(KeyboardInterrupt):
        ladder.main(job_argv(tmp_path))
    measured.clear()
    monkeypatch.setattr(ladder, "measure_config", lambda c, a, d: measured.append(c) or steps(5.0))
    assert ladder.main(job_argv(tmp_path, seed=1)) == 0
    # the baseline again; bf16 is as fast as it (not kept), so fused AdamW builds on the baseline
    assert [c["precision"] for c in measured] == ["fp32", "bf16", "fp32"]


def test_a_later_trial_times_the_first_trials_choices_again_without_searching(tmp_path, monkeypatch):
    # first trial: bf16 (20 ms) is the fastest, max_batch picks batch 4 over 8; compile_s is its own
    times = {("fp32", 2): steps(30.0), ("bf16", 2): steps(20.0), ("bf16", 4): steps(30.0), ("bf16", 8): steps(90.0)}
    monkeypatch.setattr(
        ladder, "measure_config", lambda c, a, d: {**times[c["precision"], c["batch_size"]], "compile_s": 5.0}
    )
    rungs = ["baseline", "bf16", "max_batch"]
    first = run(args_for(tmp_path, rungs=rungs))
    for rung, (status, _reason, metrics) in first.items():
        (tmp_path / f"{rung}.t0.json").write_text(json.dumps({"status": status, "metrics": metrics}))
    timed = []

    def again(config, args, device):
        timed.append(config)
        return {**steps(25.0), "compile_s": 1.0}

    monkeypatch.setattr(ladder, "measure_config", again)
    written = run(args_for(tmp_path, rungs=rungs), str(tmp_path / "{rung}.t0.json"))
    # one step per rung, each the first trial's configuration: no batch probes, the same parents
    assert timed == [first[r][2]["config"] for r in rungs] and timed[2]["batch_size"] == 4
    for rung in rungs:
        status, _, m = written[rung]
        assert status == "ok" and m["step_ms_median"] == 25.0
        assert (m["parent"], m.get("probes")) == (first[rung][2]["parent"], first[rung][2].get("probes"))
        assert m["compile_s"] is None and m["first_step_s"] is None  # the first trial's cold compile alone
        assert m["tokens_per_s"] == pytest.approx(m["tokens_per_step"] / 0.025)


def test_grad_accum_halves_the_micro_batch_until_it_fits(tmp_path, monkeypatch):
    tried = []

    def fake(config, args, device):
        tried.append(config["batch_size"])
        if config["batch_size"] > 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return steps(10.0)

    monkeypatch.setattr(ladder, "measure_config", fake)
    args = args_for(tmp_path, accumulation_steps=3)
    parent = {**ladder.BASE, "batch_size": 16, "precision": "bf16"}
    status, _, metrics, config = ladder.run_grad_accum(parent, args, torch.device("cpu"))
    assert status == "ok" and tried == [16, 8, 4] and config == {**parent, "batch_size": 4, "accumulation_steps": 3}
    assert [t["batch_size"] for t in metrics["micro_batch_fallbacks"]] == [16, 8]


def test_fp8_without_torchao_or_fp8_tensor_cores_is_unsupported(monkeypatch):
    monkeypatch.setattr(step.importlib.util, "find_spec", lambda name: None)
    assert "torchao is not installed" in step.fp8_unsupported(torch.device("cuda"))
    monkeypatch.setattr(step.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))
    assert "8.9 or newer; this GPU has 8.0" in step.fp8_unsupported(torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    assert step.fp8_unsupported(torch.device("cuda")) is None


def test_the_profile_finds_busy_time_and_top_kernels_by_hand():
    def k(name, start, end):
        return Kernel(name=name, short_name=name, start_ns=start, end_ns=end, launch_ns=start)

    # window 0..1000 ns; kernels overlap at 100..300 (busy 100..300), then 600..900; one starts after the window
    kernels = [k("nvjet_sm90_gemm", 100, 250), k("triton_poi_fused_add", 200, 300), k("nvjet_sm90_gemm", 600, 900)]
    out = ladder_profile.analyse(Trace(kernels=[*kernels, k("late", 1500, 1600)], ranges=[]), (0, 1000), 5)
    assert out["kernels"] == 3 and out["busy_ms"] == pytest.approx(500 / 1e6)
    assert out["busy_fraction"] == pytest.approx(0.5) and out["idle_ms"] == pytest.approx(500 / 1e6)
    top = out["top_kernels"][0]
    assert top["name"] == "nvjet_sm90_gemm" and top["count"] == 2 and top["share"] == pytest.approx(450 / 550)
    assert out["class_ms"]["matmul"] == pytest.approx(450 / 1e6)


def test_the_profile_replays_the_rung_in_the_ladder_module_itself(tmp_path):
    # under nsys the replay must run in the profiled process: through the runner the warm parent
    # would fork it outside nsys's process tree, and the profile would hold nothing
    config = {"precision": "bf16", "attention": "sdpa_flash", "compile": True, "batch_size": 8}
    cell = {"model": "2.7B", "context_length": 1024}
    cmd = ladder_profile.replay_command(cell, {"warmup_steps": 3}, config, "h100", 4, tmp_path / "t.json")
    assert cmd[1:4] == ["-m", "lmperf.kinds.ladder.cell", "--replay"]
    replay = json.loads(cmd[4])
    assert replay["config"] == config and replay["profile_steps"] == 4
    assert replay["settings"] == {"warmup_steps": 3, **cell}
