"""The flash cells: correctness on the CPU grid through the runner (our kernels in Triton's interpreter),
checked against float64 attention computed here; a wrong Function fails; tasks and entry order; the
benchmark and leaderboard as ``unsupported`` on a CPU and on fake CUDA timings (speed-ups, TFLOP/s,
out of memory, refusals, what is warmed), and the leaderboard's trials merged into intervals."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from conftest import cpu_grid, cpu_jobs, redirect, run_job

from lmperf.core import device as devices
from lmperf.core import trials
from lmperf.core.cell import CellJob
from lmperf.core.record import load_record
from lmperf.kinds.flash import benchmark, common, correctness, grid, harness, leaderboard
from lmperf.kinds.flash.leaderboard_report import LeaderboardFacts

SMALL = {"precisions": ["fp32", "bf16"], "head_dims": [16], "causal": [False, True]}
SMALL |= {"shapes": [[2, 33, 20], [1, 17, 50]]}


@pytest.mark.skipif(torch.cuda.is_available(), reason="our kernels' interpreter path is the CPU machines'")
def test_correctness_on_the_cpu_grid_through_the_runner(tmp_path):
    jobs = cpu_jobs("flash", tmp_path, seed=1000, correctness=cpu_grid()["flash"]["correctness"] | SMALL)
    records = {}
    for job in [j for j in jobs if j.cell == "flash_correctness"]:
        run_job(job)
        (path,) = job.records
        records[job.settings["implementation"]] = load_record(path)
    for impl, r in records.items():
        m = r["metrics"]
        assert r["status"] == "ok" and m["entries"] == m["entries_ok"] == 8 and m["all_within_tolerance"]
        assert [e["seed"] for e in m["entries_detail"]] == list(range(1000, 1008))  # the grid's order
        for e in m["entries_detail"]:
            o_l, grad = correctness.TOLERANCES[impl][e["precision"]]
            assert e["saved_contract_ok"] and all(0 < e[f"{t}_rel_error"] < o_l for t in ("O", "L"))
            assert all(0 < e[f"{t}_rel_error"] < grad for t in ("dQ", "dK", "dV"))
        # bf16 carries 8 significant bits: its output error exceeds fp32's by orders of magnitude
        worst = {p: max(e["O_rel_error"] for e in m["entries_detail"] if e["precision"] == p) for p in ("fp32", "bf16")}
        assert worst["bf16"] > 100 * worst["fp32"]
    assert records["triton"]["metrics"]["kernel_mode"] == "triton interpreter (TRITON_INTERPRET=1)"
    # one entry recomputed here from its seed, against float64 attention written out by hand
    e = next(x for x in records["pytorch"]["metrics"]["entries_detail"] if x["causal"] and x["n_queries"] == 17)
    gen = torch.Generator().manual_seed(e["seed"])
    q, k, v, do = (torch.randn(1, n, 16, generator=gen) for n in (17, 50, 50, 17))
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    s = (q64 @ k64.transpose(1, 2) / 4.0).masked_fill(torch.ones(17, 50, dtype=torch.bool).triu(1), -math.inf)
    ref = torch.softmax(s, dim=-1) @ v64
    ref.backward(do.double())
    qg = q.clone().requires_grad_()
    o = correctness._function("pytorch").apply(qg, k, v, True)
    o.backward(do)
    for got, want, name in ((o, ref, "O"), (qg.grad, q64.grad, "dQ")):
        assert ((got.double() - want).norm() / want.norm()).item() == pytest.approx(e[f"{name}_rel_error"], rel=1e-6)


class _Wrong(torch.autograd.Function):
    """Scales O by 1.01, saves a second tensor of L's shape in float64, returns zero gradients."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        from lmperf.kernels.flash.reference import attention_reference

        o, lse = attention_reference(q.double(), k.double(), v.double(), is_causal)
        ctx.save_for_backward(lse.float(), lse, q, k, v)
        return (1.01 * o).to(q.dtype)

    @staticmethod
    def backward(ctx, do):
        return (*(torch.zeros_like(t) for t in ctx.saved_tensors[2:]), None)


def test_a_wrong_function_fails_every_check(monkeypatch):
    monkeypatch.setattr(correctness, "_function", lambda implementation: _Wrong)
    spec = {"precision": "fp32", "head_dim": 16, "causal": True, "batch": 2, "n_queries": 9, "n_keys": 12, "seed": 1}
    (entry,) = correctness.run_group("pytorch", [spec], "cpu", None)
    assert entry["status"] == "fail" and not entry["saved_contract_ok"]
    assert entry["O_rel_error"] == pytest.approx(0.01, rel=1e-3) and entry["dQ_rel_error"] == pytest.approx(1.0)
    checks = " | ".join(entry["failed_checks"])
    assert "O error" in checks and "dK error" in checks and "saved 2 tensor(s)" in checks


def test_triton_tasks_share_binaries_and_run_slowest_first(monkeypatch):
    from lmperf.kernels.flash import tuning

    # tiles by bucket, as a remembered table may give them: 1024 apart, 2048 and 4096 alike
    monkeypatch.setattr(tuning, "planned", lambda *a: {"BLOCK_M": 64 if max(a[5], a[6]) <= 1024 else 32, "BLOCK_N": 32})
    monkeypatch.setattr(tuning, "device_slug", lambda device=None: "h100")
    grid_ = {"precisions": ["bf16", "fp32"], "head_dims": [16, 256], "causal": [False, True]}
    specs = correctness.specs(grid_ | {"shapes": [[2, 1024, 1024], [1, 1531, 1000], [3, 777, 2049]]}, seed=7)
    groups = correctness.groups("triton", specs, "cuda")
    # the two ragged shapes share tiles (buckets 2048 and 4096) and length classes: one task, one compile
    assert [[(s["batch"], s["n_queries"]) for s in g] for g in groups] == [[(2, 1024)], [(1, 1531), (3, 777)]] * 8
    order = [(g[0]["precision"], g[0]["head_dim"], g[0]["causal"]) for g in groups[::2]]
    assert order == [(p, d, c) for p in ("fp32", "bf16") for d in (256, 16) for c in (True, False)]
    assert correctness.groups("pytorch", specs, "cuda") == [[s] for s in specs]  # nothing to compile


def test_benchmark_and_leaderboard_are_unsupported_without_cuda(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "warm", lambda *a: pytest.fail("nothing to compile without CUDA"))
    jobs = [j for j in cpu_jobs("flash", tmp_path) if j.cell != "flash_correctness"]
    for job in jobs:
        run = benchmark.run if job.cell == "flash_benchmark" else leaderboard.run
        assert run(CellJob(job.cell, "cpu", job.settings, job.output)) == 0
    records = [load_record(path) for job in jobs for path in job.records]
    assert len(records) == 3 * 2 * 3 + 1 and all(r["status"] == "unsupported" for r in records)
    assert all("no CUDA device" in r["reason"] and r["metrics"] == {} for r in records)


PLAIN_OOM_FROM = 2048
FACTOR = {"plain": 4.0, "flash": 1.0, "sdpa": 0.8, "sdpa_flash": 1.4, "sdpa_cudnn": 0.5}


@pytest.fixture
def fake_gpu(monkeypatch):
    """The cells on a fake CUDA device: timings FACTOR × N² × d × 1e-8 ms (plain's backward out of
    memory from PLAIN_OOM_FROM, sdpa refusing d = 32 at N = 256); returns the calls, in order."""
    calls, allow_tf32 = [], torch.backends.cuda.matmul.allow_tf32
    monkeypatch.setattr(devices, "check_device", lambda slug: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 123 * 2**20)
    monkeypatch.setattr(
        common, "warm", lambda shapes, *a: calls.append(("warm", sorted(shapes))) or {"warm_compile_s": 1.0}
    )
    monkeypatch.setattr(common, "configure_tuning", lambda s: {"tuning_policy": s["tune"]})
    monkeypatch.setattr(common, "tuned", lambda: {"tiles": {"fwd": {"source": "committed"}}, "tuning_s": 0.5})
    monkeypatch.setattr(harness, "implementation", lambda name, backend=None: name)
    for cell in (benchmark, leaderboard):
        monkeypatch.setattr(cell, "free_memory", lambda device: None)  # no CUDA cache to empty

    def time_attention(batch, n, d, dtype, causal, impl, **timing):
        calls.append(("time", impl, n, d, torch.backends.cuda.matmul.allow_tf32))
        fwd = FACTOR[impl] * n * n * d * 1e-8
        out = {"forward_ms": fwd, "backward_ms": 2 * fwd, "forward_backward_ms": 3 * fwd, "status": "ok", "error": None}
        if impl == "plain" and n >= PLAIN_OOM_FROM:  # the forward fits, its backward does not
            out |= {"backward_ms": math.nan, "forward_backward_ms": math.nan, "status": "oom", "error": "CUDA OOM"}
        if impl == "sdpa" and (d, n) == (32, 256):
            out = {"forward_ms": math.nan, "status": "error", "error": "RuntimeError: No available kernel."}
        return out

    def time_leaderboard(impl, *, head_dim, **timing):
        calls.append(("protocol", impl, head_dim))
        return {"forward_backward_ms_median": FACTOR[impl] * head_dim / 10, "status": "ok", "error": None}

    monkeypatch.setattr(harness, "time_attention", time_attention)
    monkeypatch.setattr(harness, "time_leaderboard", time_leaderboard)
    yield calls
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32  # the benchmark sets it for its whole process


def _gpu_job(tmp_path, part: str, **settings):
    """The job of ``part`` (benchmarking or leaderboard) of the CPU grid with ``settings``, on an H100."""
    flash = cpu_grid()["flash"]
    (job,) = grid.jobs({"seed": None, "workers": 2, part: flash[part] | settings}, "h100")
    return redirect(job, tmp_path)


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_benchmark_on_fake_cuda_timings(tmp_path, fake_gpu, precision):
    job = _gpu_job(tmp_path, "benchmarking", precisions=[precision], head_dims=[16, 32], sequence_lengths=[256, 2048])
    assert benchmark.run(CellJob(job.cell, "h100", job.settings, job.output)) == 0
    assert fake_gpu[0] == ("warm", [(1, n, d) for n in (256, 2048) for d in (16, 32)])  # every shape, before timing
    assert {c[4] for c in fake_gpu[1:]} == {precision == "tf32"}  # TF32 matmuls for tf32 only
    assert [c[1] for c in fake_gpu[1:4]] == ["plain", "flash", "sdpa"]  # plain first: the speed-ups need it
    for path, cell in job.records.items():
        r, impl, d, n = load_record(path), cell["implementation"], cell["head_dim"], cell["sequence_length"]
        m, fwd = r["metrics"], FACTOR[impl] * n * n * d * 1e-8
        assert r["cell"] == cell
        if impl == "sdpa" and (d, n) == (32, 256):
            assert r["status"] == "unsupported" and "No available kernel" in r["reason"]
            continue
        assert m["forward_ms_median"] == pytest.approx(fwd) and m["peak_allocated_mib"] == 123
        assert m["dot_precision"] == precision  # what our kernels multiply in: tf32 or bf16 here
        assert m["forward_tflops"] == pytest.approx(2 * n * n * d / (fwd * 1e-3) / 1e12)  # causal: 4·N²·d / 2
        assert m["backward_flops"] == 2.5 * m["forward_flops"]
        if impl == "plain":
            assert r["status"] == ("oom" if n >= PLAIN_OOM_FROM else "ok") and "speedup_vs_plain_forward" not in m
            continue
        assert m["speedup_vs_plain_forward"] == pytest.approx(FACTOR["plain"] / FACTOR[impl])
        both = m["speedup_vs_plain_forward_backward"]  # none where plain's backward ran out of memory
        assert both == (None if n >= PLAIN_OOM_FROM else pytest.approx(FACTOR["plain"] / FACTOR[impl]))
        assert ("tiles" in m and m["warm_compile_s"] == 1.0) == (impl == "flash")
        assert m.get("sdpa_backend") == (job.settings["sdpa_backend"] if impl == "sdpa" else None)


def _leaderboard(tmp_path) -> dict:
    job = _gpu_job(tmp_path, "leaderboard", protocol_head_dims=[64, 128], forward_head_dims=[64])
    assert leaderboard.run(CellJob(job.cell, "h100", job.settings, job.output)) == 0
    return load_record(next(iter(job.records)))


def test_leaderboard_on_fake_cuda_timings(tmp_path, fake_gpu):
    r = _leaderboard(tmp_path)
    m = r["metrics"]
    assert fake_gpu[0] == ("warm", [(16, 16384, 64), (16, 16384, 128)])
    assert [c[1:] for c in fake_gpu if c[0] == "protocol"][:2] == [("flash", 64), ("sdpa_flash", 64)]  # ours first
    assert m["flash_d64_forward_backward_ms_median"] == 6.4 and m["sdpa_cudnn_d128_forward_backward_ms_median"] == 6.4
    assert m["protocol_by_head_dim"]["64"]["flash"]["tiles"] == {"fwd": {"source": "committed"}}
    (row,) = [x for x in m["side_by_side"] if x["implementation"] == "flash"]
    fwd = 16384**2 * 64 * 1e-8
    assert row["forward_tflops"] == pytest.approx(4 * 16 * 16384**2 * 64 / 2 / (fwd * 1e-3) / 1e12)
    facts = LeaderboardFacts(r, "h100")
    assert facts.at("sdpa_flash").verdict == "faster" and facts.at("sdpa_cudnn").verdict == "slower"


def test_leaderboard_trials_merge_into_intervals_the_report_reads(tmp_path, fake_gpu, monkeypatch):
    """Three trials whose ours-against-cuDNN gap is 5%: one trial says nothing beyond twice the margin
    (within noise); the merged record's interval of tight trials makes it slower."""
    records = []
    for i, scale in enumerate((0.525, 0.526, 0.527)):
        monkeypatch.setitem(FACTOR, "flash", scale)
        records.append(_leaderboard(tmp_path / str(i)))
    assert LeaderboardFacts(records[0], "h100").at("sdpa_cudnn").verdict == "within noise"
    merged = trials.merge(records)
    name = "flash_d64_forward_backward_ms_median"
    logs = [math.log(r["metrics"][name]) for r in records]  # Student's t, 2 degrees of freedom: 4.303
    half = 4.303 * statistics.stdev(logs) / math.sqrt(3)
    expected = [math.exp(statistics.mean(logs) - half), math.exp(statistics.mean(logs) + half)]
    assert merged["metrics"][f"{name}_interval"] == pytest.approx(expected)
    assert LeaderboardFacts(merged, "h100").at("sdpa_cudnn").verdict == "slower"
