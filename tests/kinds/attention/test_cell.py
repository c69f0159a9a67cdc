"""The attention cell: the CPU grid's jobs (one through the runner), out of memory as a record, the
fresh process after a leak, our kernels' warm-up on (faked) CUDA, and the grid and schema."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from conftest import cpu_jobs, run_job

from lmperf import attention
from lmperf.core import device
from lmperf.core.record import load_record
from lmperf.kinds.attention import cell
from lmperf.kinds.attention import memory_model as memory

# a short grid: N = 16 runs every measured pass, N = 48 (past full_passes_up_to) stops after one
SMALL = {"head_dims": [8, 16], "sequence_lengths": [48, 16], "batch_size": 2, "measured_passes": 3}
SMALL |= {"full_passes_up_to": 16, "min_measured_passes": 1, "max_phase_seconds": 1e-6}
OOM = (
    "CUDA out of memory. Tried to allocate 32.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 14.50 GiB is "
    "free. Of the allocated memory 64.25 GiB is allocated by PyTorch, and 1.50 MiB is reserved by PyTorch but unallocated."
)


def job(tmp_path, implementation: str, **changes):
    (out,) = cpu_jobs("attention", tmp_path, **{**SMALL, "implementations": [implementation], **changes})
    return out


def run(j, *extra: str) -> dict:
    """Run the job in this process; its records by (d, N)."""
    assert cell.main(["--device", "cpu", "--job", j.argument(), *extra]) == 0
    return {(c["head_dim"], c["sequence_length"]): load_record(p) for p, c in j.records.items()}


def test_cpu_jobs_record_time_and_what_autograd_keeps(tmp_path):
    plain = job(tmp_path, "plain")
    run_job(plain)  # through the runner, as the workflow runs it
    by_cell = {(c["head_dim"], c["sequence_length"]): load_record(p) for p, c in plain.records.items()}
    for impl, records in (("plain", by_cell), ("sdpa", run(job(tmp_path, "sdpa")))):
        for (d, n), r in records.items():
            m, shape = r["metrics"], memory.Shape(2, n, d, 4)
            assert r["status"] == "ok" and r["cell"] == {
                "implementation": impl,
                "head_dim": d,
                "sequence_length": n,
                "batch_size": 2,
                "precision": "fp32",
            }
            assert r["provenance"]["settings"]["implementation"] == impl
            assert m["forward_n"] == m["backward_n"] == (3 if n <= 16 else 1)
            assert len(m["forward_ms_samples"]) == m["forward_n"]
            assert m["retained_tensors_mib"] * 2**20 == memory.accounting(impl, shape).retained_bytes
            assert m["forward_flops"] == 4 * 2 * n * n * d and "device_total_memory_mib" not in m  # no card on a CPU
    assert r["metrics"]["sdpa_backends"] == list(cell.SDPA_FUSED_BACKENDS)
    for r in run(job(tmp_path, "sdpa_cudnn")).values():  # every cell: a record that says why, not a failed job
        assert r["status"] == "unsupported" and "cuDNN attention needs CUDA" in r["reason"]


def test_compiled_keeps_less_than_plain_and_is_not_predicted(tmp_path):
    for r in run(job(tmp_path, "compiled", head_dims=[8])).values():
        m = r["metrics"]
        assert r["status"] == "ok" and m["predicted_retained_mib"] is None  # the partitioner decides: measured only
        assert m["retained_tensors_mib"] < m["plain_predicted_retained_mib"]


@pytest.mark.parametrize("name", ["plain", "sdpa", "compiled"])
def test_what_a_cell_times_is_attention(fresh_seed, name):
    torch.manual_seed(fresh_seed)
    q, k, v = (torch.randn(2, 33, 8, requires_grad=True) for _ in range(3))
    out = cell.build(name, compile_dynamic=True)(q, k, v)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = torch.softmax(q64 @ k64.transpose(1, 2) / math.sqrt(8), dim=-1) @ v64  # float64, written out here
    assert (out.double() - ref).abs().max() < 1e-5
    grad = torch.randn_like(out)
    for g, r in zip(
        torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q64, k64, v64), grad.double())
    ):
        assert (g.double() - r).abs().max() < 1e-4


def test_out_of_memory_is_a_record_that_keeps_what_ran_before(tmp_path, monkeypatch):
    def in_forward_from_32(q, k, v, is_causal=False):
        if q.shape[-2] >= 32:
            raise torch.OutOfMemoryError(OOM)
        return attention.plain_attention(q, k, v)

    class InBackward(torch.autograd.Function):
        forward = staticmethod(lambda ctx, q, k, v: attention.plain_attention(q, k, v))

        @staticmethod
        def backward(ctx, grad):
            raise torch.OutOfMemoryError(OOM)

    monkeypatch.setitem(attention.IMPLEMENTATIONS, "oomy", in_forward_from_32)
    monkeypatch.setitem(
        attention.IMPLEMENTATIONS, "oomy_backward", lambda q, k, v, is_causal=False: InBackward.apply(q, k, v)
    )
    records = run(job(tmp_path, "oomy", head_dims=[8]))
    assert records[8, 16]["status"] == "ok"
    r, m = records[8, 48], records[8, 48]["metrics"]
    assert r["status"] == "oom" and "Tried to allocate" in r["reason"] and m["oom_phase"] == "forward warm-up"
    assert (m["oom_requested_mib"], m["oom_free_mib"]) == (32 * 1024, 14.5 * 1024) and "forward_ms_mean" not in m
    plain = memory.plain_accounting(memory.Shape(2, 48, 8, 4))
    assert m["plain_predicted_retained_mib"] * 2**20 == plain.retained_bytes
    m = run(job(tmp_path, "oomy_backward", head_dims=[8]))[8, 16]["metrics"]
    assert m["oom_phase"] == "backward warm-up" and m["forward_n"] == 3 and m["retained_tensors_mib"] > 0
    assert "backward_ms_mean" not in m


def test_an_unexpected_error_fails_the_job_without_a_record(tmp_path, monkeypatch):
    def broken(q, k, v, is_causal=False):
        raise ValueError("shape mismatch")

    monkeypatch.setitem(attention.IMPLEMENTATIONS, "broken", broken)
    with pytest.raises(ValueError, match="shape mismatch"):
        run(job(tmp_path, "broken"))
    assert not list(tmp_path.rglob("*.json"))


FAKE_WARM = {"workers": 2, "shapes": 3, "combinations": 2, "tasks": []}


class Restarted(Exception):
    pass


def test_memory_left_after_a_cell_restarts_the_process_for_the_cells_left(tmp_path, monkeypatch):
    """pytorch#82218: an out-of-memory error in backward can leak; the cells left run in a fresh process."""
    leaks, calls = iter([0.0, 5000.0]), []  # the first cell cleans up; the second leaves 5 GB behind
    monkeypatch.setattr(cell, "leaked_mib", lambda device, start: next(leaks))

    def execv(path, argv):
        calls.append(argv)
        raise Restarted

    monkeypatch.setattr(cell.os, "execv", execv)
    j = job(tmp_path, "plain")
    argv = ["--device", "cpu", "--job", j.argument()]
    with pytest.raises(Restarted):
        cell.main(argv)

    def written() -> list:
        return sorted((c["head_dim"], c["sequence_length"]) for p, c in j.records.items() if Path(p).exists())

    assert written() == [(8, 16), (8, 48)]  # in order (8, 16), (8, 48), (16, 16), (16, 48): two, then the restart
    assert calls[0][1:] == ["-m", "lmperf.kinds.attention.cell", *argv, cell.SKIP, "2"]
    for p in j.records:
        Path(p).unlink(missing_ok=True)
    monkeypatch.setattr(cell, "leaked_mib", lambda device, start: 0.0)
    assert cell.main(calls[0][3:]) == 0 and written() == [(16, 16), (16, 48)]


@pytest.mark.parametrize("implementation, allow_tf32", [("flash", False), ("compiled_flash", True)])
def test_flash_on_cuda_warms_the_cells_left_before_the_first(
    tmp_path, monkeypatch, request, implementation, allow_tf32
):
    """On CUDA (faked: no kernel runs) the cell compiles our kernels for exactly the cells it then runs."""
    from lmperf.kernels.flash import warm
    from lmperf.kernels.flash.products import dot_precision_for

    events = []
    monkeypatch.setattr(warm, "warm", lambda specs, workers=None: events.append(("warm", specs)) or FAKE_WARM)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(device, "check_device", lambda slug: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: 0)
    before, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, allow_tf32
    request.addfinalizer(
        lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", before)
    )  # a property: not monkeypatch's

    def measure(fn, args, d, n, dev, first_cell, extra):
        events.append(("measure", (args.batch_size, n, d)))
        return {"forward_ms_mean": 1.0, **extra}

    monkeypatch.setattr(cell, "measure", measure)
    j = job(tmp_path, implementation)
    assert cell.main(["--device", "cpu", "--job", j.argument(), cell.SKIP, "1"]) == 0
    (kind, specs), *measured = events
    assert kind == "warm" and [m for _, m in measured] == [(2, 48, 8), (2, 16, 16), (2, 48, 16)]
    assert [(s["batch"], s["n_queries"], s["head_dim"]) for s in specs] == [m for _, m in measured]
    assert all(s["n_keys"] == s["n_queries"] and not s["causal"] and s["tf32"] == allow_tf32 for s in specs)
    m = load_record(j.output.format(head_dim=16, seq_len=16))["metrics"]
    assert m["warm_compile_shapes"] == 3 and m["dot_precision"] == dot_precision_for("fp32", allow_tf32)


def test_one_job_per_implementation_and_the_schemas_names(repo_root):
    jobs = cpu_jobs("attention", repo_root, head_dims=[8, 16], sequence_lengths=[16, 32])
    assert [j.settings["implementation"] for j in jobs] == ["plain", "compiled", "sdpa", "flash", "sdpa_cudnn"]
    assert sorted(jobs[2].records) == [
        str(repo_root / f"results/cpu/attention/sdpa_fp32_d{d}_n{n}.json") for d in (16, 8) for n in (16, 32)
    ]
    schema = yaml.safe_load((repo_root / "workflow/schemas/config.schema.yaml").read_text())
    allowed = schema["definitions"]["attention"]["properties"]["implementations"]["items"]["enum"]
    assert set(allowed) <= set(cell.implementation_names())  # every name a config may give is one the cell runs
