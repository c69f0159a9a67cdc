"""The precision report's sections and files: what each template says on either side of its verdicts,
and a run of ``main`` on the committed records that writes every declared output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lmperf.kinds.precision import facts as F
from lmperf.kinds.precision import report
from tests.kinds.precision.report_records import accumulation, autocast, layer_norm, ln_row, toy

REPO = Path(__file__).resolve().parents[3]


def test_the_report_imports_no_torch():
    code = "import sys, lmperf.kinds.precision.report\nraise SystemExit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_accumulation_cites_the_tables_numbers_and_says_identical_only_when_it_is():
    text = report.section_accumulation([accumulation()], "h100")
    answer, table = text.split("\n\n")[:2]
    for cited in ("10.00013351", "9.953125", "10.00213623", "351× fp32's error", "0.78× the increment"):
        assert cited in answer, cited
    for value in ("10.00013351", "9.953125", "10.00213623"):
        assert value in table
    assert "both give 10.00213623" in answer and "exactly as the explicit cast does" in answer
    assert "is the fp16 rounding of 0.01" in answer
    other = report.section_accumulation([accumulation(cast_result=10.0021372, mixed_result=10.0)], "h100")
    assert "give 10 and 10.0021372" in other and "exactly as the explicit cast does" not in other
    assert "comes from the accumulation as well" in other


def test_toy_model_golden_text():
    text = report.section_toy(toy(fp16=autocast("fp16"), bf16=autocast("bf16")))
    assert text.split("\n\n")[1] == (
        "Under fp16 and bf16 autocast alike the parameters stay fp32, fc1's output, ReLU's and the logits are in "
        "the autocast type (fp16 and bf16 respectively), the layer norm's output is fp32 (layer_norm is on "
        "autocast's fp32 list), the loss fp32 (cross-entropy is on the fp32 list too) and the gradients fp32. "
        "Autocast runs each matmul (fc1, fc2) in the low-precision type on cast copies and never converts the "
        "parameters, so they and their gradients keep the parameters' dtype."
    )


def test_toy_model_says_each_type_apart_where_they_differ_and_names_the_unsupported_one():
    text = report.section_toy(
        toy(fp16={"status": "unsupported", "reason": "not here"}, bf16=autocast("bf16", ln_output="bf16"))
    )
    assert "fp16 autocast is not supported on `cuda` here (not here)." in text
    assert "the layer norm's output bf16 (this device's autocast runs layer_norm in bf16)" in text
    assert "| unsupported" in text and "alike" not in text


def _rows(**fp16_at_100) -> list[dict]:
    rows = [ln_row(d, m) for d in ("fp16", "bf16", "fp32") for m in (0.0, 10.0, 100.0)]
    rows[2].update(fp16_at_100)
    return rows


def test_layer_norm_claims_inf_or_nan_only_where_a_row_shows_it():
    finite = report.section_layer_norm(layer_norm(_rows(mean_lowp_accumulation_err_std=None)), None, "h100")
    assert "No variance or output of the overflowing rows is inf/NaN" in finite and "becomes inf/NaN" not in finite
    assert "Where the table shows inf (overflow): “mean, low-prec. accumulation (σ)” at fp16, mean 100." in finite
    broken = report.section_layer_norm(layer_norm(_rows(var_one_pass_rel_err=None)), None, "h100")
    assert "the variance or output becomes inf/NaN: “var E[x²]−E[x]² (rel.)” at mean 100." in broken
    assert "No variance or output" not in broken


def test_layer_norm_close_to_fp32_flips_at_the_factor_and_autocast_is_cited_only_when_it_says_so():
    def text(ratio, toy_record=None):
        rows = _rows()
        for r in rows:
            r.update(output_fp32_from_rounded_input_err=0.01, output_kernel_err=0.01 * ratio)
        return report.section_layer_norm(layer_norm(rows), toy_record, "h100")

    close = text(F.CLOSE_ERROR_FACTOR * 0.9)
    assert f"within {F.CLOSE_ERROR_FACTOR:g}× of an fp32 computation" in close and "more than" not in close
    far = text(F.CLOSE_ERROR_FACTOR * 1.1)
    assert f"more than {F.CLOSE_ERROR_FACTOR:g}× an fp32 computation" in far and "within 2×" not in far
    assert "why autocast runs layer_norm in fp32" in text(1.0, toy(bf16=autocast("bf16")))
    assert "why autocast" not in text(1.0, toy(bf16=autocast("bf16", ln_output="bf16")))


def _check(out: Path) -> dict[str, str]:
    for path in report.outputs({}):
        assert (out / path).is_file(), path
    return {name: (out / "sections" / f"{name}.md").read_text() for name in report.SECTIONS}


def test_main_on_committed_records_writes_every_output_and_references_its_figure(tmp_path):
    paths = sorted((REPO / "results" / "h100" / "precision").glob("*.json"))
    if not paths:
        pytest.skip("no committed h100 precision records")
    out = tmp_path / "results" / "h100"
    assert report.main(["--device", "h100", "--out", str(out), "--grid", "{}", "--records", *map(str, paths)]) == 0
    sections = _check(out)
    text = "\n".join(sections.values())
    for figure in (out / "figures").iterdir():
        assert f"](../../results/h100/figures/{figure.name})" in text, figure.name
    assert "### (a)" in sections["benchmarking_mixed_precision_ab"] and "### (b)" in text
    assert (out / "tables" / "precision_accumulation.csv").read_text().count("\n") == 5


def test_main_without_records_says_not_measured(tmp_path):
    out = tmp_path / "results" / "h200"
    assert report.main(["--device", "h200", "--out", str(out), "--records"]) == 0
    assert set(_check(out).values()) == {report.NOT_MEASURED}
