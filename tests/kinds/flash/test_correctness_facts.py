"""flash_forward / flash_backward facts: within tolerance or not, the saved-tensor contract, the entry
closest to its tolerance, and the tiles every entry ran."""

from __future__ import annotations

import pytest

from lmperf.kinds.flash import correctness_report
from lmperf.kinds.flash.correctness_facts import correctness_facts, tiles_text

from .builders import correctness, entry


def _records(**bad):
    good = [entry(p, d) for p in ("fp32", "bf16") for d in (16, 64)]
    return [correctness("pytorch", good), correctness("triton", [*good[:-1], entry("bf16", 64, **bad)])]


def test_every_entry_within_tolerance_is_a_yes():
    facts = correctness_facts("flash_forward", _records())
    assert facts.within_tolerance and facts.entries == 8 and not facts.failures
    assert correctness_report.answer(facts).startswith("Yes: the outputs O and L of `FlashAttention2PyTorch` and")


def test_one_entry_over_tolerance_is_a_no():
    facts = correctness_facts("flash_backward", _records(error=0.5, status="fail"))
    assert not facts.within_tolerance and facts.entries_ok == 7
    assert facts.failures == ("triton bf16 d=64 causal=True (2, 64, 64): fail — O_rel_error above tolerance",)
    assert correctness_report.answer(facts).startswith("No: 1 of 8 entries of ")
    row, tensor, error = facts.closest
    assert (row.implementation, row.precision, error, row.tolerance) == ("triton", "bf16", 0.5, 3e-2)
    assert "16.7× over the tolerance" in correctness_report.answer(facts)


def test_the_saved_tensor_contract_is_a_forward_fact():
    kept = correctness_facts("flash_forward", _records())
    broken = correctness_facts("flash_forward", _records(saved_ok=False))
    assert kept.contract_kept is True and broken.contract_kept is False
    assert "1 of 8 entries do not save exactly one float32 tensor" in correctness_report.answer(broken)
    assert correctness_facts("flash_backward", _records()).contract_kept is None


def test_the_closest_call_is_by_share_of_the_tolerance():
    records = [correctness("triton", [entry("fp32", error=5e-6, tol=(1e-5, 1e-4)), entry("bf16", error=1e-3)])]
    row, tensor, error = correctness_facts("flash_forward", records).closest
    assert (row.precision, tensor, error) == ("fp32", "O", 5e-6)  # 50% of its tolerance, not bf16's 5%
    assert "`triton`'s fp32 O: relative error 5.0e-06, 50% of the tolerance 1.0e-05" in correctness_report.answer(
        correctness_facts("flash_forward", records)
    )


def _tiles(fwd, dkdv, dq):
    def one(m, n):
        return {"config": {"BLOCK_M": m, "BLOCK_N": n, "num_warps": 4, "num_stages": 2}, "source": "heuristic"}

    return {"fwd": one(*fwd), "dkdv": one(*dkdv), "dq": one(*dq)}


def test_every_tile_set_the_entries_ran_is_named_with_its_count():
    big, small = _tiles((128, 64), (64, 64), (128, 64)), _tiles((64, 64), (32, 64), (64, 32))
    entries = [
        {"precision": p, "head_dim": d, "tiles": big if d <= 64 else small}
        for p in ("fp32", "bf16")
        for d in (16, 64, 128)
        for _ in range(2)
    ]
    record = {
        "metrics": {
            "entries_detail": entries,
            # the record's list of every tile seen: the first of each is not what every entry ran
            "triton_tiles": {k: [big[k]["config"], small[k]["config"]] for k in big},
        }
    }
    assert tiles_text(record) == (
        "tiles (BLOCK_M×BLOCK_N, forward / dK/dV pass / dQ pass): 128×64 / 64×64 / 128×64 in 8 entries "
        "(fp32, bf16 d ≤ 64), 64×64 / 32×64 / 64×32 in 4 entries (fp32, bf16 d = 128)"
    )
    # without per-entry tiles: every tile listed, none passed off as the only one
    del record["metrics"]["entries_detail"]
    text = tiles_text(record)
    assert "used across the entries: forward 128×64, 64×64" in text and "dQ pass 128×64, 64×32" in text


@pytest.mark.parametrize("problem", ["flash_forward", "flash_backward"])
def test_no_entries_is_one_line(problem):
    unsupported = correctness("triton", [])
    unsupported["status"], unsupported["reason"] = "unsupported", "no Triton"
    text = correctness_report.section(correctness_facts(problem, [unsupported]), "cpu", "")
    assert text == "FlashAttention-2 correctness was not measured on `cpu` (unsupported: no Triton).\n"


def test_forward_answer_golden():
    assert correctness_report.answer(correctness_facts("flash_forward", _records())) == (
        "Yes: the outputs O and L of `FlashAttention2PyTorch` and `FlashAttention2Triton` match float64 attention "
        "within tolerance in all 8 entries (fp32 and bf16, head dims 16–64, causal, 1 shape). The closest to its "
        "tolerance is `pytorch`'s fp32 O: relative error 1.0e-03, 5% of the tolerance 2.0e-02. Every "
        "entry saves exactly one float32 tensor of L's shape (batch, n_queries) beside Q, K, V and O, as "
        "backward needs."
    )
