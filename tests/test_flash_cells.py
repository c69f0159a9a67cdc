"""The flash kind: its cells end to end on CPU, its GPU paths on fake timings, its report, its rules.

- correctness: both implementations through the CLI (the Triton kernels in Triton's interpreter,
  which the cell turns on itself), errors checked against this file's own tolerances and one
  entry re-computed here from its recorded seed; a deliberately wrong Function must fail.
- benchmark and leaderboard: `unsupported` records without CUDA; their CUDA paths with
  lmperf.kinds.flash.harness's timing functions replaced by fakes of known times (speed-ups, TFLOP/s,
  out-of-memory and refusing implementations checked by hand).
- the report on records shaped like the GPU ones (from those fakes, OOM included).
- `flash` in the attention sweep: the attention cell runs our Triton kernels in the interpreter.
- the rules: one job per correctness implementation, per benchmark precision, one leaderboard.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lmperf.core import config as lmconfig
from lmperf.core import device as devices
from lmperf.core.record import load_record
from lmperf.kinds.flash import benchmark, correctness, leaderboard, report

REPO = Path(__file__).resolve().parents[1]
# (O and L, gradients): the relative Frobenius errors tests/test_flash_{pytorch,triton}.py allow
# on CPU (the interpreter multiplies float32 exactly)
TOLERANCE = {"fp32": (1e-5, 1e-4), "bf16": (2e-2, 3e-2), "fp16": (5e-3, 1e-2)}
MIB = 2**20
# Tests of our kernels under Triton's interpreter (the path CPU machines take) run on CPU machines
# only: on a CUDA machine the cells run the compiled kernels, which tests/test_flash_triton.py checks
# against float64, and the H100 machine's Triton 3.6 interpreter fails every kernel call there
# (InterpreterError: "only 0-dimensional arrays can be converted to Python scalars").
interpreter_on_cpu_only = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="our kernels' interpreter path is the CPU machines'; CUDA machines run them compiled",
)


def run_cli(*argv: str, env_extra: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_extra or {})
    out = subprocess.run(
        [sys.executable, "-m", *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out


# --- correctness ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def correctness_records(tmp_path_factory):
    """Both implementations on a tiny grid: 3 precisions x 2 head dims x causal x 2 ragged shapes."""
    pytest.importorskip("triton")
    out = tmp_path_factory.mktemp("flash") / "results" / "cpu" / "flash"
    grid = [
        "--precisions",
        "fp32",
        "bf16",
        "fp16",
        "--head-dims",
        "16",
        "64",
        "--causal",
        "false",
        "true",
        "--shapes",
        "2x33x20",
        "1x17x50",
    ]
    records = {}
    # pytorch through the process pool; triton's interpreter only where its tests run (CPU machines)
    implementations = (("pytorch", "2"),) if torch.cuda.is_available() else (("triton", "1"), ("pytorch", "2"))
    for impl, workers in implementations:
        path = out / f"correctness_{impl}.json"
        run_cli(
            "lmperf.cells",
            "flash_correctness",
            "--device",
            "cpu",
            "--implementation",
            impl,
            "--output",
            str(path),
            "--workers",
            workers,
            *grid,
        )
        records[impl] = load_record(path)
    return records


@pytest.mark.parametrize("impl", [pytest.param("triton", marks=interpreter_on_cpu_only), "pytorch"])
def test_correctness_entries_within_tolerance(correctness_records, impl):
    r = correctness_records[impl]
    m = r["metrics"]
    assert r["status"] == "ok" and r["cell"] == {"test": "correctness", "implementation": impl}
    entries = m["entries_detail"]
    assert len(entries) == m["entries"] == 3 * 2 * 2 * 2
    combos = {(e["precision"], e["head_dim"], e["causal"], e["batch"], e["n_queries"], e["n_keys"]) for e in entries}
    assert len(combos) == 24 and {(2, 33, 20), (1, 17, 50)} == {c[3:] for c in combos}
    assert len({e["seed"] for e in entries}) == 24 and m["seed"] == min(e["seed"] for e in entries)
    for e in entries:
        tol_o, tol_grad = TOLERANCE[e["precision"]]
        assert e["status"] == "ok", e
        for name, tol in (("O", tol_o), ("L", tol_o), ("dQ", tol_grad), ("dK", tol_grad), ("dV", tol_grad)):
            assert 0 < e[f"{name}_rel_error"] < tol, (name, e)
        # the course's contract: L saved once, (batch, n_queries), float32; with Q, K, V, O
        assert e["saved_contract_ok"] and e["saved_l_shaped_count"] == 1 and e["saved_l_dtype"] == "float32"
        assert e["saved_tensor_count"] == 5
    assert m["entries_ok"] == 24 and m["all_within_tolerance"] and m["saved_contract_ok_entries"] == 24
    # bf16 carries 8 significant bits: its output error must exceed fp32's by orders of magnitude
    assert (
        m["max_rel_error_by_precision"]["bf16"]["O_rel_error"]
        > 100 * m["max_rel_error_by_precision"]["fp32"]["O_rel_error"]
    )
    if impl == "triton":
        assert m["kernel_mode"] == "triton interpreter (TRITON_INTERPRET=1)"
        assert "policy off" in m["triton_tile_policy"] and m["workers"] == 1
        assert m["triton_tiles"]["fwd"] == [{"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}]
        assert all(e["tiles"]["fwd"]["config"]["BLOCK_M"] == 32 for e in m["entries_detail"])  # the interpreter's
    else:
        assert m["kernel_mode"] == "pytorch" and m["workers"] == 2


def test_recorded_error_is_reproducible_from_the_seed(correctness_records):
    """Recompute one entry of the PyTorch version here, from its seed, against float64 attention."""
    from lmperf.kernels.flash import FlashAttention2PyTorch

    e = next(
        x
        for x in correctness_records["pytorch"]["metrics"]["entries_detail"]
        if x["precision"] == "fp32" and x["causal"] and x["n_queries"] == 17
    )
    gen = torch.Generator().manual_seed(e["seed"])
    q, k, v, do = (
        torch.randn(e["batch"], n, e["head_dim"], generator=gen)
        for n in (e["n_queries"], e["n_keys"], e["n_keys"], e["n_queries"])
    )
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    s = q64 @ k64.transpose(1, 2) / math.sqrt(e["head_dim"])
    s = s.masked_fill(torch.ones(17, 50, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.softmax(s, dim=-1) @ v64
    ref.backward(do.double())
    qg = q.clone().requires_grad_()
    o = FlashAttention2PyTorch.apply(qg, k, v, True)
    o.backward(do)
    for got, want, name in ((o, ref, "O"), (qg.grad, q64.grad, "dQ")):
        err = ((got.double() - want).norm() / want.norm()).item()
        assert err == pytest.approx(e[f"{name}_rel_error"], rel=1e-6)


class _Wrong(torch.autograd.Function):
    """Scales O by 1.01 and saves a second tensor of L's shape, in float64."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        from lmperf.kernels.flash.reference import attention_reference

        o, lse = attention_reference(q.double(), k.double(), v.double(), is_causal)
        ctx.save_for_backward(lse.float(), lse, q, k, v)
        return (1.01 * o).to(q.dtype)

    @staticmethod
    def backward(ctx, do):
        _, _, q, k, v = ctx.saved_tensors
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None


def test_a_wrong_function_fails_every_check(monkeypatch):
    monkeypatch.setattr(correctness, "_function", lambda implementation: _Wrong)
    specs = [dict(precision="fp32", head_dim=16, causal=True, batch=2, n_queries=9, n_keys=12, seed=1)]
    (entry,) = correctness.correctness_group("pytorch", specs, "cpu", None)
    assert entry["status"] == "fail"
    assert entry["O_rel_error"] == pytest.approx(0.01, rel=1e-3)
    assert entry["dQ_rel_error"] == pytest.approx(1.0)  # zero gradients: the whole reference is missed
    assert entry["saved_l_shaped_count"] == 2 and not entry["saved_contract_ok"]
    checks = " | ".join(entry["failed_checks"])
    assert "O error" in checks and "dK error" in checks and "saved 2 tensor(s)" in checks
    summary = correctness.summarize_correctness([entry])
    assert summary["entries_fail"] == 1 and not summary["all_within_tolerance"]


def _shape_tiles(kernel, dtype, precision, head_dim, causal, n_queries, n_keys, device):
    """Tiles by bucket, as a remembered table may give them: 1024 apart, 2048 and 4096 alike."""
    assert device == "h100"
    return {"BLOCK_M": 64 if max(n_queries, n_keys) <= 1024 else 32, "BLOCK_N": 32}


def test_triton_tasks_share_binaries_and_run_slowest_first(monkeypatch):
    from lmperf.kernels.flash import tuning

    monkeypatch.setattr(tuning, "planned", _shape_tiles)
    monkeypatch.setattr(tuning, "device_slug", lambda device=None: "h100")
    argv = ["--output", "x.json", "--device", "h100", "--implementation", "triton", "--precisions", "bf16", "fp32"]
    argv += ["--head-dims", "16", "256", "--shapes", "2x1024x1024", "1x1531x1000", "3x777x2049"]
    specs = correctness.correctness_specs(correctness.parse_args(argv), seed=7)
    groups = correctness._groups("triton", specs, "cuda")
    shapes = [[(s["batch"], s["n_queries"], s["n_keys"]) for s in g] for g in groups]
    # the two ragged shapes share tiles (buckets 2048 and 4096) and length classes: one task, one compile
    assert shapes == [[(2, 1024, 1024)], [(1, 1531, 1000), (3, 777, 2049)]] * 8
    order = [(g[0]["precision"], g[0]["head_dim"], g[0]["causal"]) for g in groups[::2]]
    assert order == [("fp32", 256, True), ("fp32", 256, False), ("fp32", 16, True), ("fp32", 16, False)] + [
        ("bf16", 256, True),
        ("bf16", 256, False),
        ("bf16", 16, True),
        ("bf16", 16, False),
    ]
    assert sorted(s["seed"] for g in groups for s in g) == [s["seed"] for s in specs]  # each entry once
    assert correctness._groups("pytorch", specs, "cuda") == [[s] for s in specs]  # nothing to compile


def test_entries_come_back_in_the_grids_order(monkeypatch):
    """Tasks run slowest first; the record lists its entries in the grid's order all the same."""
    monkeypatch.setattr(correctness, "_groups", lambda impl, specs, device_type: [[s] for s in reversed(specs)])
    monkeypatch.setattr(
        correctness,
        "correctness_group",
        lambda impl, specs, device_type, tiles: [dict(s, status="ok", saved_contract_ok=True) for s in specs],
    )
    argv = ["--output", "x.json", "--device", "cpu", "--implementation", "pytorch", "--workers", "1"]
    args = correctness.parse_args(argv + ["--head-dims", "16", "32", "--shapes", "2x8x8", "1x9x5"])
    m = correctness.correctness_measure(args, torch.device("cpu"), seed=100)
    want = correctness.correctness_specs(args, seed=100)
    assert [(e["seed"], e["head_dim"], e["n_queries"]) for e in m["entries_detail"]] == [
        (s["seed"], s["head_dim"], s["n_queries"]) for s in want
    ]
    assert m["entries"] == len(want) == 24 and m["entries_ok"] == 24


def test_the_courses_entries_run_first_and_the_record_says_when_they_ended(monkeypatch):
    """With --course-precisions and --course-head-dims, the course's entries' tasks go first, the
    process's age is taken when the last of them is done, then the others run; each entry says which
    it is. The record lists its entries in the grid's order all the same."""
    events = []
    monkeypatch.setattr(devices, "process_age_s", lambda: events.append("age") or 12.5)

    def group(impl, specs, device_type, tiles):
        events.append(tuple(s["course"] for s in specs))
        return [dict(s, status="ok", saved_contract_ok=True) for s in specs]

    monkeypatch.setattr(correctness, "correctness_group", group)
    argv = ["--output", "x.json", "--device", "cpu", "--implementation", "pytorch", "--workers", "1"]
    argv += ["--precisions", "fp32", "fp16", "--head-dims", "16", "80", "--shapes", "2x8x8"]
    args = correctness.parse_args(argv + ["--course-precisions", "fp32", "bf16", "--course-head-dims", "16", "32"])
    m = correctness.correctness_measure(args, torch.device("cpu"), seed=100)
    # fp32 at d = 16 (causal or not) is the course's; fp16, and d = 80, are not
    assert events == [(True,), (True,), "age"] + [(False,)] * 6
    assert m["course_part_process_age_s"] == 12.5 and m["course_entries"] == 2 and m["entries"] == 8
    assert [(e["precision"], e["head_dim"], e["course"]) for e in m["entries_detail"][:4]] == [
        ("fp32", 16, True),
        ("fp32", 16, True),
        ("fp32", 80, False),
        ("fp32", 80, False),
    ]
    assert [e["seed"] for e in m["entries_detail"]] == list(range(100, 108))
    # without the flags every entry is the course's, and the record has no course part
    events.clear()
    m = correctness.correctness_measure(correctness.parse_args(argv), torch.device("cpu"), seed=100)
    assert "age" not in events and "course_part_process_age_s" not in m and m["course_entries"] == 8


def test_the_report_says_which_entries_are_the_courses():
    record = {
        "metrics": {"course_part_process_age_s": 12.5, "course_entries": 2},
        "provenance": {"settings": {"course_precisions": ["fp32", "bf16"], "course_head_dims": [16, 32]}},
    }
    assert report._course_entries_text(record) == (
        " 2 of them are the course's (precisions fp32, bf16 × head dims 16, 32), checked first; the others are "
        "this project's additions, whose time the header counts apart."
    )
    record["metrics"].pop("course_part_process_age_s")  # every entry the course's: nothing to say
    assert report._course_entries_text(record) == ""


def test_correctness_refuses_one_key_shapes():
    with pytest.raises(SystemExit):
        correctness.parse_args(
            ["--output", "x.json", "--device", "cpu", "--implementation", "pytorch", "--shapes", "2x8x1"]
        )


# --- benchmark and leaderboard: CPU ---------------------------------------------------------------------


def test_benchmark_and_leaderboard_write_unsupported_without_cuda(tmp_path, monkeypatch):
    from lmperf.kernels.flash import warm

    warmed = []
    monkeypatch.setattr(warm, "warm", lambda specs, workers=None: warmed.append(specs))
    template = str(tmp_path / "bench_{impl}_bf16_d{head_dim}_n{seq_len}.json")
    assert (
        benchmark.main(
            [
                "--device",
                "cpu",
                "--precision",
                "bf16",
                "--output",
                template,
                "--head-dims",
                "16",
                "32",
                "--sequence-lengths",
                "128",
                "256",
            ]
        )
        == 0
    )
    paths = sorted(tmp_path.glob("bench_*.json"))
    assert len(paths) == 3 * 2 * 2
    for path in paths:
        r = load_record(path)
        assert r["status"] == "unsupported" and "no CUDA" in r["reason"] and r["metrics"] == {}
        assert r["cell"]["test"] == "benchmark" and r["cell"]["batch_size"] == 1 and r["cell"]["causal"]
    assert leaderboard.main(["--device", "cpu", "--output", str(tmp_path / "leaderboard.json")]) == 0
    r = load_record(tmp_path / "leaderboard.json")
    assert r["status"] == "unsupported" and "no CUDA" in r["reason"]
    assert warmed == []  # nothing compiled for a device that is not there


# --- benchmark and leaderboard: the CUDA paths on fake timings ------------------------------------


FACTOR = {"plain": 4.0, "flash_triton": 1.0, "sdpa_efficient": 0.8, "sdpa_flash": 0.8, "sdpa_cudnn": 0.5}
PLAIN_OOM_FROM = 2048


def fake_forward_ms(impl, seq, head_dim):
    return FACTOR[impl] * seq**2 * head_dim * 1e-8


def fake_time_attention(batch, seq, head_dim, dtype, causal, impl, *, warmup_ms=25, rep_ms=100):
    fwd = fake_forward_ms(impl, seq, head_dim)
    result = {"forward_ms": fwd, "backward_ms": 2 * fwd, "forward_backward_ms": 3 * fwd, "status": "ok", "error": None}
    if impl == "plain" and seq >= PLAIN_OOM_FROM:  # the forward fits, its backward does not
        result.update(
            backward_ms=float("nan"),
            forward_backward_ms=float("nan"),
            status="oom",
            error="CUDA out of memory. Tried to allocate 16.00 GiB.",
        )
    if impl == "sdpa_efficient" and head_dim == 32 and seq == 256:
        result.update(
            {f"{p}_ms": float("nan") for p in ("forward", "backward", "forward_backward")},
            status="error",
            error="RuntimeError: No available kernel. Aborting execution.",
        )
    return result


def fake_time_leaderboard(impl="flash_triton", *, compile=True, warmup_ms=1000, rep_ms=10000, head_dim=None):
    ms = {"flash_triton": 5.1, "sdpa_flash": 7.1, "sdpa_cudnn": 4.5}[impl]
    return {"forward_backward_ms_median": ms, "forward_backward_ms_mean": ms + 0.05, "status": "ok", "error": None}


def _fake_gpu(monkeypatch) -> dict:
    """lmperf.kinds.flash.harness's timing functions and the CUDA calls of the cells, replaced."""
    from lmperf.kernels.flash import warm
    from lmperf.kinds.flash import harness as bench

    # events: ("warm", specs, workers), ("time", impl, (batch, n, d, dtype, causal, allow_tf32)),
    # ("protocol", impl, head_dim), ("first_calls", shapes), in the order the cells call them
    calls = {"first_calls": [], "events": []}
    monkeypatch.setattr(devices, "git_state", lambda: {"git_commit": "0" * 40, "git_dirty": False})
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(devices, "check_device", lambda slug: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **k: 123 * MIB)

    def time_attention(batch, seq, head_dim, dtype, causal, impl, **timing):
        shape = (batch, seq, head_dim, dtype, causal, torch.backends.cuda.matmul.allow_tf32)
        calls["events"].append(("time", impl, shape))
        return fake_time_attention(batch, seq, head_dim, dtype, causal, impl, **timing)

    def time_leaderboard(impl="flash_triton", **kwargs):
        calls["events"].append(("protocol", impl, kwargs.get("head_dim")))
        return fake_time_leaderboard(impl, **kwargs)

    def fake_warm(specs, workers=None):
        calls["events"].append(("warm", [dict(s) for s in specs], workers))
        return {"workers": 2, "shapes": 7, "combinations": 2, "wall_s": 0.25, "tasks": [{"kernel": "fwd"}] * 21}

    monkeypatch.setattr(bench, "time_attention", time_attention)
    monkeypatch.setattr(bench, "time_leaderboard", time_leaderboard)
    monkeypatch.setattr(warm, "warm", fake_warm)

    def first_calls(run, shapes):
        calls["first_calls"].append(list(shapes))
        calls["events"].append(("first_calls", list(shapes)))
        return {
            "first_call_s": {"x".join(map(str, s)): 2.0 for s in shapes},
            "tuning_s": 1.5,
            "tile_sources": {"committed": 3 * len(shapes)},
            "compile_and_first_run_s": 2.0 * len(shapes) - 1.5,
        }

    tiles = {
        "fwd": {
            "key": "fwd|bf16|d64|causal|n16384",
            "source": "committed",
            "config": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
        }
    }
    for module in (benchmark, leaderboard):
        monkeypatch.setattr(module, "first_calls", first_calls)
        monkeypatch.setattr(
            module, "tuning_settings", lambda p, w, r: {"tuning_do_bench": f"do_bench({w}, {r})", "tuning_policy": p}
        )
        monkeypatch.setattr(module, "tuned_choices", lambda: tiles)
    return calls


@pytest.fixture
def fake_gpu(monkeypatch):
    return _fake_gpu(monkeypatch)


@pytest.fixture(scope="module")
def fake_gpu_records(tmp_path_factory):
    """Both precisions' benchmark records and the leaderboard record from the fakes, for the report."""
    flash_dir = tmp_path_factory.mktemp("h100") / "results" / "h100" / "flash"
    with pytest.MonkeyPatch.context() as monkeypatch:
        calls = _fake_gpu(monkeypatch)
        records = {
            "fp32": fake_benchmark(flash_dir, "fp32", "EFFICIENT_ATTENTION"),
            "bf16": fake_benchmark(flash_dir, "bf16", "FLASH_ATTENTION"),
            "leaderboard": fake_leaderboard(flash_dir),
        }
    return flash_dir, records, calls


HEAD_DIMS, LENGTHS = (16, 32), (128, 256, 1024, 2048, 4096)


def fake_benchmark(root: Path, precision: str, backend: str) -> dict:
    template = str(root / f"bench_{{impl}}_{precision}_d{{head_dim}}_n{{seq_len}}.json")
    assert (
        benchmark.main(
            [
                "--device",
                "h100",
                "--precision",
                precision,
                "--sdpa-backend",
                backend,
                "--output",
                template,
                "--head-dims",
                *map(str, HEAD_DIMS),
                "--sequence-lengths",
                *map(str, LENGTHS),
                "--autotune-warmup-ms",
                "5",
                "--autotune-rep-ms",
                "25",
                "--workers",
                "3",
            ]
        )
        == 0
    )
    return {
        (impl, d, n): load_record(template.format(impl=impl, head_dim=d, seq_len=n))
        for impl in ("plain", "flash_triton", "sdpa")
        for d in HEAD_DIMS
        for n in LENGTHS
    }


def test_benchmark_cuda_path_on_fake_timings(fake_gpu_records):
    _, all_records, calls = fake_gpu_records
    records = all_records["fp32"]
    # before timing, one first run per (head dim, length) of each job (tuning and compilation)
    first = calls["first_calls"]
    assert first[: len(HEAD_DIMS) * len(LENGTHS)] == [[(1, n, d)] for d in HEAD_DIMS for n in LENGTHS]
    for (impl, d, n), r in records.items():
        m = r["metrics"]
        fwd = fake_forward_ms("sdpa_efficient" if impl == "sdpa" else impl, n, d)
        assert r["cell"] == {
            "test": "benchmark",
            "implementation": impl,
            "precision": "fp32",
            "head_dim": d,
            "sequence_length": n,
            "batch_size": 1,
            "causal": True,
        }
        assert r["provenance"]["settings"]["tuning_do_bench"] == "do_bench(5.0, 25.0)"
        assert r["provenance"]["settings"]["tuning_policy"] == "missing"
        if impl == "plain" and n >= PLAIN_OOM_FROM:
            assert r["status"] == "oom" and "out of memory" in r["reason"]
            assert m["forward_ms_median"] == pytest.approx(fwd) and m["backward_ms_median"] is None
            continue
        if impl == "sdpa" and d == 32 and n == 256:
            assert r["status"] == "unsupported" and "No available kernel" in r["reason"]
            assert m["ran"] == "sdpa_efficient" and m["timing_status"] == "error"
            continue
        assert r["status"] == "ok"
        assert m["forward_ms_median"] == pytest.approx(fwd) and m["forward_backward_ms_median"] == pytest.approx(
            3 * fwd
        )
        # causal forward: 4 * B * N^2 * d / 2 FLOPs; backward 2.5x
        assert m["forward_tflops"] == pytest.approx(2 * n * n * d / (fwd * 1e-3) / 1e12)
        assert m["backward_tflops"] == pytest.approx(5 * n * n * d / (2 * fwd * 1e-3) / 1e12)
        assert m["peak_allocated_mib"] == 123
        if impl == "sdpa":
            assert m["ran"] == "sdpa_efficient" and m["sdpa_backend"] == "EFFICIENT_ATTENTION"
        if impl == "plain":
            assert m["speedup_vs_plain_forward"] is None
        elif n < PLAIN_OOM_FROM:
            want = FACTOR["plain"] / FACTOR["sdpa_efficient" if impl == "sdpa" else impl]
            assert m["speedup_vs_plain_forward_backward"] == pytest.approx(want)
        else:  # plain's backward ran out of memory: a forward speed-up only
            assert m["speedup_vs_plain_forward_backward"] is None
            assert m["speedup_vs_plain_forward"] == pytest.approx(
                FACTOR["plain"] / FACTOR["sdpa_efficient" if impl == "sdpa" else impl]
            )
        if impl == "flash_triton":
            assert m["tuning_s"] == 1.5 and m["first_call_s"] == {f"1x{n}x{d}": 2.0}  # apart from the timings
            assert m["warm_compile_s"] >= 0 and m["warm_compile_shapes"] == 7 and m["warm_compile_workers"] == 2
            assert m["tiles"]["fwd"]["config"]["BLOCK_N"] == 64 and m["tiles"]["fwd"]["source"] == "committed"
        else:  # the warm-up compiled our kernels only
            assert "warm_compile_s" not in m


def _warmed_then_timed(events: list, warmed_impl: str = "flash_triton") -> tuple[list, list]:
    """The one warm-up's shapes and the shapes `warmed_impl` was timed at, checking the warm-up came first."""
    assert [e[0] for e in events].count("warm") == 1 and events[0][0] == "warm"  # once, before anything
    warmed = [(s["batch"], s["n_queries"], s["head_dim"], s["dtype"], s["causal"], s["tf32"]) for s in events[0][1]]
    assert all(s["n_keys"] == s["n_queries"] for s in events[0][1])
    timed = [e[2] for e in events if e[0] == "time" and e[1] == warmed_impl]
    return warmed, timed


@pytest.mark.parametrize(("precision", "backend"), [("tf32", "EFFICIENT_ATTENTION"), ("bf16", "FLASH_ATTENTION")])
def test_benchmark_warms_exactly_what_flash_triton_then_runs(tmp_path, fake_gpu, precision, backend):
    from lmperf.core.dtypes import dtype_name

    fake_benchmark(tmp_path, precision, backend)
    warmed, timed = _warmed_then_timed(fake_gpu["events"])
    assert fake_gpu["events"][0][2] == 3  # --workers 3
    # timed: (batch, n, d, torch dtype, causal, allow_tf32 while timing) -> the warm-up's (..., dtype name, causal, tf32)
    assert warmed == [(b, n, d, dtype_name(dt), causal, tf32) for b, n, d, dt, causal, tf32 in timed]
    assert len(timed) == len(HEAD_DIMS) * len(LENGTHS)
    assert {w[3:] for w in warmed} == {("fp32", True, True) if precision == "tf32" else ("bf16", True, False)}


def test_benchmark_without_flash_triton_warms_nothing(tmp_path, fake_gpu):
    template = str(tmp_path / "bench_{impl}_bf16_d{head_dim}_n{seq_len}.json")
    argv = ["--device", "h100", "--precision", "bf16", "--output", template, "--implementations", "plain", "sdpa"]
    assert benchmark.main(argv + ["--head-dims", "16", "--sequence-lengths", "128"]) == 0
    assert "warm" not in [e[0] for e in fake_gpu["events"]] and fake_gpu["events"]


def test_benchmark_refuses_the_interpreter_on_cuda(tmp_path, fake_gpu, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        fake_benchmark(tmp_path, "bf16", "FLASH_ATTENTION")


def _warmed(event) -> list:
    return sorted((s["batch"], s["n_queries"], s["head_dim"], s["dtype"], s["causal"], s["tf32"]) for s in event[1])


def test_leaderboard_warms_exactly_what_our_kernel_then_runs(tmp_path, fake_gpu, monkeypatch):
    """The course's part first (our kernel's protocol at the leaderboard's shape, warmed and run once
    before), the process's age noted, then the rest warmed before the eager table and the other protocols."""
    ages = iter([25.0])
    monkeypatch.setattr(devices, "process_age_s", lambda: next(ages, 99.0))
    path = tmp_path / "leaderboard.json"
    argv = ["--device", "h100", "--output", str(path), "--workers", "2", "--protocol-head-dims", "64", "128"]
    assert leaderboard.main(argv + ["--forward-head-dims", "80", "--forward-sequence-length", "4096"]) == 0
    events = fake_gpu["events"]
    assert [e[0] for e in events[:4]] == ["warm", "first_calls", "protocol", "warm"]
    assert events[0][2] == events[3][2] == 2  # --workers 2
    assert _warmed(events[0]) == [(16, 16384, 64, "bf16", True, False)] and events[1][1] == [(16, 16384, 64)]
    assert events[2][1:] == ("flash_triton", 64)
    # then the rest: the eager table's shapes and the protocol's other head dim, warmed before any is timed
    rest = events[4:]
    assert [e[0] for e in rest].count("warm") == 0 and rest[0] == ("first_calls", [(16, 4096, 80), (16, 16384, 128)])
    timed = [e[2] for e in rest if e[0] == "time" and e[1] == "flash_triton"]
    protocol = [(16, 16384, e[2], torch.bfloat16, True, False) for e in events if e[0] == "protocol"]
    assert [e[1:] for e in rest if e[0] == "protocol"] == [
        ("sdpa_flash", 64),
        ("sdpa_cudnn", 64),
        ("flash_triton", 128),
        ("sdpa_flash", 128),
        ("sdpa_cudnn", 128),
    ]
    warmed = _warmed(events[0]) + _warmed(events[3])
    assert sorted(warmed) == sorted({(b, n, d, "bf16", causal, False) for b, n, d, _, causal, _ in timed + protocol})
    m = load_record(path)["metrics"]
    assert m["course_part_process_age_s"] == 25.0
    # one record's warm-up and first runs: both parts' added up
    assert m["warm_compile_tasks"] == 42 and m["warm_compile_combinations"] == 4 and m["warm_compile_workers"] == 2
    assert m["first_runs"]["tuning_s"] == 3.0 and m["first_runs"]["tile_sources"] == {"committed": 9}
    assert set(m["first_runs"]["first_call_s"]) == {"16x16384x64", "16x4096x80", "16x16384x128"}


def test_leaderboard_without_the_course_shape_has_no_course_part(tmp_path, fake_gpu):
    path = tmp_path / "leaderboard.json"
    argv = ["--device", "h100", "--output", str(path), "--workers", "2", "--protocol-head-dims", "128"]
    assert leaderboard.main(argv + ["--forward-head-dims", "128"]) == 0
    assert [e[0] for e in fake_gpu["events"]].count("warm") == 1
    assert "course_part_process_age_s" not in load_record(path)["metrics"]


def fake_leaderboard(root: Path) -> dict:
    path = root / "leaderboard.json"
    assert leaderboard.main(["--device", "h100", "--output", str(path), "--workers", "2"]) == 0
    return load_record(path)


def test_leaderboard_cuda_path_on_fake_timings(fake_gpu_records):
    _, records, calls = fake_gpu_records
    r = records["leaderboard"]
    m = r["metrics"]
    assert r["status"] == "ok" and r["cell"] == {"test": "leaderboard"}
    assert m["ratio_flash_triton_over_sdpa_flash"] == pytest.approx(5.1 / 7.1)
    assert m["ratio_flash_triton_over_sdpa_cudnn"] == pytest.approx(5.1 / 4.5)
    assert m["flash_triton_forward_backward_ms_median"] == 5.1
    assert m["leaderboard_shape"] == {"batch": 16, "seq": 16384, "head_dim": 64, "dtype": "bf16", "causal": True}
    assert calls["first_calls"][-2:] == [[(16, 16384, 64)], [(16, 16384, 128)]]  # the course's shape first
    assert m["first_runs"]["tuning_s"] == 3.0 and m["course_part_process_age_s"] > 0
    assert m["warm_compile_s"] >= 0 and m["warm_compile_combinations"] == 4 and "warm_compile_error" not in m
    for d in ("64", "128"):  # the protocol at both head dims, side by side
        assert m["protocol_by_head_dim"][d]["ratio_flash_triton_over_sdpa_cudnn"] == pytest.approx(5.1 / 4.5)
        assert m[f"ratio_flash_triton_over_sdpa_cudnn_d{d}"] == pytest.approx(5.1 / 4.5)
    rows = {(x["implementation"], x["head_dim"]): x for x in m["side_by_side"]}
    assert set(rows) == {(i, d) for i in ("flash_triton", "sdpa_flash", "sdpa_cudnn") for d in (64, 128)}
    x = rows[("flash_triton", 128)]
    fwd = fake_forward_ms("flash_triton", 16384, 128)
    assert x["batch_size"] == 16 and x["forward_ms_median"] == pytest.approx(fwd)
    assert x["forward_tflops"] == pytest.approx(4 * 16 * 16384**2 * 128 / 2 / (fwd * 1e-3) / 1e12)


# --- the report, on GPU-shaped records ---------------------------------------------------------------


def _bad_correctness_record(good: dict) -> dict:
    """The Triton record with one entry over its tolerance and one out of memory (as on a GPU)."""
    r = copy.deepcopy(good)
    entries = r["metrics"]["entries_detail"]
    entries[0].update(status="fail", O_rel_error=0.5, failed_checks=["O error 5.00e-01 >= 1e-05"])
    entries[1] = {
        k: entries[1][k]
        for k in (
            "precision",
            "head_dim",
            "causal",
            "batch",
            "n_queries",
            "n_keys",
            "seed",
            "tolerance_o_l",
            "tolerance_grad",
        )
    }
    entries[1].update(status="oom", message="CUDA out of memory.")
    r["provenance"]["device_slug"] = "h100"
    return r


@interpreter_on_cpu_only
def test_report_on_gpu_shaped_records(tmp_path, fake_gpu_records, correctness_records):
    flash_dir = fake_gpu_records[0]
    (flash_dir / "correctness_pytorch.json").write_text(json.dumps(correctness_records["pytorch"]))
    (flash_dir / "correctness_triton.json").write_text(
        json.dumps(_bad_correctness_record(correctness_records["triton"]))
    )
    out = tmp_path / "out"
    paths = sorted(map(str, flash_dir.glob("*.json")))
    assert (
        report.main(
            [
                "--device",
                "h100",
                "--tables-dir",
                str(out / "tables"),
                "--sections-dir",
                str(out / "sections"),
                "--figures-dir",
                str(out / "figures"),
                "--records",
                *paths,
            ]
        )
        == 0
    )
    sections = {p.stem: p.read_text() for p in (out / "sections").glob("*.md")}
    assert set(sections) == {"flash_forward", "flash_backward", "flash_benchmarking", "leaderboard"}
    for text in sections.values():
        last = text.rstrip().splitlines()[-1]
        assert last.startswith("_Source:") and "results/h100/flash/" in last

    forward = sections["flash_forward"]
    assert "**2 of 48 entries are not within tolerance or did not run:**" in forward
    assert "oom" in forward and "O error 5.00e-01" in forward
    assert re.search(r"\| triton\s+\| fp32\s+\|\s+0\.5\s+\|", forward)  # the injected maximum
    assert "`pytorch` 24 of 24" in forward

    text = sections["flash_benchmarking"]
    # speed-up over plain: 4x wherever plain fit (N < 2048), for both precisions
    assert "4.00× to 4.00× plain's speed (median 4.00×) over the 6 shapes where both ran" in text
    assert (
        "Plain attention first runs out of memory (status oom) at N = 2048 for d = 16 (flash_triton ran up to N = 4096)"
        in text
    )
    assert "Against sdpa (EFFICIENT_ATTENTION)" in text and "Against sdpa (FLASH_ATTENTION)" in text
    assert "1.25× to 1.25×" in text  # ours 1.0 against SDPA's 0.8
    assert "No available kernel" in text and "OOM (fwd" in text
    best = 2 * 4096**2 * 16 / (fake_forward_ms("flash_triton", 4096, 16) * 1e-3) / 1e12
    assert f"{best:.1f} TFLOP/s" in text
    assert "../results/h100/figures/flash_speedup.png" in text

    board = sections["leaderboard"]
    assert "**Ours (flash_triton): 5.100 ms**" in board
    assert f"ours/flash = {5.1 / 7.1:.3f}" in board and f"ours/cuDNN = {5.1 / 4.5:.3f}" in board
    assert "5.364 ms on an H100 (the course's figure, cited, not measured here)" in board
    assert f"Ours is {5.1 / 5.364:.3f}× that time." in board
    assert "(16, 16384, 64)" in board and "batch 16" in board

    rows = list((out / "tables" / "flash_benchmarking.csv").read_text().splitlines())
    assert len(rows) == 1 + 2 * 3 * len(HEAD_DIMS) * len(LENGTHS)
    for name in ("flash_speedup.png", "flash_time.png"):
        assert (out / "figures" / name).stat().st_size > 10_000


def test_report_without_cuda_says_what_was_not_measured(tmp_path):
    template = str(tmp_path / "flash" / "bench_{impl}_bf16_d{head_dim}_n{seq_len}.json")
    benchmark.main(
        [
            "--device",
            "cpu",
            "--precision",
            "bf16",
            "--output",
            template,
            "--head-dims",
            "16",
            "--sequence-lengths",
            "128",
        ]
    )
    leaderboard.main(["--device", "cpu", "--output", str(tmp_path / "flash" / "leaderboard.json")])
    out = tmp_path / "out"
    report.main(
        [
            "--device",
            "cpu",
            "--tables-dir",
            str(out),
            "--sections-dir",
            str(out),
            "--figures-dir",
            str(out),
            "--records",
            *map(str, sorted((tmp_path / "flash").glob("*.json"))),
        ]
    )
    assert (
        "Not measured on `cpu`: all 3 benchmark records are `unsupported` (no CUDA"
        in (out / "flash_benchmarking.md").read_text()
    )
    board = (out / "leaderboard.md").read_text()
    assert "the leaderboard record is `unsupported`" in board and "5.364 ms" in board
    assert "No correctness records" in (out / "flash_forward.md").read_text()
    assert (out / "flash_speedup.png").exists()


# --- flash in the attention sweep ------------------------------------------------------------------


@interpreter_on_cpu_only
def test_attention_cell_runs_our_triton_kernels_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    template = str(tmp_path / "flash_fp32_d{head_dim}_n{seq_len}.json")
    run_cli(
        "lmperf.kinds.attention.cell",
        "--device",
        "cpu",
        "--implementation",
        "flash",
        "--output",
        template,
        "--head-dims",
        "16",
        "--sequence-lengths",
        "40",
        "--batch-size",
        "2",
        "--warmup-passes",
        "1",
        "--measured-passes",
        "2",
        env_extra={"TRITON_INTERPRET": "1"},
    )
    r = load_record(template.format(head_dim=16, seq_len=40))
    m = r["metrics"]
    assert r["status"] == "ok" and m["output_node"] == "FlashAttention2TritonBackward"
    assert m["check_output_max_abs_error"] < 1e-5 and m["check_grad_max_abs_error"] < 1e-4
    # saved for backward beyond Q, K, V: L (2 x 40 float32) and O (2 x 40 x 16 float32)
    assert m["retained_tensors_mib"] * MIB == 2 * 40 * 4 + 2 * 40 * 16 * 4


# --- config and rules --------------------------------------------------------------------------------


@pytest.fixture
def config():
    return yaml.safe_load((REPO / "config.yaml").read_text())


def test_shipped_flash_grids(config):
    gpu, cpu = config["grids"]["gpu"]["flash"], config["grids"]["cpu"]["flash"]
    assert lmconfig.errors(config) == []
    assert set(gpu) == set(cpu)
    bench = gpu["benchmarking"]
    assert bench["sequence_lengths"] == [2**k for k in range(7, 17)] and bench["head_dims"] == [16, 32, 64, 128]
    assert set(bench["precisions"]) == {"bf16", "fp32", "tf32"} and bench["batch_size"] == 1 and bench["causal"]
    for precision in ("fp32", "tf32"):  # PyTorch's flash backend takes no fp32
        assert bench["sdpa_backends"][precision] != "FLASH_ATTENTION"
    correctness = gpu["correctness"]
    assert set(correctness["precisions"]) == {"fp32", "bf16", "fp16"} and correctness["causal"] == [False, True]
    assert 80 in correctness["head_dims"] and 256 in correctness["head_dims"]  # not only powers of two
    assert any(q != k for _, q, k in correctness["shapes"]) and any(q % 16 for _, q, _ in correctness["shapes"])
    assert "flash" in config["grids"]["gpu"]["attention"]["implementations"]


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (("correctness", "head_dims"), [16, 320], "grids.gpu.flash.correctness.head_dims[1] = 320"),
        (("correctness", "shapes"), [[2, 64]], "grids.gpu.flash.correctness.shapes[0] = [2, 64]"),
        (("correctness", "implementations"), ["cuda"], "grids.gpu.flash.correctness.implementations[0] = 'cuda'"),
        (
            ("benchmarking", "implementations"),
            ["plain", "xformers"],
            "grids.gpu.flash.benchmarking.implementations[1] = 'xformers'",
        ),
        (
            ("benchmarking", "sdpa_backends"),
            {"fp32": "FLASH"},
            "grids.gpu.flash.benchmarking.sdpa_backends.fp32 = 'FLASH'",
        ),
        (("benchmarking", "rep_ms"), 0, "grids.gpu.flash.benchmarking.rep_ms = 0"),
        (("leaderboard", "implementations"), ["plain"], "grids.gpu.flash.leaderboard.implementations[0] = 'plain'"),
        (("workers",), 0, "grids.gpu.flash.workers = 0"),
    ],
)
def test_bad_flash_values_fail_naming_the_key(config, path, value, expected):
    bad = copy.deepcopy(config)
    node = bad["grids"]["gpu"]["flash"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert any(expected in line for line in lmconfig.errors(bad)), lmconfig.errors(bad)


def test_flash_jobs_planned_by_a_dry_run(tmp_path, config):
    for name in ("Snakefile", "workflow", "src", "envs"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    config["device"] = "cpu"
    config["grids"]["cpu"] = {"e2e": config["grids"]["cpu"]["e2e"], "flash": config["grids"]["cpu"]["flash"]}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k not in ("LMPERF_AUTO_DEVICE", "TRITON_INTERPRET")}
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", "-n", "-p", "results/cpu/sections/flash_forward.md"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    block = result.stdout.split("Job stats:")[1].split("\n\n")[0]
    counts = {
        m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", block, re.M) if m.group(1) != "total"
    }
    assert counts == {"flash_correctness": 2, "flash_benchmark": 3, "flash_leaderboard": 1, "flash_report": 1}
    out = result.stdout
    assert "--implementation triton --precisions fp32 bf16 fp16 --head-dims 16 80 --causal false true" in out
    assert "--shapes 2x32x32 1x45x77 --triton-tiles pinned --course-precisions fp32 bf16 --course-head-dims 16" in out
    assert "--course-head-dims 16 --workers 1" in out
    assert "--output 'results/cpu/flash/bench_{impl}_fp32_d{head_dim}_n{seq_len}.json'" in out
    assert "--precision fp32 --sdpa-backend EFFICIENT_ATTENTION --implementations plain flash_triton sdpa" in out
    assert "--autotune-warmup-ms 5 --autotune-rep-ms 25 --precompile" in out


# --- the tuner settings the GPU paths use ----------------------------------------------------------


def test_tuning_settings_and_tile_sources():
    from lmperf.kernels.flash import tuning
    from lmperf.kinds.flash.common import tuning_settings

    try:
        assert tuning_settings("missing", 5, 25) == {
            "tuning_policy": "missing",
            "tuning_do_bench": "do_bench(warmup=5, rep=25)",
        }
        assert tuning.policy() == "missing" and (tuning.TUNE_WARMUP_MS, tuning.TUNE_REP_MS) == (5, 25)
    finally:
        tuning.configure(None, tuning.TUNE_WARMUP_MS, tuning.TUNE_REP_MS)
        tuning.set_policy(None)


# --- the warm-up the GPU cells run before timing ---------------------------------------------------


def test_warm_specs_name_the_kernels_each_precision_runs():
    from lmperf.kinds.flash.common import warm_specs

    def kernels(precision, tf32=False):
        return [(s["dtype"], s["tf32"]) for s in warm_specs([(2, 128, 64)], precision, True, tf32)]

    assert kernels("tf32") == [("fp32", True)]  # float32 inputs, TF32 products
    assert kernels("fp32") == [("fp32", False)] and kernels("fp32", tf32=True) == [("fp32", True)]
    assert kernels("bf16", tf32=True) == [("bf16", False)] and kernels("fp16") == [("fp16", False)]
    (spec,) = warm_specs([(2, 128, 64)], "bf16", False)
    assert spec == dict(batch=2, n_queries=128, n_keys=128, head_dim=64, dtype="bf16", causal=False, tf32=False)


def test_a_failed_warm_up_is_recorded_and_the_interpreter_skips_it(monkeypatch):
    from lmperf.kernels.flash import warm
    from lmperf.kinds.flash.common import warm_kernels, warm_specs

    def broken(specs, workers=None):
        raise RuntimeError("compiler crashed")

    monkeypatch.setattr(warm, "warm", broken)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    specs = warm_specs([(2, 128, 64)], "bf16", True)
    out = warm_kernels(specs)  # the kernels then compile at their first call: the cell goes on
    assert out["warm_compile_error"] == "RuntimeError: compiler crashed" and out["warm_compile_s"] >= 0
    assert warm_kernels([]) == {}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert warm_kernels(specs) == {}  # interpreted kernels compile nothing
