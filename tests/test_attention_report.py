"""The attention report: real tiny records end to end, and GPU-like records for the OOM accounting."""

from __future__ import annotations

import re

import pytest

from lmperf import attention_memory as memory
from lmperf import device
from lmperf.cells import attention as cell
from lmperf.record import make_record, write_record
from lmperf.report import attention as report

MIB = 2**20
H100_TOTAL_MIB = 81_089.0  # what get_device_properties says of an H100 80GB HBM3, about 79.2 GiB


@pytest.fixture(scope="module")
def tiny_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("attention")
    for impl in ("plain", "sdpa"):
        cell.main(
            [
                "--output",
                str(out / f"{impl}_fp32_d{{head_dim}}_n{{seq_len}}.json"),
                "--device",
                "cpu",
                "--implementation",
                impl,
                "--head-dims",
                "8",
                "--sequence-lengths",
                "16",
                "32",
                "64",
                "--batch-size",
                "2",
                "--warmup-passes",
                "1",
                "--measured-passes",
                "2",
            ]
        )
    return sorted(out.glob("*.json"))


def run_report(tmp_path, records, device_slug="cpu"):
    assert (
        report.main(
            [
                "--device",
                device_slug,
                "--csv",
                str(tmp_path / "attention.csv"),
                "--sections-dir",
                str(tmp_path / "sections"),
                "--figures-dir",
                str(tmp_path / "figures"),
                "--records",
                *map(str, records),
            ]
        )
        == 0
    )
    return (
        (tmp_path / "sections/pytorch_attention.md").read_text(),
        (tmp_path / "sections/torch_compile_a.md").read_text(),
    )


def test_report_on_tiny_records(tmp_path, tiny_records):
    text, compile_text = run_report(tmp_path, tiny_records)
    df = report.frame(report.load(tiny_records))
    # the table shows the records' numbers
    row = df[(df.implementation == "plain") & (df.head_dim == 8) & (df.sequence_length == 64)].iloc[0]
    assert f"{row.forward_ms_mean:.3f} ± {row.forward_ms_std:.3f}" in text
    # the exponents are fitted from the records, not typed in
    ex = report.exponents(df)
    plain = ex[ex.implementation == "plain"]
    assert f"N^{plain.exponent.median():.2f}" in text
    sdpa = ex[ex.implementation == "sdpa"].exponent
    assert sdpa.min() == pytest.approx(1.0, abs=0.01)  # O and the log-sum-exp: linear in N
    assert 1.7 < plain.exponent.min() <= 2.0  # three N×N matrices plus O(N) terms
    assert "never ran out of memory" in text and "No plain cell ran out of memory" in text
    assert "_No plain/compiled pairs on this device._" in compile_text
    assert text.rstrip().endswith("(`cpu`)._") and "6 records in `results/cpu/attention/`" in text
    assert (tmp_path / "attention.csv").read_text().count("\n") == len(tiny_records) + 1
    for name in ("time", "memory", "compile"):
        assert (tmp_path / f"figures/attention_{name}.png").stat().st_size > 1000


def _gpu_like_record(path, impl, d, n, status, **metrics):
    shape = memory.Shape(8, n, d, 4)
    base = {
        "n2_matrix_mib": shape.matrix_bytes / MIB,
        "device_total_memory_mib": H100_TOTAL_MIB,
        **cell.predictions(impl, shape),
    }
    settings = {
        "batch_size": 8,
        "precision": "fp32",
        "warmup_passes": 5,
        "measured_passes": 100,
        "min_measured_passes": 2,
        "max_phase_seconds": 1.5,
    }
    prov = device.provenance("cpu", settings) | {"device_name": "NVIDIA H100 80GB HBM3", "device_slug": "h100"}
    record = make_record(
        "attention",
        {"implementation": impl, "head_dim": d, "sequence_length": n, "batch_size": 8, "precision": "fp32"},
        status,
        base | metrics,
        prov,
        None if status == "ok" else "out of memory",
    )
    write_record(path / f"{impl}_fp32_d{d}_n{n}.json", record)
    return path / f"{impl}_fp32_d{d}_n{n}.json"


def _ok(impl, d, n, fwd_ms, bwd_ms, n2_kept):
    shape = memory.Shape(8, n, d, 4)
    kept = (n2_kept * shape.matrix_bytes + shape.vector_bytes) / MIB
    return dict(
        forward_ms_mean=fwd_ms,
        forward_ms_std=0.01,
        forward_n=100,
        backward_ms_mean=bwd_ms,
        backward_ms_std=0.02,
        backward_n=100,
        retained_by_forward_mib=kept,
        memory_before_backward_mib=kept + 4 * shape.vector_bytes / MIB,
        first_forward_ms=900.0,
    )


def test_oom_boundary_accounting_and_compile_comparison(tmp_path):
    paths = []
    for impl, n2, speed in (("plain", 3, 1.0), ("compiled", 2, 1.5)):
        for n in (4096, 8192, 16384):
            paths.append(
                _gpu_like_record(
                    tmp_path,
                    impl,
                    64,
                    n,
                    "ok",
                    **_ok(impl, 64, n, n * n / 2**24 / speed, 3 * n * n / 2**24 / speed, n2),
                )
            )
    oom_plain = dict(
        oom_phase="forward warm-up",
        oom_requested_mib=32768.0,
        oom_allocated_by_pytorch_mib=65792.5,
        oom_free_mib=14848.0,
        oom_total_capacity_mib=H100_TOTAL_MIB,
    )
    for n in (32768, 65536):
        paths.append(_gpu_like_record(tmp_path, "plain", 64, n, "oom", **oom_plain))
    paths.append(
        _gpu_like_record(
            tmp_path,
            "compiled",
            64,
            32768,
            "oom",
            oom_phase="backward warm-up",
            **{k: v for k, v in _ok("compiled", 64, 32768, 70.0, None, 2).items() if not k.startswith("backward")},
        )
    )
    text, compile_text = run_report(tmp_path / "out", paths, "h100")
    assert (
        "`plain` runs out of memory first at N = 32768 for d = 64 (in the forward warm-up); the largest length "
        "that runs in full is N = 16384 for d = 64." in text
    )
    assert "`compiled` runs out of memory first at N = 32768 for d = 64 (in the backward warm-up)" in text
    # the accounting for plain at N = 32768: 32 GiB matrices, E is the first allocation that cannot fit
    assert "one N×N score matrix (B·N²·4 bytes) takes 32 GiB" in text
    assert "The card holds 79.2 GiB in total" in text
    assert (
        "the first allocation that cannot fit is E = exp(S - max) (32 GiB requested with 64.3 GiB already live: 96.3 GiB > 79.2 GiB)"
        in text
    )
    assert "the failing allocation asked for 32 GiB, with 64.3 GiB allocated by PyTorch" in text
    assert "| **no**" in text  # the steps table marks what no longer fits
    # the growth: three matrices, exponent 2 (fitted over 4096..16384)
    assert re.search(r"keeps 3\.0\d N×N matrices for backward .* N\^2\.00", text)
    # compiled against plain: 1.5× both ways, the boundary moves from forward to backward
    assert (
        "Compiled forward: 1.50×–1.50× plain's speed (median 1.50×) over 3 cells; faster in 3 of them." in compile_text
    )
    assert "compiled keeps 2.00 N×N matrices for backward where plain keeps 3.00" in compile_text
    assert (
        "differently: at d = 64 plain first fails at N = 32768 (forward warm-up), compiled at N = 32768 (backward warm-up)"
        in compile_text
    )
    assert "| OOM (forward warm-up) |" in text


@pytest.mark.skipif(device.device_slug() != "cpu", reason="cuDNN attention is unsupported only without CUDA")
def test_an_implementation_unsupported_here_is_said_so_not_tabulated(tmp_path, tiny_records):
    out = tmp_path / "records"
    cell.main(
        [
            "--output",
            str(out / "sdpa_cudnn_fp32_d{head_dim}_n{seq_len}.json"),
            "--device",
            "cpu",
            "--implementation",
            "sdpa_cudnn",
            "--head-dims",
            "8",
            "--sequence-lengths",
            "16",
            "32",
        ]
    )
    text, _ = run_report(tmp_path, [*tiny_records, *sorted(out.glob("*.json"))])
    section = text.split("### `sdpa_cudnn`", 1)[1].split("###", 1)[0]
    assert "Not measured: every cell is unsupported here" in section and "needs CUDA tensors" in section
    assert "|" not in section  # no table of dashes
    assert "`sdpa_cudnn` did not run on this device (unsupported)." in text
    assert "`sdpa_cudnn` never ran out of memory" not in text
