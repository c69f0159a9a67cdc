"""The attention report: real tiny records end to end, and GPU-like records for the OOM accounting."""

from __future__ import annotations

import re

import pytest

from lmperf.core import device
from lmperf.core.record import make_record, write_record
from lmperf.kinds.attention import cell, report
from lmperf.kinds.attention import memory_model as memory

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
    last = text.rstrip().splitlines()[-1]  # the source line (it may go on to name commits)
    assert last.startswith("_Source: 6 records in `results/cpu/attention/`") and "(`cpu`)" in last
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


def _kept_then_oom(path):
    """compiled, d = 64, N = 32768: the forward ran and kept its memory, the backward warm-up ran out."""
    forward_only = {k: v for k, v in _ok("compiled", 64, 32768, 70.0, None, 2).items() if not k.startswith("backward")}
    return _gpu_like_record(path, "compiled", 64, 32768, "oom", oom_phase="backward warm-up", **forward_only)


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
    paths.append(_kept_then_oom(tmp_path))
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
        "Compiled forward: 1.50×–1.50× plain's speed (median 1.50×) over 3 cells; faster in 3, slower in 0, "
        "within 3% of plain (`SAME`, about as fast) in 0." in compile_text
    )
    assert "compiled keeps 2.00 N×N matrices for backward where plain keeps 3.00" in compile_text
    # the same length, only the phase differs: said so, never "they run out of memory differently"
    assert (
        "They run out of memory at the same length, only in a different phase: at d = 64 both first fail at "
        "N = 32768 (the same length), plain in the forward warm-up, compiled in the backward warm-up." in compile_text
    )
    assert "differently" not in compile_text
    assert "| OOM (forward warm-up) |" in text


def test_exponent_fit_uses_lengths_that_ran_in_full_and_names_those_left_out(tmp_path):
    from lmperf.report.common import load

    paths = [
        _gpu_like_record(tmp_path, "compiled", 64, n, "ok", **_ok("compiled", 64, n, 1.0, 2.0, 2))
        for n in (4096, 8192, 16384)
    ]
    full = load(paths)
    # the forward at N = 32768 kept its memory (measured), then backward ran out of memory
    kept_then_oom = _kept_then_oom(tmp_path)
    df = report.frame(full + load([kept_then_oom]))
    ex = report.exponents(df)
    assert (ex.n_from.iloc[0], ex.n_to.iloc[0]) == (4096, 16384)  # the oom cell is not fitted
    text = report.growth_section(df)
    assert "3 largest lengths that ran in full (status `ok`: every phase ran without running out of memory)" in text
    assert (
        "left out although the forward's kept memory was measured before the cell failed: `compiled` at "
        "N = 32768 for d = 64 (out of memory in the backward warm-up)" in text
    )
    assert "largest lengths that ran (" not in text
    # every cell ran in full: nothing is said to be left out
    text = report.growth_section(report.frame(full))
    assert "ran in full" in text and "left out" not in text


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
    assert "`sdpa_cudnn` did not run in this sweep's fp32 on this device (unsupported: " in text
    assert "`sdpa_cudnn` never ran out of memory" not in text


def test_compile_oom_sentence_names_different_lengths_as_different():
    plain = {64: {"smallest_oom": 32768, "oom_phase": "forward warm-up", "largest_ok": 16384}}
    compiled = {64: {"smallest_oom": 65536, "oom_phase": "backward warm-up", "largest_ok": 32768}}
    text = report.oom_difference_sentence(plain, compiled, [64])
    assert text == (
        "They run out of memory differently: at d = 64 plain first fails at N = 32768 (forward warm-up), "
        "compiled first fails at N = 65536 (backward warm-up)."
    )
    never = {64: {"smallest_oom": None, "oom_phase": None, "largest_ok": 65536}}
    assert "compiled never runs out of memory up to N = 65536" in report.oom_difference_sentence(plain, never, [64])


def _flash_record(code_version=True, allow_tf32=False, **settings):
    prov = {"device_slug": "h100", "matmul_allow_tf32": allow_tf32, "settings": {"implementation": "flash", **settings}}
    if code_version:
        prov["code_version"] = "2a81ca3ad8b0a95c"
    return {"cell": {"implementation": "flash", "precision": "fp32"}, "status": "ok", "provenance": prov}


def test_flash_products_follow_the_code_that_wrote_the_record():
    # the kernels of issue 12 (records with a code version): IEEE unless allow_tf32 was on
    assert report.record_products(_flash_record())[0] == "IEEE"
    assert report.record_products(_flash_record(allow_tf32=True))[0] == "TF32"
    # older kernels (no code version): tl.dot's default, TF32
    assert report.record_products(_flash_record(code_version=False))[0] == "TF32"
    # the record's own setting wins
    assert report.record_products(_flash_record(code_version=False, dot_precision="ieee"))[0] == "IEEE"
    assert report.record_products(_flash_record(dot_precision="tf32x3"))[0] == "3xTF32"
    heading, text = report.products_paragraph([_flash_record()], "flash")
    assert heading == "fp32 inputs, IEEE float32 products"  # as flash_benchmarking says "fp32 (IEEE float32 products)"
    assert "so these rows are fp32 arithmetic" in text and "TF32" not in text.replace("allow_tf32", "")
    heading, text = report.products_paragraph([_flash_record(code_version=False)], "flash")
    assert heading == "fp32 inputs, TF32 products" and "not fp32 arithmetic" in text
    assert report.products_paragraph([_flash_record()], "plain") is None
    heading, text = report.products_paragraph([_flash_record(dot_precision="tf32x3")], "flash")
    assert heading == "fp32 inputs, 3xTF32 products" and "fp32-accurate, not IEEE" in text
    heading, text = report.products_paragraph([_flash_record(), _flash_record(dot_precision="tf32x3")], "flash")
    assert heading == "fp32 inputs, 3xTF32 or IEEE products by record" and "3xTF32 in 1, IEEE in 1 records" in text


def test_flash_rows_of_ieee_records_are_not_called_tf32(tmp_path):
    paths = [_gpu_like_record(tmp_path, "flash", 16, n, "ok", **_ok("flash", 16, n, 1.0, 2.0, 0)) for n in (1024, 2048)]
    text, _ = run_report(tmp_path / "out", paths, "h100")
    assert "### `flash` (fp32 inputs, IEEE float32 products)" in text
    assert "TF32 products" not in text and "not fp32 arithmetic" not in text


def test_unmeasured_cells_are_not_claimed_as_never_out_of_memory(tmp_path):
    # flash ran d = 16 up to N = 8192, d = 64 only up to 2048: the rest of d = 64 has no record
    paths = [
        _gpu_like_record(tmp_path, "flash", d, n, "ok", **_ok("flash", d, n, 1.0, 2.0, 0))
        for d, lengths in ((16, (1024, 2048, 4096, 8192)), (64, (1024, 2048)))
        for n in lengths
    ]
    text, _ = run_report(tmp_path / "out", paths, "h100")
    assert "every head dimension" not in text
    assert (
        "`flash` never ran out of memory where it was measured: it ran in full up to N = 8192 for d = 16; "
        "N = 2048 for d = 64. `flash` has no record yet at d = 64, N = 4096, 8192 (not measured, so not "
        "counted as out of memory)." in text
    )
    assert "No record yet (not measured): d = 64, N = 4096, 8192." in text
    # the growth fit names each head dim's own lengths, not one range no fit used
    assert "| 2048–8192 (d = 16); 1024–2048 (d = 64) |" in text
    # the same grid, complete: "every head dimension" is true and said
    df = report.frame(report.load(paths))
    full = df[df.head_dim == 16]
    assert "up to N = 8192 at every head dimension (d = 16)" in report.boundary_sentences(full, "h100")


def test_a_cell_with_no_record_is_not_measured_even_where_the_settings_planned_it(tmp_path):
    path = _gpu_like_record(tmp_path, "sdpa", 16, 1024, "ok", **_ok("sdpa", 16, 1024, 1.0, 2.0, 0))
    records = report.load([path])
    records[0]["provenance"]["settings"].update(head_dims=[16], sequence_lengths=[1024, 65536])
    text = report.boundary_sentences(report.frame(records), "h100", records)
    assert "every head dimension" not in text and "no record yet at d = 16, N = 65536" in text


def test_compiled_speed_counts_flip_at_same(tmp_path):
    """Compiled at 1.05x (faster), 1.02x (within SAME: about as fast) and 0.95x (slower) of plain."""
    from lmperf.report.devices import SAME

    speeds = {4096: 1 + SAME + 0.02, 8192: 1 + SAME - 0.01, 16384: 1 - SAME - 0.02}
    paths = []
    for impl in ("plain", "compiled"):
        for n, speed in speeds.items():
            s = speed if impl == "compiled" else 1.0
            metrics = _ok(impl, 64, n, n * n / 2**24 / s, 3 * n * n / 2**24 / s, 3 if impl == "plain" else 2)
            paths.append(_gpu_like_record(tmp_path, impl, 64, n, "ok", **metrics))
    _, compile_text = run_report(tmp_path / "out", paths, "h100")
    assert "over 3 cells; faster in 1, slower in 1 (d/N = 64/16384), within 3% of plain (`SAME`" in compile_text
    assert "about as fast) in 1." in compile_text
