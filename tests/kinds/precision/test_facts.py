"""The precision report's facts: every verdict with records on both sides of it."""

from __future__ import annotations

import pytest

from lmperf.kinds.precision import facts as F
from tests.kinds.precision.report_records import accumulation, autocast, layer_norm, ln_row, toy

# -- mixed_precision_accumulation -------------------------------------------------------------------


def test_accumulation_facts_from_the_four_loops():
    a = F.accumulation_facts(accumulation())
    assert [x.variant for x in a.loops][:2] == ["fp32 += fp32", "fp16 += fp16"]
    assert a.fp16_error_over_fp32 == pytest.approx(0.046875 / 0.000133514404296875)
    assert a.cast_identical and a.fp32_sum_is_representation


def test_the_in_place_add_and_the_cast_agree_only_when_their_sums_do():
    assert F.accumulation_facts(accumulation()).cast_identical
    assert not F.accumulation_facts(accumulation(cast_result=10.0021372)).cast_identical


def test_an_fp32_sum_of_fp16_increments_errs_by_representation_only_while_it_stays_near_their_sum():
    # the stored increments sum to 10.00213623: the representation error is 0.00214
    assert F.accumulation_facts(accumulation(mixed_result=10.0021)).fp32_sum_is_representation
    assert not F.accumulation_facts(accumulation(mixed_result=10.0)).fp32_sum_is_representation


# -- benchmarking_mixed_precision (a) ---------------------------------------------------------------


def test_autocast_dtypes_and_the_layer_norm_and_loss_verdicts():
    t = F.toy_facts(toy(fp16=autocast("fp16"), bf16=autocast("bf16", ln_output="bf16", loss="bf16")))
    fp16, bf16 = t.autocasts
    assert fp16.of("fc1_output") == "fp16" and fp16.of("parameters") == "fp32" and fp16.of("gradients") == "fp32"
    assert fp16.ln_in_fp32 and fp16.loss_in_fp32
    assert not bf16.ln_in_fp32 and not bf16.loss_in_fp32


def test_an_unsupported_autocast_type_keeps_its_reason():
    t = F.toy_facts(toy(fp16={"status": "unsupported", "reason": "no fp16 here"}, bf16=autocast("bf16")))
    assert [a.dtype for a in t.supported] == ["bf16"]
    assert t.autocasts[0].reason == "no fp16 here" and t.autocasts[0].dtypes == ()


# -- benchmarking_mixed_precision (b) ---------------------------------------------------------------


def _rows(**fp16_at_100) -> list[dict]:
    rows = [ln_row(d, m) for d in ("fp16", "bf16", "fp32") for m in (0.0, 10.0, 100.0)]
    rows[2].update(fp16_at_100)
    return rows


def test_fp16_overflow_from_the_first_mean_whose_sum_of_squares_overflows():
    f = F.layer_norm_facts(layer_norm(_rows()))
    assert f.fp16_overflow_from == 10.0 and f.sum_of_squares_there == 2560 * 101
    assert f.mean_square_max == pytest.approx(100 * 100 + 1)  # Σx²/width at the largest overflowing mean
    assert f.bf16_overflows is False and f.width == 2560 and f.rows_per_mean == 16
    rows = [r for r in _rows() if r["mean"] < 10]
    assert F.layer_norm_facts(layer_norm(rows)).fp16_overflow_from is None


def test_inf_and_nan_are_claimed_only_where_a_row_shows_them():
    finite = F.layer_norm_facts(layer_norm(_rows(mean_lowp_accumulation_err_std=None)))
    assert finite.broken == () and finite.inf_entries == (("mean_lowp_accumulation_err_std", "fp16", 100.0),)
    broken = F.layer_norm_facts(layer_norm(_rows(var_one_pass_rel_err=None, output_lowp_err=float("inf"))))
    assert broken.broken == (("var_one_pass_rel_err", 100.0), ("output_lowp_err", 100.0))


def test_the_types_are_compared_at_the_largest_mean_finite_in_both():
    f = F.layer_norm_facts(layer_norm(_rows(mean_lowp_accumulation_err_std=None)))
    assert [(p.dtype, p.mean) for p in f.compared] == [("fp16", 10.0), ("bf16", 10.0)]
    assert F.layer_norm_facts(layer_norm(_rows())).compared[0].mean == 100.0


def test_f_layer_norm_is_close_to_fp32_only_within_the_factor():
    def close(ratio: float) -> bool:
        rows = _rows()
        for r in rows:
            r.update(output_fp32_from_rounded_input_err=0.01, output_kernel_err=0.01 * ratio)
        return F.layer_norm_facts(layer_norm(rows)).compared[0].kernel_close

    assert close(F.CLOSE_ERROR_FACTOR * 0.9) and not close(F.CLOSE_ERROR_FACTOR * 1.1)


def test_bf16_rounds_more_coarsely_only_where_its_input_rounding_is_larger():
    rows = _rows()
    rows[5]["input_rounding_err_std"] = 0.26  # bf16 at mean 100, fp16's is 0.01
    assert F.layer_norm_facts(layer_norm(rows)).bf16_coarser
    rows[5]["input_rounding_err_std"] = 0.001
    assert not F.layer_norm_facts(layer_norm(rows)).bf16_coarser
