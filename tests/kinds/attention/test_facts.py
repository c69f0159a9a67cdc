"""Facts of the attention report from synthetic records: memory baselines, boundaries, accounting, growth."""

from __future__ import annotations

import math

import pytest

from lmperf.kinds.attention import facts
from lmperf.kinds.attention import memory_model as memory

from .report_records import BATCH, MIB, plain_oom, record

LENGTHS = (4096, 8192, 16384)


def test_memory_before_backward_counts_the_cells_own_tensors_not_what_the_process_held():
    held = 64.0
    df = facts.frame([record("plain", 16, 1024, held_mib=held)])
    row = df.iloc[0]
    shape = memory.Shape(BATCH, 1024, 16, 4)
    acc = memory.plain_accounting(shape)
    # the cell's own: Q, K, V, dO and what the forward keeps -- the accounting's before-backward exactly
    assert row.before_backward_mib == pytest.approx(acc.before_backward_bytes / MIB)
    assert row.held_before_cell_mib == pytest.approx(held)
    # the record's figure carries the held memory on top
    assert row.memory_before_backward_mib == pytest.approx(row.before_backward_mib + held)
    assert facts.held_before_cell(facts.frame([record("plain", 16, n, held_mib=h) for n, h in ((256, 0), (1024, 64))]))
    assert facts.held_before_cell(df) == (held, held)


def test_on_a_cpu_kept_memory_comes_from_autograds_saved_tensors_and_nothing_is_held():
    row = facts.frame([record("plain", 16, 256, device="cpu")]).iloc[0]
    assert row.kept_source == "autograd hooks"
    assert row.kept_mib == pytest.approx(memory.plain_accounting(memory.Shape(BATCH, 256, 16, 4)).retained_bytes / MIB)
    assert math.isnan(row.held_before_cell_mib)


def test_boundaries_separate_out_of_memory_from_not_measured():
    records = [record("plain", 64, n) for n in LENGTHS] + [plain_oom(64, 32768)]
    records += [record("flash", 64, n) for n in (4096, 8192)]
    df = facts.frame(records)
    planned = facts.planned_cells(records, {"head_dims": [64], "sequence_lengths": [*LENGTHS, 32768]})
    (plain,) = facts.boundaries(df, "plain", planned)
    assert (plain.largest_ok, plain.smallest_oom, plain.oom_phase, plain.missing) == (
        16384,
        32768,
        "forward warm-up",
        (),
    )
    (flash,) = facts.boundaries(df, "flash", planned)
    # no record at 16384 and 32768: not measured, never counted as out of memory
    assert (flash.largest_ok, flash.smallest_oom, flash.missing) == (8192, None, (16384, 32768))


def test_planned_cells_come_from_the_records_settings_without_a_grid():
    r = record("sdpa", 16, 1024, settings={"head_dims": [16], "sequence_lengths": [1024, 65536]})
    assert facts.planned_cells([r], {}) == {(16, 1024), (16, 65536)}


def test_oom_accounting_of_the_smallest_plain_cell_that_ran_out():
    df = facts.frame([record("plain", 16, 16384), plain_oom(16, 32768), plain_oom(16, 65536)])
    acc = facts.oom_accounting(df)
    assert acc.ran_out and (acc.shape.head_dim, acc.shape.seq_len) == (16, 32768)
    assert acc.shape.matrix_bytes == 32 * 2**30  # 8 · 32768² · 4 bytes
    assert acc.first_failure.step.tensor == "E"  # raw freed; S, X live: the third matrix does not fit 79.2 GiB
    assert acc.reserved_unallocated_mib == pytest.approx(1.0)
    assert acc.allocated_mib == pytest.approx(65669.12)


def test_oom_accounting_without_any_plain_oom_takes_the_largest_cell():
    acc = facts.oom_accounting(facts.frame([record("plain", 16, n) for n in (1024, 4096)]))
    assert not acc.ran_out and acc.shape.seq_len == 4096 and acc.first_failure is None


def test_reserved_but_unallocated_is_read_from_the_message():
    message = "... 96.16 GiB is allocated by PyTorch, and 31.97 GiB is reserved by PyTorch but unallocated."
    assert facts.reserved_unallocated_mib(message) == pytest.approx(31.97 * 1024)
    assert facts.reserved_unallocated_mib("0 bytes is reserved by PyTorch but unallocated") == 0.0
    assert facts.reserved_unallocated_mib("no such text") is None


def test_growth_exponents_quadratic_for_plain_linear_for_fused_and_oom_cells_left_out():
    records = [record(impl, 64, n) for impl in ("plain", "flash") for n in LENGTHS]
    # compiled: two matrices; at 32768 its forward kept memory, then backward ran out of memory
    records += [record("compiled", 64, n, n2=2) for n in LENGTHS]
    records.append(record("compiled", 64, 32768, "oom", n2=2, bwd=None, oom_phase="backward warm-up"))
    df = facts.frame(records)
    plain, flash, compiled = (facts.growth(df, i) for i in ("plain", "flash", "compiled"))
    assert plain.exponent == pytest.approx(2.0, abs=0.02) and plain.n2_matrices_kept == pytest.approx(3.0, abs=0.01)
    assert flash.exponent == pytest.approx(1.0, abs=0.01) and flash.n2_matrices_kept == pytest.approx(0.0, abs=0.01)
    assert compiled.fit_ranges == ((4096, 16384, (64,)),)  # the oom cell is not fitted
    assert facts.fit_left_out(df) == [("compiled", 32768, "out of memory in the backward warm-up", (64,))]


def test_head_dim_ratio_at_the_largest_length_every_head_dim_ran():
    df = facts.frame([record("plain", d, n) for d in (16, 128) for n in (1024, 4096)] + [record("plain", 16, 8192)])
    n, lo, hi, ratio = facts.head_dim_ratio(df, "plain")
    assert (n, lo, hi) == (4096, 16, 128)
    shape = {d: memory.Shape(BATCH, 4096, d, 4) for d in (16, 128)}
    expected = memory.plain_accounting(shape[128]).retained_bytes / memory.plain_accounting(shape[16]).retained_bytes
    assert ratio == pytest.approx(expected)


def test_a_kept_mismatch_is_named_only_beyond_its_share():
    share = facts.KEPT_MISMATCH_SHARE

    def frame_with(alloc_share: float):
        df = facts.frame([record("flash", 128, 32768)])
        df["retained_by_forward_mib"] = df.retained_tensors_mib * alloc_share
        return df

    assert facts.kept_mismatches(frame_with(1 - share / 2)) == []
    assert [m[:3] for m in facts.kept_mismatches(frame_with(1 - 2 * share))] == [("flash", 128, 32768)]


def test_prediction_error_is_the_largest_relative_difference():
    df = facts.frame([record("plain", 16, 1024), record("plain", 16, 4096, kept_scale=1.02)])
    assert facts.prediction_error(df) == pytest.approx(0.02)
    # compiled has no prediction: nothing to compare
    assert facts.prediction_error(facts.frame([record("compiled", 16, 1024)])) is None


def test_attention_facts_name_the_unsupported_and_the_fused_implementation_that_ran_longest():
    records = [record("plain", 16, n) for n in LENGTHS] + [record("sdpa", 16, n) for n in (*LENGTHS, 32768)]
    records += [record("flash", 16, n) for n in LENGTHS]
    records += [record("sdpa_cudnn", 16, n, "unsupported") for n in LENGTHS]
    f = facts.attention_facts(facts.frame(records), records, {}, "h100")
    assert f.implementations == ("plain", "flash", "sdpa", "sdpa_cudnn")
    assert f.unsupported == {"sdpa_cudnn": "sdpa_cudnn: cannot run here"} and "sdpa_cudnn" not in f.boundaries
    assert f.fused_growth.implementation == "sdpa" and f.fused_growth.largest_n == 32768
    assert f.plain_times_at == 16384 and [d for d, _, _ in f.plain_times] == [16]
