"""flash_forward / flash_backward: within tolerance or not, the saved-tensor contract, the entry closest
to its tolerance, the answer's wording."""

from __future__ import annotations

import pytest

from lmperf.kinds.flash import correctness_report
from lmperf.kinds.flash.correctness_report import CorrectnessFacts

from .builders import correctness, entry


def _records(**bad):
    good = [entry(p, d) for p in ("fp32", "bf16") for d in (16, 64)]
    return [correctness("pytorch", good), correctness("triton", [*good[:-1], entry("bf16", 64, **bad)])]


def test_every_entry_within_tolerance_is_a_yes():
    facts = CorrectnessFacts("flash_forward", _records())
    assert facts.within_tolerance and facts.entries == 8 and not facts.failures
    assert correctness_report.answer(facts).startswith("Yes: the outputs O and L of `FlashAttention2PyTorch` and")


def test_one_entry_over_tolerance_is_a_no():
    facts = CorrectnessFacts("flash_backward", _records(error=0.5, status="fail"))
    assert not facts.within_tolerance
    assert facts.failures == ("triton bf16 d=64 causal=True (2, 64, 64): fail — O error 5.00e-01 >= 2e-02",)
    assert correctness_report.answer(facts).startswith("No: 1 of 8 entries of ")
    row, tensor, error = facts.closest
    assert (row.implementation, row.precision, error, row.tolerance) == ("triton", "bf16", 0.5, 3e-2)
    assert "16.7× over the tolerance" in correctness_report.answer(facts)
    assert [r.ok for r in facts.rows] == [2, 2, 2, 1]  # per implementation and precision


def test_the_saved_tensor_contract_is_a_forward_fact():
    kept = CorrectnessFacts("flash_forward", _records())
    broken = CorrectnessFacts("flash_forward", _records(saved_ok=False))
    assert kept.saved == (8, 8) and broken.saved == (7, 8)
    assert "1 of 8 entries do not save exactly one float32 tensor" in correctness_report.answer(broken)
    assert CorrectnessFacts("flash_backward", _records()).saved is None


def test_the_closest_call_is_by_share_of_the_tolerance():
    records = [correctness("triton", [entry("fp32", error=5e-6, tol=(1e-5, 1e-4)), entry("bf16", error=1e-3)])]
    facts = CorrectnessFacts("flash_forward", records)
    row, tensor, error = facts.closest
    assert (row.precision, tensor, error) == ("fp32", "O", 5e-6)  # 50% of its tolerance, not bf16's 5%
    assert "`triton`'s fp32 O: relative error 5.0e-06, 50% of the tolerance 1.0e-05" in correctness_report.answer(facts)


@pytest.mark.parametrize("problem", ["flash_forward", "flash_backward"])
def test_no_entries_is_one_line(problem):
    unsupported = correctness("triton", [])
    unsupported["status"], unsupported["reason"] = "unsupported", "no Triton"
    text = correctness_report.section(problem, [unsupported], "cpu")
    assert text == "FlashAttention-2 correctness was not measured on `cpu` (unsupported: no Triton).\n"


def test_forward_answer_golden():
    assert correctness_report.answer(CorrectnessFacts("flash_forward", _records())) == (
        "Yes: the outputs O and L of `FlashAttention2PyTorch` and `FlashAttention2Triton` match float64 attention "
        "within tolerance in all 8 entries (fp32 and bf16, head dims 16–64, causal). The closest to its "
        "tolerance is `pytorch`'s fp32 O: relative error 1.0e-03, 5% of the tolerance 2.0e-02. Every "
        "entry saves exactly one float32 tensor of L's shape (batch, n_queries) beside Q, K, V and O, as "
        "backward needs."
    )
