"""nsys_profile's report: the command line on committed records, CPU words, short kernel names, and the
one golden text (the bf16 answer, issue 50's point)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from lmperf.kinds.nsys import cells, facts, report
from lmperf.kinds.nsys.names import SHORT_NAME_CHARS, compact_kernel_name, kernel_legend
from lmperf.kinds.nsys.text import words_for

from . import records as R

REPO = Path(__file__).resolve().parents[3]
H100 = REPO / "results" / "h100"
PICKED = [
    f"{m}_ctx{c}_{p}_{mode}"
    for m in ("small", "large")
    for c in (128, 512)
    for p in ("fp32", "bf16")
    for mode in ("inference", "training")
]
PICKED += ["xl_ctx1024_fp32_inference", "xl_ctx1024_fp32_training"]  # its training step ran out of memory


def committed() -> list[str]:
    paths = [H100 / "nsys" / f"{name}.json" for name in PICKED]
    if not all(p.is_file() for p in paths):
        pytest.skip("committed h100 nsys records not here")
    e2e = [H100 / "e2e" / f"{m}_ctx{c}_fp32_eager_w5.json" for m in ("small", "large", "xl") for c in (128, 512, 1024)]
    return [str(p) for p in paths + [p for p in e2e if p.is_file()]]


def test_main_on_committed_records_writes_every_output_and_references_every_figure(tmp_path):
    out = tmp_path / "h100"
    assert report.main(["--device", "h100", "--out", str(out), "--grid", "{}", "--records", *committed()]) == 0
    for path in report.outputs({}):
        assert (out / path).is_file(), path
    sections = {name: (out / "sections" / f"{name}.md").read_text() for name in report.SECTIONS}
    text = "\n".join(sections.values())
    for figure in (out / "figures").glob("*.png"):
        assert f"](../../results/h100/figures/{figure.name})" in text, figure.name
    for link in re.findall(r"\]\(\.\./\.\./results/h100/(tables/[\w.]+)\)", text):
        assert (out / link).is_file(), link
    assert "\n\n\n" not in text and "xl ctx 1024 fp32 training" in text
    header = (out / report.CELLS_CSV).read_text().splitlines()[0].split(",")
    assert {"inference_fwd_e2e_ms", "inference_fwd_e2e_ms_low", "inference_fwd_e2e_ms_high"} <= set(header)
    assert "inference_fwd_e2e" not in header and "train_class_share" not in header
    for heading in ("(a)", "(b)", "(c)", "(d)", "(e)"):
        assert f"### {heading}" in text


def test_tables_show_short_kernel_names_each_in_the_legend(tmp_path):
    report.main(["--device", "h100", "--out", str(tmp_path), "--records", *committed()])
    text = (tmp_path / "sections" / "nsys_profile.md").read_text()
    part = text.split("### (b)", 1)[1].split("### (c)", 1)[0]
    rows = [line for line in part.splitlines() if line.startswith("|")]
    names = {n for line in rows for n in re.findall(r"`([^`]+)`", line)}
    assert names and max(map(len, names)) <= SHORT_NAME_CHARS
    assert not [n for n in names if re.search(r"nvjet_|xmma_|cutlass_", n)]
    legend = part.split("names in full</summary>", 1)[1]
    assert "one short name for these" not in legend
    for name in names:
        if name.startswith(("xmma ", "nvjet ", "cutlass ")):
            assert f"- `{name}`: `" in legend, name


def test_no_records_writes_the_section_alone_in_one_line(tmp_path):
    assert report.main(["--device", "a100", "--out", str(tmp_path), "--grid", "{}", "--records"]) == 0
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()] == [
        "sections/nsys_profile.md"
    ]
    assert (tmp_path / "sections" / "nsys_profile.md").read_text().count("\n") == 1


def cpu_records() -> list[dict]:
    kw = {"device": "cpu", "profiler": "torch.profiler"}
    return [
        R.inference("tiny", 32, class_ms={"matmul": 2.0, "elementwise": 1.0}, **kw),
        R.training("tiny", 32, **kw),
        R.inference("tiny", 32, precision="bf16", **kw),
        R.training("tiny", 32, precision="bf16", **kw),
    ]


def test_cpu_records_are_told_in_cpu_words(tmp_path):
    recs = cpu_records()
    w = words_for(recs)
    assert (w.profiler, w.kernel, w.unit, w.range, w.launches) == (
        "torch.profiler",
        "operator",
        "CPU",
        "profiler range",
        "calls",
    )
    text = report.section(recs, [R.e2e("tiny", 32, forward_ms=3.0)], "cpu")
    assert "Nsight Systems" not in text and "CUDA" not in text
    answers = text.split("### (a)", 1)[1]
    assert "NVTX" not in answers and "GPU" not in answers and " kernel" not in answers
    assert text.count("not measured on a CPU") == 1 and "unsupported" not in text.lower()


def test_gpu_records_name_nsight_systems_and_nvtx():
    w = words_for([R.inference(), R.training()])
    assert (w.profiler, w.kernel, w.unit, w.range) == ("Nsight Systems", "kernel", "GPU", "NVTX range")
    # a GPU host without nsys: torch.profiler's ranges, GPU kernels
    w = words_for([R.inference(profiler="torch.profiler")])
    assert (w.profiler, w.kernel, w.range) == ("torch.profiler", "kernel", "profiler range")


def test_unstable_e2e_estimates_are_marked_and_the_mark_explained():
    recs = [R.inference(range_ms=10.0)]
    tight = report.section(recs, [R.e2e(forward_ms=10.0, interval=[9.9, 10.1])], "h100")
    wide = report.section(recs, [R.e2e(forward_ms=10.0, interval=[8.0, 12.5])], "h100")
    assert "10.00 [9.90, 10.10] |" in tight and "†" not in tight
    assert "10.00 [8.00, 12.50] † |" in wide and "† unstable: its interval is wider" in wide


def test_answer_a_says_yes_only_when_every_cell_matches_the_timer():
    w = words_for([R.inference()])
    yes = report.answer_a(facts.forward_check(cells.frame([R.inference()], [])), w)
    no = report.answer_a(facts.forward_check(cells.frame([R.inference(range_ms=12.0, timer_ms=10.0)], [])), w)
    assert yes.startswith("Yes: ") and no.startswith("Not everywhere: ")


def test_bf16_answer_reads_the_class_shares_not_a_bound_from_the_ratio():
    """The one golden text of the section: issue 50's bf16 point."""
    recs = [R.inference(), R.inference(precision="bf16")]
    f = facts.bf16_forward(cells.frame(recs, []), cells.kernels_frame(recs))
    assert report.answer_bf16(f, words_for(recs)) == (
        "Under bf16 autocast (1 cell beside fp32's) the forward's kernels take 0.40× fp32's time (faster in 1 "
        "of 1): the matmul kernels 0.10× their fp32 time, every other kernel 1.60×. So matmuls fall from 80.0% "
        "to 20.0% of the forward's kernel time: the bf16 forward's time is mostly in non-matmul kernels; the most "
        "frequent top kernel is `elementwise_kernel` (elementwise class, 1 cell)."
    )


def test_the_report_imports_without_torch():
    code = "import sys, lmperf.kinds.nsys.report; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# -- short kernel names -----------------------------------------------------------------------------


def test_short_kernel_names_have_a_legend():
    full = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_execute_kernel"
    assert compact_kernel_name(full) == "xmma gemm f32f32 tn 128x128x8"
    legend = kernel_legend([full, "elementwise_kernel[MulFunctor]"])
    assert f"`xmma gemm f32f32 tn 128x128x8`: `{full}`" in legend and "MulFunctor" not in legend


def test_hopper_and_split_k_names_are_short_and_distinct():
    a = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NTT"
    b = "nvjet_sm90_tst_256x128_64x4_1x4_h_bz_coopA_NTT"
    assert compact_kernel_name(a) == "nvjet 256x128x64 1x2 NTT" and compact_kernel_name(b) == "nvjet 256x128x64 1x4 NTT"
    plain = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_"
    assert compact_kernel_name(plain + "execute_kernel__5x_cublas") == "xmma gemm f32f32 tn 64x64x8"
    assert compact_kernel_name(plain + "execute_split_k_kernel__5x_cublas") == "xmma gemm f32f32 tn 64x64x8 split-k"
    cut = "x" * SHORT_NAME_CHARS
    twins = kernel_legend([cut + "_one", cut + "_two"])
    assert f"`{cut}_one` or `{cut}_two` (one short name for these; the table does not tell them apart)" in twins
