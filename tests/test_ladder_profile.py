"""The ladder's profile cell: busy time, idle gaps and top kernels of a trace; unsupported on the CPU."""

from __future__ import annotations

import json

import pytest

from lmperf.core.record import load_record, make_record, write_record
from lmperf.kinds.ladder import profile as ladder_profile
from lmperf.profiling.phases import Kernel, Trace


def k(name, start, end):
    return Kernel(name=name, short_name=name, start_ns=start, end_ns=end, launch_ns=start)


def test_busy_time_gaps_and_top_kernels_by_hand():
    # window 0..1000 ns; kernels overlap at 100..300 (merged busy 100..300), gap 300..600, then 600..900
    trace = Trace(
        kernels=[
            k("nvjet_sm90_gemm", 100, 250),
            k("triton_poi_fused_add", 200, 300),
            k("nvjet_sm90_gemm", 600, 900),
            k("late_kernel", 1500, 1600),
        ],
        ranges=[],
    )
    out = ladder_profile.analyse(trace, (0, 1000), top_n=5, gap_threshold_ns=250)
    assert out["kernels"] == 3  # the kernel starting after the window is left out
    assert out["busy_ms"] == pytest.approx(500 / 1e6)  # (300 - 100) + (900 - 600)
    assert out["busy_fraction"] == pytest.approx(0.5)
    assert out["idle_ms"] == pytest.approx(500 / 1e6)
    # gaps: 0..100, 300..600, 900..1000; only 300..600 is >= 250 ns
    assert out["gaps"] == 3 and out["gaps_over_threshold"] == 1
    assert out["largest_gaps"][0] == {"us": 0.3, "after": "triton_poi_fused_add", "before": "nvjet_sm90_gemm"}
    top = out["top_kernels"][0]
    assert top["name"] == "nvjet_sm90_gemm" and top["count"] == 2 and top["share"] == pytest.approx(450 / 550)
    assert out["class_share"]["matmul"] == pytest.approx(450 / 550)


def test_cpu_profile_is_unsupported(tmp_path):
    prov = {
        "device_slug": "cpu",
        "device_name": "x86_64",
        "torch_version": "2",
        "git_commit": "a",
        "git_dirty": False,
        "start_time": "2026-01-01T00:00:00+00:00",
        "settings": {},
    }
    rec = make_record(
        "ladder",
        {"model": "tiny", "context_length": 32, "rung": "baseline"},
        "ok",
        {"tokens_per_s": 1.0, "config": {}},
        prov,
    )
    write_record(tmp_path / "r.json", rec)
    out = tmp_path / "p.json"
    assert ladder_profile.main(["--output", str(out), "--device", "cpu", "--records", str(tmp_path / "r.json")]) == 0
    r = load_record(out)
    assert r["status"] == "unsupported" and "CUDA" in r["reason"]
    assert r["cell"] == {"model": "tiny", "context_length": 32}


def test_replay_runs_the_ladder_module_itself_not_through_the_fork_server(tmp_path):
    # Under nsys the replay must do its CUDA work in the profiled process: `python -m lmperf ladder`
    # would hand it to the fork server's child, outside nsys's tree, and the profile would hold nothing.
    from lmperf.kinds.ladder import cell as ladder

    config = {"precision": "bf16", "tf32": True, "attention": "sdpa_flash", "compile": True, "batch_size": 8}
    cmd = ladder_profile.replay_command(
        {"model": "2.7B", "context_length": 1024}, {"warmup_steps": 3}, config, "h100", 4, tmp_path / "t.json"
    )
    assert cmd[1:3] == ["-m", "lmperf.kinds.ladder.cell"]
    args = ladder.parse_args(cmd[3:])  # what the ladder module will read
    assert (args.model, args.context_length, args.warmup_steps, args.profile_steps) == ("2.7B", 1024, 3, 4)
    assert json.loads(args.replay_config) == config
