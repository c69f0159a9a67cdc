"""The precision report: its facts with records on both sides of every verdict, the wording of the layer-norm
answer's verdicts, and ``main`` writing every output."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lmperf.kinds.precision import facts as F
from lmperf.kinds.precision import report

from .records import accumulation, autocast, layer_norm, ln_row, record

REPO = Path(__file__).resolve().parents[3]


def test_accumulation_verdicts_flip_with_their_sums():
    a = F.AccumulationFacts(accumulation())
    assert a.fp16_error_over_fp32 == 0.046875 / 0.000133514404296875
    assert a.cast_identical and a.fp32_sum_is_representation
    # the stored increments sum to 10.00213623: an fp32 sum at 10 is off by more than the representation
    off = accumulation(cast_result=10.0021372, mixed_result=10.0)
    assert not F.AccumulationFacts(off).cast_identical and not F.AccumulationFacts(off).fp32_sum_is_representation
    text = report.section_accumulation([accumulation()], "h100")
    assert "351× fp32's error" in text and "(0.00781 from 8 on, where" in text
    assert "exactly as the explicit cast" in text and "as well as" in report.section_accumulation([off], "h100")


def test_fp16_drift_is_told_as_what_a_replay_of_the_loop_adds():
    """Replayed in numpy, each fp16 addition adds the increment rounded to the sum's spacing: one value per power of
    two, 0.78× the increment from 8 on, 1.17× from 4 to 8; the text gives those, and their sum, not 'most is lost'."""
    total, inc, added = np.float16(0), np.float16(0.01), {}
    for _ in range(1000):
        new = np.float16(total + inc)
        if np.spacing(new) == np.spacing(total):  # within one power of two
            added.setdefault(float(np.spacing(total)), set()).add(float(new - total) / float(inc))
        total = new
    assert float(total) == 9.953125 and len(added[1 / 128]) == len(added[1 / 256]) == 1  # as the record has it
    (near,), (below,), drift = added[1 / 128], added[1 / 256], (float(total) - 1000 * float(inc)) / float(inc)
    text = report.section_accumulation([accumulation()], "h100")
    assert f"it adds {near:.2f}× the increment; half that from 4 to 8, where it adds {below:.2f}×)" in text
    assert f"these errors add up to {drift:+.1f} increments" in text and "rounds away most" not in text


def test_toy_model_golden_text():
    fp16, bf16 = autocast("fp16"), autocast("bf16", ln_output="bf16")
    assert report.toy_answer(F.ToyFacts(record("toy_model", {"autocast": {"fp16": fp16, "bf16": bf16}}))) == (
        "Under fp16 autocast the parameters stay fp32, fc1's output and the logits are fp16, the layer norm's output "
        "fp32, the loss fp32 and the gradients fp32. Under bf16 autocast the parameters stay fp32, fc1's output and the "
        "logits are bf16, the layer norm's output bf16, the loss fp32 and the gradients fp32. `cross_entropy` is on "
        "autocast's fp32 list. Autocast casts a copy for each matmul and never converts the parameters, nor their gradients."
    )


def rows(**fp16_at_100) -> list[dict]:
    out = [ln_row(d, m) for d in ("fp16", "bf16", "fp32") for m in (0.0, 10.0, 100.0)]
    out[2].update(fp16_at_100)
    return out


def answer(records: list[dict], ln_output: str = "fp32") -> str:
    toy = record("toy_model", {"autocast": {"bf16": autocast("bf16", ln_output=ln_output)}})
    return report.layer_norm_answer(F.LayerNormFacts(layer_norm(records)), F.ToyFacts(toy).all("ln_output", "fp32"))


def test_layer_norm_verdicts_on_both_sides():
    f = F.LayerNormFacts(layer_norm(rows(mean_lowp_accumulation_err_std=None)))
    assert [r["mean"] for r in f.overflowing] == [10.0, 100.0] and f.bf16_overflows is False
    assert [(r["dtype"], r["mean"]) for r in f.compared] == [("fp16", 10.0), ("bf16", 10.0)]  # both sums finite there
    assert F.LayerNormFacts(layer_norm(rows())).compared[0]["mean"] == 100.0
    assert "inf/NaN" not in answer(rows(mean_lowp_accumulation_err_std=None))  # claimed only where a row shows it
    assert "“var E[x²]−E[x]² (rel.)” at mean 100 is inf/NaN" in answer(rows(var_one_pass_rel_err=None))
    for ratio, words in ((0.9, "within"), (1.1, "more than")):
        errors = {"output_fp32_from_rounded_input_err": 0.01, "output_kernel_err": 0.01 * F.CLOSE_ERROR_FACTOR * ratio}
        assert f"{words} {F.CLOSE_ERROR_FACTOR:g}× fp32's" in answer([r | errors for r in rows()])
    coarse = rows()
    coarse[5]["input_rounding_err_std"] = 0.26  # bf16 at mean 100, fp16's is 0.01
    assert "even more coarsely" in answer(coarse) and "even more" not in answer(rows())
    assert "why autocast runs it in fp32" in answer(rows()) and "why autocast" not in answer(rows(), "bf16")


def test_main_writes_every_output_and_says_when_nothing_was_measured(tmp_path):
    paths = sorted((REPO / "results" / "h100" / "precision").glob("*.json"))
    for device, records in (("h100", paths), ("h200", [])):
        out = tmp_path / device
        assert report.main(["--device", device, "--out", str(out), "--records", *map(str, records)]) == 0
        assert all((out / p).is_file() for p in report.outputs({}))
        sections = [(out / "sections" / f"{name}.md").read_text() for name in report.SECTIONS]
        assert (sections == [report.NOT_MEASURED] * 2) == (not records) and ("### (b)" in sections[1]) == bool(records)
