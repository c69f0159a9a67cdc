"""nsys_profile's report: the command line on committed records, CPU words, interval marks, the fused
attention class, and the one golden text (answer (a))."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from lmperf.kinds.nsys import facts, report

from . import records as R

H100 = Path(__file__).resolve().parents[3] / "results" / "h100"


def committed() -> list[str]:
    paths = [H100 / "nsys" / f"{m}_ctx{c}_{p}_{mode}.json" for m in ("small", "xl") for c in (128, 1024)
             for p in ("fp32", "bf16") for mode in ("inference", "training")]  # fmt: skip
    paths = [p for p in paths if p.is_file()]  # small has bf16 cells, xl does not; xl's 1024 training ran out
    if len(paths) != 12:
        pytest.skip("committed h100 nsys records not here")
    e2e = [H100 / "e2e" / f"{m}_ctx{c}_fp32_eager_w5.json" for m in ("small", "xl") for c in (128, 1024)]
    return [str(p) for p in paths + [p for p in e2e if p.is_file()]]


def test_main_on_committed_records_writes_every_output_and_links_it(tmp_path):
    assert report.main(["--device", "h100", "--out", str(tmp_path), "--grid", "{}", "--records", *committed()]) == 0
    for path in report.outputs({}):
        assert (tmp_path / path).stat().st_size > 0, path
    text = (tmp_path / "sections" / "nsys_profile.md").read_text()
    for link in re.findall(r"\]\(\.\./\.\./results/h100/([\w./]+)\)", text):
        assert (tmp_path / link).is_file(), link
    assert "\n\n\n" not in text and "xl ctx 1024 fp32 training" in text and "_No fp32" not in text
    assert [h[:7] for h in re.findall(r"^### .*", text, re.M)] == [f"### ({x})" for x in "abcde"]
    table = pd.read_csv(tmp_path / report.CELLS_CSV)
    assert {"inference_fwd_e2e", "inference_fwd_e2e_low", "inference_fwd_e2e_high"} <= set(table.columns)
    assert len(table) == 6 and "train_class_share" not in table
    # every shortened kernel name in (b)'s table has its full name in the legend
    part = text.split("### (b)", 1)[1].split("### (c)", 1)[0]
    shown = {n for line in part.splitlines() if line.startswith("|") for n in re.findall(r"`([^`]+)`", line)}
    legend = part.split("names in full</summary>", 1)[1]
    assert [n for n in shown if n.startswith(("xmma ", "nvjet ", "cutlass "))]
    assert all(f"- `{n}`: `" in legend for n in shown if n.startswith(("xmma ", "nvjet ", "cutlass ")))


def test_no_records_writes_a_one_line_section_and_every_declared_output(tmp_path):
    assert report.main(["--device", "a100", "--out", str(tmp_path), "--records"]) == 0
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert written == {"sections/nsys_profile.md", *report.outputs({})}  # the workflow declares them all
    assert (tmp_path / "sections" / "nsys_profile.md").read_text().count("\n") == 1


def test_unstable_e2e_estimates_are_marked_and_the_mark_explained():
    recs = [R.inference(range_ms=10.0)]
    tight = report.section(recs, [R.e2e(forward_ms=10.0, interval=[9.9, 10.1])], "h100")
    wide = report.section(recs, [R.e2e(forward_ms=10.0, interval=[8.0, 12.5])], "h100")
    assert "10.0 [9.9, 10.1] " in tight and "†" not in tight
    assert "10.0 [8.0, 12.5] † " in wide and "† unstable: its 95% interval is wider" in wide


def test_fused_attention_kernels_are_a_class_of_their_own():
    fused = {"matmul": 6.0, "attention": 3.0, "elementwise": 1.0}
    text = report.section([R.inference(class_ms=fused), R.training(class_ms=fused | {"optimizer": 1.0})], [], "h100")
    assert "Kernels other than matmuls take 40.0%" in text and "1 attention, 1 elementwise" in text
    assert "| `attention_kernel` | attention |" in text and "the others: attention 27.3%, elementwise" in text


def test_answer_a_reads_the_timer_the_e2e_runs_and_why_they_differ():
    """The one golden text of the section."""
    recs = [R.inference(class_ms={"matmul": 2.0}, range_ms=20.0), R.inference("medium", range_ms=10.0)]
    f = facts.forward_check(facts.frame(recs, [R.e2e(forward_ms=10.0), R.e2e("medium", forward_ms=10.0)]))
    assert report.answer_a(f, "GPU") == (
        "Yes: the profiler's forward time (its range) is 1.00× the Python timer's in the same process, within the "
        "noise in 2 of 2 cells; the kernels keep the GPU busy for 55.0% (10.0–100%) of it. Against the unprofiled "
        "end-to-end runs it is slower in 1, within the noise in 1 of 2 cells; in the slower ones the kernels fill "
        "20.0% of the unprofiled forward: they wait on their launches, which the profiler lengthens."
    )


def test_the_class_shares_figure_draws_the_fp32_cells_its_answer_describes(tmp_path):
    recs = [R.inference(precision=p) for p in ("fp32", "bf16")] + [R.training(precision=p) for p in ("fp32", "bf16")]
    assert report.class_shares(facts.frame(recs, []), tmp_path / "shares.png") == ["small 128 fp32"]


def test_cpu_records_are_told_as_operators_of_the_cpu_and_the_tables_show_the_optimizer_as_the_text_does():
    kw = {"device": "cpu", "profiler": "torch.profiler"}
    train = R.training("tiny", 32, class_ms={"matmul": 24.0, "elementwise": 8.0, "memory": 0.7}, **kw)  # no AdamW name
    train["metrics"]["phases"]["optimizer_step"]["kernel_ms_per_step"] = 3.27  # its range: 10% of the step
    text = report.section([R.inference("tiny", 32, **kw), train], [], "cpu")
    assert "ATen operators" in text and "CPU time" in text and "busy" in text
    assert "NVTX" not in text and "GPU" not in text and "CUDA" not in text
    assert "| calls / forward |" in text and "launches" not in text
    assert "its range taking 10.0%" in text and "| optimizer range, training step |" in text and "| 10.0% |" in text
    assert "optimizer, training step" not in text
    gpu = report.section([R.inference(), R.training()], [], "h100")
    assert "NVTX range" in gpu and "| launches / forward |" in gpu and "the AdamW kernels take 9.0%" in gpu
    assert "| optimizer, training step |" in gpu and "| 9.0% |" in gpu and "optimizer range" not in gpu
