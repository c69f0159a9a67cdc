"""The speed ladder: the CPU ladder end to end, FLOP/MFU arithmetic by hand, the GEMM ceiling cell."""

from __future__ import annotations

import pytest
import torch

from lmperf.core.record import load_record
from lmperf.core.sizes import config_from_name
from lmperf.kinds.ladder import cell as ladder
from lmperf.kinds.ladder import gemm_peak


def test_tiny_cpu_ladder_writes_a_valid_record_per_rung(tmp_path):
    gemm_out = tmp_path / "gemm.json"
    assert (
        gemm_peak.main(
            [
                "--output",
                str(gemm_out),
                "--device",
                "cpu",
                "--sizes",
                "64",
                "128",
                "--precisions",
                "fp32",
                "tf32",
                "bf16",
                "--measured-calls",
                "2",
                "--repeats",
                "2",
            ]
        )
        == 0
    )
    gemm = load_record(gemm_out)
    assert gemm["status"] == "ok"
    assert gemm["metrics"]["precisions"] == ["fp32", "bf16"] and "tf32" in gemm["metrics"]["skipped"]
    assert gemm["metrics"]["bf16_tflops"] == max(
        r["tflops_best"] for r in gemm["metrics"]["runs"] if r["precision"] == "bf16"
    )

    rungs = ["baseline", "tf32", "bf16", "fused_adamw", "sdpa_flash", "sdpa_cudnn", "flash", "max_batch", "grad_accum"]
    template = str(tmp_path / "tiny_ctx16_{rung}.json")
    assert (
        ladder.main(
            [
                "--output",
                template,
                "--device",
                "cpu",
                "--model",
                "tiny",
                "--context-length",
                "16",
                "--rungs",
                *rungs,
                "--batch-size",
                "2",
                "--max-batch-size",
                "8",
                "--accumulation-steps",
                "2",
                "--warmup-steps",
                "1",
                "--measured-steps",
                "2",
                "--gemm-peak",
                str(gemm_out),
            ]
        )
        == 0
    )
    records = {rung: load_record(template.format(rung=rung)) for rung in rungs}
    for rung in ("tf32", "sdpa_flash", "sdpa_cudnn", "flash"):
        assert records[rung]["status"] == "unsupported" and "CUDA" in records[rung]["reason"]
    for rung in ("baseline", "bf16", "fused_adamw", "max_batch", "grad_accum"):
        r = records[rung]
        m = r["metrics"]
        assert r["status"] == "ok", r["reason"]
        assert r["cell"] == {"model": "tiny", "context_length": 16, "rung": rung}
        assert len(m["step_ms_samples"]) == 2 and m["step_ms_median"] > 0 and m["step_statistic"] == "median"
        assert m["tokens_per_s"] == pytest.approx(m["tokens_per_step"] / (m["step_ms_median"] / 1e3))
        assert m["ceiling_measured_bf16"] == gemm["metrics"]["bf16_tflops"]
        assert m["mfu_measured_bf16"] == pytest.approx(m["achieved_tflops"] / gemm["metrics"]["bf16_tflops"])
        assert m["mfu_datasheet"] is None  # no datasheet peak for a CPU
    # each rung changes one thing of its parent's configuration
    assert records["baseline"]["metrics"]["config"] == {**ladder.BASE, "batch_size": 2}
    for rung in ("bf16", "fused_adamw", "grad_accum"):
        m = records[rung]["metrics"]
        parent = records[m["parent"]]["metrics"]["config"]
        changed = {k for k in m["config"] if m["config"][k] != parent[k]}
        assert len(changed) == 1, (rung, changed)
    # the parent is the fastest rung measured before
    ok_before = [r for r in rungs[: rungs.index("grad_accum")] if records[r]["status"] == "ok"]
    fastest = max(ok_before, key=lambda r: records[r]["metrics"]["tokens_per_s"])
    assert records["grad_accum"]["metrics"]["parent"] == fastest
    assert records["grad_accum"]["metrics"]["config"]["accumulation_steps"] == 2
    probes = records["max_batch"]["metrics"]["probes"]
    parent_batch = records[records["max_batch"]["metrics"]["parent"]]["metrics"]["config"]["batch_size"]
    assert [p["batch_size"] for p in probes] == [b for b in (4, 8) if b > parent_batch]
    best = max(probes, key=lambda p: p["tokens_per_s"])
    assert records["max_batch"]["metrics"]["config"]["batch_size"] == best["batch_size"]


def test_flops_and_mfu_against_a_hand_count():
    cfg = config_from_name("small", context_length=1024, vocab_size=10_000)
    B, T, d, f, L, H, V = 4, 1024, 768, 3072, 12, 12, 10_000
    dh = d // H
    # per layer: q, k, v, o projections; QK^T and PV in full (no causal halving); SwiGLU's three matmuls
    per_layer_fwd = 4 * (2 * B * T * d * d) + 2 * (2 * B * H * T * T * dh) + 3 * (2 * B * T * d * f)
    fwd = L * per_layer_fwd + 2 * B * T * d * V
    counts = ladder.step_flops(cfg, B, T, accumulation_steps=3)
    assert counts["step_flops"] == pytest.approx(3 * 3 * fwd)
    attention_fwd = L * 2 * (2 * B * H * T * T * dh)
    assert counts["step_flops_causal_half"] == pytest.approx(3 * 3 * (fwd - attention_fwd / 2))
    step_ms = 250.0
    u = ladder.utilisation(step_ms, counts, {"datasheet": 989.4, "measured": 700.0, "none": None})
    tflops = 9 * fwd / 0.25 / 1e12
    assert u["achieved_tflops"] == pytest.approx(tflops)
    assert u["mfu_datasheet"] == pytest.approx(tflops / 989.4)
    assert u["mfu_measured"] == pytest.approx(tflops / 700.0)
    assert u["mfu_none"] is None


def test_ceiling_follows_the_rung_precision():
    base = {**ladder.BASE}
    assert ladder.ceiling_key(base) == "fp32"
    assert ladder.ceiling_key({**base, "tf32": True}) == "tf32"
    assert ladder.ceiling_key({**base, "tf32": True, "precision": "bf16"}) == "bf16"
    c = ladder.ceilings_for({**base, "tf32": True}, "h100", {"tf32_tflops": 400.0, "bf16_tflops": 750.0})
    assert c == {
        "ceiling_precision": "tf32",
        "datasheet": 494.7,
        "measured": 400.0,
        "datasheet_bf16": 989.4,
        "measured_bf16": 750.0,
    }


def test_oom_rung_is_a_record_and_the_ladder_goes_on(tmp_path, monkeypatch):
    real = ladder.measure_config

    def fake(config, args, device):
        if config["precision"] == "fp32":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(config, args, device)

    monkeypatch.setattr(ladder, "measure_config", fake)
    template = str(tmp_path / "tiny_ctx16_{rung}.json")
    assert (
        ladder.main(
            [
                "--output",
                template,
                "--device",
                "cpu",
                "--model",
                "tiny",
                "--context-length",
                "16",
                "--rungs",
                "baseline",
                "bf16",
                "--batch-size",
                "2",
                "--warmup-steps",
                "1",
                "--measured-steps",
                "1",
            ]
        )
        == 0
    )
    base, bf16 = (load_record(template.format(rung=r)) for r in ("baseline", "bf16"))
    assert base["status"] == "oom" and "out of memory" in base["reason"]
    assert "tokens_per_s" not in base["metrics"] and base["metrics"]["step_flops"] > 0
    # nothing ran before: bf16 builds on the declared parent's configuration
    assert bf16["status"] == "ok" and bf16["metrics"]["parent"] == "baseline"
    assert bf16["metrics"]["config"] == {**ladder.BASE, "batch_size": 2, "precision": "bf16"}


def test_a_failing_fragile_attention_is_unsupported_but_other_errors_fail(tmp_path, monkeypatch):
    args = ladder.parse_args(
        ["--output", str(tmp_path / "{rung}.json"), "--device", "cpu", "--model", "tiny", "--context-length", "16"]
    )

    def boom(config, args, device):
        raise RuntimeError("head dimension 80 is not supported")

    monkeypatch.setattr(ladder, "measure_config", boom)
    status, reason, metrics = ladder.try_config(
        {**ladder.BASE, "batch_size": 2, "attention": "flash"}, args, torch.device("cpu")
    )
    assert status == "unsupported" and "head dimension 80" in reason and metrics == {}
    with pytest.raises(RuntimeError, match="head dimension 80"):
        ladder.try_config({**ladder.BASE, "batch_size": 2}, args, torch.device("cpu"))


def test_output_needs_a_rung_placeholder(tmp_path):
    with pytest.raises(SystemExit):
        ladder.parse_args(
            ["--output", str(tmp_path / "x.json"), "--device", "cpu", "--model", "tiny", "--context-length", "16"]
        )


def test_gemm_flops():
    assert gemm_peak.gemm_flops(4096) == 2 * 4096**3
    # TF32 is fp32 storage with tensor-core matmuls: same dtype, a different backend flag
    from lmperf.core.dtypes import torch_dtype

    assert torch_dtype("tf32") is torch.float32 and torch_dtype("bf16") is torch.bfloat16
    assert set(gemm_peak.PRECISIONS) >= {"fp32", "tf32", "bf16"}


def test_grad_accum_halves_the_micro_batch_until_it_fits(tmp_path, monkeypatch):
    args = ladder.parse_args(
        [
            "--output",
            str(tmp_path / "{rung}.json"),
            "--device",
            "cpu",
            "--model",
            "tiny",
            "--context-length",
            "16",
            "--batch-size",
            "2",
            "--accumulation-steps",
            "3",
        ]
    )
    tried = []

    def fake(config, args, device):
        tried.append(config["batch_size"])
        if config["batch_size"] > 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return {"step_ms_mean": 10.0, "step_ms_median": 10.0}

    monkeypatch.setattr(ladder, "measure_config", fake)
    parent = {**ladder.BASE, "batch_size": 16, "precision": "bf16"}
    status, _, metrics, config = ladder.run_grad_accum(parent, args, torch.device("cpu"))
    assert status == "ok" and tried == [16, 8, 4]
    assert config == {**parent, "batch_size": 4, "accumulation_steps": 3}
    assert [t["batch_size"] for t in metrics["micro_batch_fallbacks"]] == [16, 8]
    # never below --batch-size: then the rung is out of memory
    monkeypatch.setattr(ladder, "measure_config", lambda *a: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")))
    status, _, metrics, config = ladder.run_grad_accum({**parent, "batch_size": 4}, args, torch.device("cpu"))
    assert status == "oom" and config["batch_size"] == 2
    assert [t["batch_size"] for t in metrics["micro_batch_fallbacks"]] == [4]


def steps(*ms):
    """Measured-step metrics of these samples, as measure_config summarises them."""
    return {"step_ms_samples": list(ms), "step_ms_mean": sum(ms) / len(ms), "step_ms_median": sorted(ms)[len(ms) // 2]}


def test_one_slow_step_does_not_decide_which_rung_the_next_builds_on(tmp_path, monkeypatch):
    # baseline: two fast steps and one slow one (mean 40 ms, median 10); bf16: steady 20 ms. By the
    # median the baseline is the fastest so far, so fused_adamw builds on it, not on bf16.
    times = {"fp32": steps(10.0, 100.0, 10.0), "bf16": steps(20.0, 20.0, 20.0)}
    monkeypatch.setattr(ladder, "measure_config", lambda config, args, device: dict(times[config["precision"]]))
    template = str(tmp_path / "tiny_ctx16_{rung}.json")
    argv = ["--output", template, "--device", "cpu", "--model", "tiny", "--context-length", "16"]
    assert ladder.main([*argv, "--rungs", "baseline", "bf16", "fused_adamw", "--batch-size", "2"]) == 0
    base, bf16, fused = (load_record(template.format(rung=r))["metrics"] for r in ("baseline", "bf16", "fused_adamw"))
    assert base["tokens_per_s"] == pytest.approx(2 * 16 / 0.010) and bf16["tokens_per_s"] == pytest.approx(
        2 * 16 / 0.020
    )
    assert fused["parent"] == "baseline" and fused["config"]["precision"] == "fp32"


def test_max_batch_picks_the_batch_by_its_median_step(tmp_path, monkeypatch):
    args = ladder.parse_args(
        ["--output", str(tmp_path / "{rung}.json"), "--device", "cpu", "--model", "tiny", "--context-length", "16"]
    )
    args.max_batch_size = 8
    # batch 4: median 10 ms (one slow step: mean 40); batch 8: 25 ms every step. Per token the
    # median makes batch 4 faster (4/10 > 8/25); the mean would have picked batch 8.
    times = {4: steps(10.0, 100.0, 10.0), 8: steps(25.0, 25.0, 25.0)}
    monkeypatch.setattr(ladder, "measure_config", lambda config, args, device: dict(times[config["batch_size"]]))
    status, _, metrics, config = ladder.run_max_batch({**ladder.BASE, "batch_size": 2}, args, torch.device("cpu"))
    assert status == "ok" and config["batch_size"] == 4
    assert [p["batch_size"] for p in metrics["probes"]] == [4, 8] and metrics["probes"][0]["step_ms_median"] == 10.0
