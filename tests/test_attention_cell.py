"""The attention cell CLI: tiny sweeps end to end, the OOM path, early stopping, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from lmperf import attention
from lmperf.core import device, oom, timing
from lmperf.core.record import load_record
from lmperf.kinds.attention import cell
from lmperf.kinds.attention import memory_model as memory

OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 32.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
    "14.50 GiB is free. Including non-PyTorch memory, this process has 64.68 GiB memory in use. Of the "
    "allocated memory 64.25 GiB is allocated by PyTorch, and 1.50 MiB is reserved by PyTorch but unallocated."
)


def run(tmp_path: Path, implementation: str, head_dims=(8,), lengths=(16, 32), *extra: str) -> dict:
    template = str(tmp_path / (implementation + "_d{head_dim}_n{seq_len}.json"))
    argv = [
        "--output",
        template,
        "--device",
        "cpu",
        "--implementation",
        implementation,
        "--head-dims",
        *map(str, head_dims),
        "--sequence-lengths",
        *map(str, lengths),
        "--batch-size",
        "2",
        "--warmup-passes",
        "2",
        "--measured-passes",
        "3",
        *extra,
    ]
    assert cell.main(argv) == 0
    return {(d, n): load_record(template.format(head_dim=d, seq_len=n)) for d in head_dims for n in lengths}


def test_plain_and_sdpa_sweeps_record_time_and_saved_memory(tmp_path):
    for impl in ("plain", "sdpa"):
        records = run(tmp_path, impl, (8, 16), (16, 48))
        for (d, n), r in records.items():
            m = r["metrics"]
            assert r["status"] == "ok" and r["kind"] == "attention"
            assert r["cell"] == {
                "implementation": impl,
                "head_dim": d,
                "sequence_length": n,
                "batch_size": 2,
                "precision": "fp32",
            }
            for phase in ("forward", "backward"):
                assert m[f"{phase}_n"] == 3 and len(m[f"{phase}_ms_samples"]) == 3 and m[f"{phase}_ms_mean"] > 0
            # CPU: no allocator statistics, said per field; the saved tensors are still measured
            assert all(m[key] is None for key in cell.CUDA_MEMORY_FIELDS)
            assert "CUDA" in m["memory_unsupported_reason"]
            shape = memory.Shape(2, n, d, 4)
            expected = memory.plain_accounting(shape) if impl == "plain" else memory.fused_accounting(shape)
            assert m["retained_tensors_mib"] * 2**20 == expected.retained_bytes
            assert m["predicted_retained_mib"] == pytest.approx(expected.retained_bytes / 2**20)
            assert m["check_output_max_abs_error"] < 1e-5 and m["check_grad_max_abs_error"] < 1e-4
            assert m["forward_flops"] == 4 * 2 * n * n * d
        if impl == "sdpa":  # a fused kernel, never the unfused math fallback
            assert all(
                "ScaledDotProduct" in r["metrics"]["output_node"] and "Math" not in r["metrics"]["output_node"]
                for r in records.values()
            )
            assert records[(8, 16)]["provenance"]["settings"]["sdpa_backends"] == list(cell.SDPA_FUSED_BACKENDS)


def test_compiled_sweep_compiles_once_and_matches_float64(tmp_path):
    records = run(tmp_path, "compiled", (8,), (16, 24, 40))
    firsts = [records[(8, n)]["metrics"]["first_forward_ms"] for n in (16, 24, 40)]
    for r in records.values():
        m = r["metrics"]
        assert r["status"] == "ok" and m["output_node"] == "CompiledFunctionBackward"
        assert m["check_output_max_abs_error"] < 1e-5 and m["check_grad_max_abs_error"] < 1e-4
        assert m["predicted_retained_mib"] is None  # the partitioner decides: measured only
        assert m["retained_tensors_mib"] < m["plain_predicted_retained_mib"]
    # dynamic shapes: the first cell pays for compilation, the later ones reuse it
    assert max(firsts[1:]) < firsts[0] / 5


def _fake_oom_at(min_len):
    def oomy(q, k, v, is_causal=False):
        if q.shape[-2] >= min_len:
            raise torch.OutOfMemoryError(OOM_MESSAGE)
        return attention.plain_attention(q, k, v, is_causal)

    return oomy


class _OomInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        return attention.plain_attention(q, k, v)

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError(OOM_MESSAGE)


def test_out_of_memory_in_forward_is_a_record_and_the_sweep_goes_on(tmp_path, monkeypatch):
    monkeypatch.setitem(attention.IMPLEMENTATIONS, "oomy", _fake_oom_at(32))
    records = run(tmp_path, "oomy", (8,), (16, 32, 64))
    assert records[(8, 16)]["status"] == "ok"
    for n in (32, 64):
        r = records[(8, n)]
        m = r["metrics"]
        assert r["status"] == "oom" and "forward warm-up" in r["reason"] and "Tried to allocate" in r["reason"]
        assert m["oom_phase"] == "forward warm-up"
        assert m["oom_requested_mib"] == 32 * 1024 and m["oom_total_capacity_mib"] == pytest.approx(79.19 * 1024)
        assert m["oom_free_mib"] == pytest.approx(14.5 * 1024)
        assert m["oom_allocated_by_pytorch_mib"] == pytest.approx(64.25 * 1024)
        assert "forward_ms_mean" not in m
        # the prediction is there to explain it
        assert m["plain_predicted_retained_mib"] == pytest.approx(
            memory.plain_accounting(memory.Shape(2, n, 8, 4)).retained_bytes / 2**20
        )


def test_out_of_memory_in_backward_keeps_the_forward(tmp_path, monkeypatch):
    monkeypatch.setitem(attention.IMPLEMENTATIONS, "oomy_backward", _OomInBackward.apply)
    r = run(tmp_path, "oomy_backward", (8,), (16,))[(8, 16)]
    m = r["metrics"]
    assert r["status"] == "oom" and m["oom_phase"] == "backward warm-up"
    assert m["forward_n"] == 3 and m["forward_ms_mean"] > 0
    assert m["retained_tensors_mib"] > 0 and "backward_ms_mean" not in m


class _Restarted(Exception):
    pass


def test_memory_left_after_a_cell_restarts_the_process_for_the_rest(tmp_path, monkeypatch):
    """pytorch#82218: an OOM in backward can leak; the remaining cells then run in a fresh process."""
    leaks = iter([0.0, 5000.0])  # the first cell cleans up; the second leaves 5 GB behind
    monkeypatch.setattr(cell, "leaked_mib", lambda device, start: next(leaks))
    calls = []

    def fake_execv(path, argv):
        calls.append(argv)
        raise _Restarted

    monkeypatch.setattr(cell.os, "execv", fake_execv)
    template = str(tmp_path / "plain_d{head_dim}_n{seq_len}.json")
    argv = [
        "--output",
        template,
        "--device",
        "cpu",
        "--implementation",
        "plain",
        "--head-dims",
        "8",
        "16",
        "--sequence-lengths",
        "32",
        "16",
        "--batch-size",
        "2",
        "--warmup-passes",
        "1",
        "--measured-passes",
        "2",
    ]
    with pytest.raises(_Restarted):
        cell.main(argv)
    # cells in order (8, 16), (8, 32), (16, 16), (16, 32): two done, then the restart
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["plain_d8_n16.json", "plain_d8_n32.json"]
    (new_argv,) = calls
    assert new_argv[1:3] == ["-m", "lmperf.kinds.attention.cell"]
    assert new_argv[3:-2] == argv and new_argv[-2:] == ["--skip-cells", "2"]
    # what the fresh process does with that command line: only the cells after the first two
    monkeypatch.setattr(cell, "leaked_mib", lambda device, start: 0.0)
    for path in tmp_path.glob("*.json"):
        path.unlink()
    assert cell.main(new_argv[3:]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["plain_d16_n16.json", "plain_d16_n32.json"]
    # a second restart replaces the count rather than adding another
    monkeypatch.setattr(cell, "leaked_mib", lambda device, start: 5000.0)
    with pytest.raises(_Restarted):
        cell.main(new_argv[3:])
    assert calls[-1][3:].count("--skip-cells") == 1 and calls[-1][-2:] == ["--skip-cells", "3"]
    assert "skip_cells" not in load_record(template.format(head_dim=16, seq_len=16))["provenance"]["settings"]


def test_unexpected_error_propagates_without_record(tmp_path, monkeypatch):
    def broken(q, k, v, is_causal=False):
        raise ValueError("shape mismatch")

    monkeypatch.setitem(attention.IMPLEMENTATIONS, "broken", broken)
    with pytest.raises(ValueError, match="shape mismatch"):
        run(tmp_path, "broken", (8,), (16,))
    assert not list(tmp_path.glob("*.json"))


def test_repeat_stops_before_the_time_budget(monkeypatch):
    clock = {"t": 0.0}

    class FakeTimeit:
        @staticmethod
        def default_timer():
            return clock["t"]

    def one_pass():
        clock["t"] += 0.4

    monkeypatch.setattr(timing, "timeit", FakeTimeit)
    # after 2 passes 0.8 s: a third would end at 1.2 s > 1.0 s
    assert timing.run_passes(one_pass, 100, min_passes=2, max_seconds=1.0) == 2
    assert timing.run_passes(one_pass, 100, min_passes=3, max_seconds=1.0) == 3
    assert timing.run_passes(one_pass, 100, min_passes=1, max_seconds=0.1) == 1
    assert timing.run_passes(one_pass, 7, min_passes=2, max_seconds=float("inf")) == 7


def test_parse_oom_message():
    parsed = oom.parse_oom_message(OOM_MESSAGE)
    assert parsed == {
        "oom_requested_mib": 32768.0,
        "oom_total_capacity_mib": pytest.approx(81090.56),
        "oom_free_mib": 14848.0,
        "oom_allocated_by_pytorch_mib": 65792.0,
    }
    assert oom.parse_oom_message("RuntimeError: out of memory") == {}


def test_implementation_names_and_the_config_schema(repo_root):
    names = cell.implementation_names()
    assert {"plain", "sdpa", "flash", "compiled", "compiled_sdpa"} <= set(names)
    assert cell.base_implementation("compiled") == ("plain", True)
    assert cell.base_implementation("compiled_flash") == ("flash", True)
    assert cell.base_implementation("sdpa") == ("sdpa", False)
    schema = yaml.safe_load((repo_root / "workflow/schemas/config.schema.yaml").read_text())
    assert sorted(schema["definitions"]["attention"]["properties"]["implementations"]["items"]["enum"]) == sorted(names)


def test_cli_refusals(tmp_path):
    with pytest.raises(SystemExit):
        cell.parse_args(
            [
                "--output",
                str(tmp_path / "x.json"),
                "--device",
                "cpu",
                "--implementation",
                "plain",
                "--head-dims",
                "8",
                "--sequence-lengths",
                "16",
            ]
        )  # no {head_dim}/{seq_len}
    with pytest.raises(SystemExit):
        cell.parse_args(
            [
                "--output",
                "{head_dim}{seq_len}",
                "--device",
                "cpu",
                "--implementation",
                "nope",
                "--head-dims",
                "8",
                "--sequence-lengths",
                "16",
            ]
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without that GPU")
def test_refuses_to_write_under_another_devices_slug(tmp_path):
    with pytest.raises(device.DeviceMismatch, match="results/h100/"):
        cell.main(
            [
                "--output",
                str(tmp_path / "{head_dim}_{seq_len}.json"),
                "--device",
                "h100",
                "--implementation",
                "plain",
                "--head-dims",
                "8",
                "--sequence-lengths",
                "16",
            ]
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_memory_before_backward_matches_the_accounting(tmp_path):
    slug = device.device_slug()
    template = str(tmp_path / "plain_d{head_dim}_n{seq_len}.json")
    cell.main(
        [
            "--output",
            template,
            "--device",
            slug,
            "--implementation",
            "plain",
            "--head-dims",
            "64",
            "--sequence-lengths",
            "1024",
            "--measured-passes",
            "5",
        ]
    )
    m = load_record(template.format(head_dim=64, seq_len=1024))["metrics"]
    shape = memory.Shape(8, 1024, 64, 4)
    assert m["retained_by_forward_mib"] * 2**20 == pytest.approx(
        memory.plain_accounting(shape, rounded=True).retained_bytes, rel=0.01
    )
    assert m["forward_peak_extra_mib"] * 2**20 == pytest.approx(
        memory.plain_accounting(shape, rounded=True).forward_peak_extra_bytes, rel=0.05
    )


def test_warm_up_skips_what_would_overrun(monkeypatch):
    clock = {"t": 0.0}
    passes = []

    class FakeTimeit:
        @staticmethod
        def default_timer():
            return clock["t"]

    def one_pass(seconds):
        def run():
            passes.append(seconds)
            clock["t"] += seconds

        return run

    monkeypatch.setattr(timing, "timeit", FakeTimeit)
    # a 10 s first pass (compilation) does not count; passes of 0.2 s fit twice in 0.5 s
    first = {"done": False}

    def compile_then_fast():
        one_pass(0.2 if first["done"] else 10.0)()
        first["done"] = True

    assert timing.warm_up(compile_then_fast, 5, max_seconds=0.5, min_passes=2) == (10_000.0, 3)
    # a 3 s pass: nothing more than the first, unless a minimum asks for it
    assert timing.warm_up(one_pass(3.0), 5, max_seconds=0.5) == (3000.0, 1)
    assert timing.warm_up(one_pass(3.0), 5, max_seconds=0.5, min_passes=2) == (3000.0, 2)
    # a first pass run elsewhere: no extra pass when it says the next would not fit
    n_before = len(passes)
    assert timing.warm_up(one_pass(1.0), 5, max_seconds=0.5, first_s=1.0) == (1000.0, 1)
    assert len(passes) == n_before
    assert timing.warm_up(one_pass(0.1), 3, max_seconds=0.5, first_s=0.1) == (100.0, 3)


def test_sdpa_cudnn_is_registered_and_recorded_unsupported_without_cuda(tmp_path):
    assert "sdpa_cudnn" in attention.IMPLEMENTATIONS
    assert {"sdpa_cudnn", "compiled_sdpa_cudnn"} <= set(cell.implementation_names())
    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without CUDA")
    q = torch.randn(1, 1, 8, 4)
    with pytest.raises(attention.Unavailable, match="needs CUDA tensors"):
        attention.get("sdpa_cudnn")(q, q, q)
    template = str(tmp_path / "sdpa_cudnn_d{head_dim}_n{seq_len}.json")
    assert (
        cell.main(
            [
                "--output",
                template,
                "--device",
                "cpu",
                "--implementation",
                "sdpa_cudnn",
                "--head-dims",
                "8",
                "--sequence-lengths",
                "16",
                "32",
                "--measured-passes",
                "2",
            ]
        )
        == 0
    )
    for n in (16, 32):  # every cell of the sweep: a record that says why, not a failed job
        r = load_record(template.format(head_dim=8, seq_len=n))
        assert r["status"] == "unsupported" and "cuDNN attention needs CUDA" in r["reason"]


# --- flash: our Triton kernels compiled side by side before the first cell (lmperf.kernels.flash.warm) ---------


def _fake_warm(monkeypatch, events: list) -> None:
    from lmperf.kernels.flash import warm

    def fake(specs, workers=None):
        events.append(("warm", [dict(s) for s in specs]))
        return {"workers": 2, "shapes": 3, "combinations": 2, "wall_s": 0.25, "tasks": [{"kernel": "fwd"}] * 9}

    monkeypatch.setattr(warm, "warm", fake)


@pytest.fixture
def tf32_request():
    """Set torch.backends.cuda.matmul.allow_tf32 for one test (monkeypatch cannot undo it: a property)."""
    before = torch.backends.cuda.matmul.allow_tf32

    def request(value: bool) -> None:
        torch.backends.cuda.matmul.allow_tf32 = value

    yield request
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("allow_tf32", [False, True])
@pytest.mark.parametrize("implementation", ["flash", "compiled_flash"])
def test_flash_on_cuda_warms_every_remaining_cell_before_the_first(
    tmp_path, monkeypatch, tf32_request, implementation, allow_tf32
):
    """On CUDA (faked: no kernel runs, `measure` is replaced) the cell warms exactly the cells it then runs."""
    events: list = []
    _fake_warm(monkeypatch, events)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(device, "check_device", lambda slug: torch.device("cuda"))
    monkeypatch.setattr(device, "git_state", lambda: {"git_commit": "0" * 40, "git_dirty": False})
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a, **k: 0)
    tf32_request(allow_tf32)

    def fake_measure(fn, args, head_dim, seq_len, dev, first_cell=False, extra=None):
        events.append(
            ("measure", (args.batch_size, seq_len, head_dim, args.precision, torch.backends.cuda.matmul.allow_tf32))
        )
        return {"forward_ms_mean": 1.0, **(extra or {})}

    monkeypatch.setattr(cell, "measure", fake_measure)
    template = str(tmp_path / "flash_d{head_dim}_n{seq_len}.json")
    argv = ["--output", template, "--device", "h100", "--implementation", implementation, "--precision", "fp32"]
    argv += ["--head-dims", "16", "80", "--sequence-lengths", "4096", "256", "--batch-size", "8", "--skip-cells", "1"]
    assert cell.main(argv) == 0
    (kind, specs), *measured = events
    assert kind == "warm" and all(k == "measure" for k, _ in measured)  # warmed once, before any cell
    ran = [m for _, m in measured]
    assert ran == [
        (8, 4096, 16, "fp32", allow_tf32),
        (8, 256, 80, "fp32", allow_tf32),
        (8, 4096, 80, "fp32", allow_tf32),
    ]
    # exactly what then ran: the cells' batch, lengths and head dims, non-causal (the cell's attention), fp32,
    # TF32 products where the process allows TF32
    warmed = [(s["batch"], s["n_queries"], s["head_dim"], s["dtype"], s["tf32"]) for s in specs]
    assert warmed == [r[:3] + ("fp32", allow_tf32) for r in ran]
    assert all(s["n_keys"] == s["n_queries"] and s["causal"] is False for s in specs)
    r = load_record(template.format(head_dim=80, seq_len=256))
    assert r["metrics"]["warm_compile_s"] >= 0 and r["metrics"]["warm_compile_combinations"] == 2
    assert r["metrics"]["warm_compile_shapes"] == 3 and "warm_compile_error" not in r["metrics"]


def test_flash_warms_nothing_without_cuda_or_for_other_implementations(tmp_path, monkeypatch):
    events: list = []
    _fake_warm(monkeypatch, events)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    argv = ["--output", "x_{head_dim}_{seq_len}.json", "--device", "cpu", "--implementation", "flash"]
    args = cell.parse_args(argv + ["--head-dims", "16", "--sequence-lengths", "256"])
    assert cell.warm_flash(args, [(16, 256)], torch.device("cpu")) == {}
    args.implementation = "plain"
    assert cell.warm_flash(args, [(16, 256)], torch.device("cuda")) == {}
    args.implementation = "compiled"
    assert cell.warm_flash(args, [(16, 256)], torch.device("cuda")) == {}
    assert events == []
    # a CPU sweep end to end: records without the warm-up's metrics
    records = run(tmp_path, "sdpa", (8,), (16,))
    assert events == [] and "warm_compile_s" not in records[(8, 16)]["metrics"]
    # with the interpreter on CUDA (refused by the flash cells; here it compiles nothing)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    args.implementation = "flash"
    assert cell.warm_flash(args, [(16, 256)], torch.device("cuda")) == {} and events == []
