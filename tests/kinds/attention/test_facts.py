"""Facts of the attention report from synthetic records: memory, boundaries, accounting, growth,
compiled against plain on both sides of the noise, and the tables' marks."""

from __future__ import annotations

import pytest

from lmperf.core.stats import SAME_MARGIN, UNSTABLE_WIDTH
from lmperf.kinds.attention import facts
from lmperf.kinds.attention import memory_model as memory
from lmperf.kinds.attention import report as tables
from lmperf.report.common import UNSTABLE_MARK

from .records import MIB, plain_oom, record

LENGTHS = (4096, 8192, 16384)


def test_memory_before_backward_counts_the_cells_own_tensors_on_any_device():
    acc = memory.plain_accounting(memory.Shape(8, 1024, 16, 4))
    for device in ("h100", "cpu"):
        row = facts.frame([record("plain", 16, 1024, device=device)]).iloc[0]
        assert row.before_backward_mib == pytest.approx(acc.before_backward_bytes / MIB)
        assert row.n2_matrices_kept == pytest.approx(3 + 2 / 1024)  # S, E and P beyond O, and two rows of N
    assert facts.frame([record("plain", 16, 1024, retained_by_forward_mib=50.0)]).kept_mib[0] == 50.0  # the allocator's


def test_boundaries_and_the_accounting_of_the_smallest_plain_cell_that_ran_out():
    records = [record("plain", d, n) for d in (16, 64) for n in LENGTHS] + [
        record("flash", 64, n) for n in (4096, 8192)
    ]
    df = facts.frame(records + [plain_oom(d, n) for d in (16, 64) for n in (32768, 65536)])
    assert [(b.head_dim, b.largest_ok, b.smallest_oom) for b in facts.boundaries(df, "plain")] == [
        (16, 16384, 32768),
        (64, 16384, 32768),
    ]
    assert facts.boundaries(df, "flash") == [facts.Boundary(64, 8192, None, None)]  # no record: not out of memory
    acc = facts.oom_accounting(df)
    assert acc.ran_out and (acc.shape.head_dim, acc.shape.seq_len, acc.oom_phase) == (16, 32768, "forward warm-up")
    assert acc.shape.matrix_bytes == 32 * 2**30  # 8 · 32768² · 4 bytes
    assert acc.first_failure.step.tensor == "E"  # raw freed; S and X live: a third matrix does not fit 79.2 GiB
    assert (acc.requested_mib, acc.allocated_mib, acc.reserved_unallocated_mib) == (32768.0, 65669.12, 1.0)
    # a card that holds the forward: the backward's temporaries are what does not fit
    big = {"device_total_memory_mib": 143_156.0, "oom_message": "and 31.97 GiB is reserved by PyTorch but unallocated"}
    acc = facts.oom_accounting(facts.frame([record("plain", 16, 16384), plain_oom(16, 32768, **big)]))
    assert acc.first_failure is None and acc.reserved_unallocated_mib == pytest.approx(31.97 * 1024)
    acc = facts.oom_accounting(facts.frame([record("plain", 16, n) for n in (1024, 4096)]))
    assert not acc.ran_out and acc.shape.seq_len == 4096


def test_growth_is_quadratic_for_plain_linear_for_fused_and_fits_only_cells_that_ran_in_full():
    records = [
        record(i, 64, n, n2=2 if i == "compiled" else None) for i in ("plain", "flash", "compiled") for n in LENGTHS
    ]
    records.append(record("compiled", 64, 32768, "oom", n2=5, bwd=None, oom_phase="backward warm-up"))
    df = facts.frame(records)
    plain, flash, compiled = (facts.growth(df, i) for i in ("plain", "flash", "compiled"))
    assert plain.exponent == pytest.approx(2.0, abs=0.02) and plain.n2_matrices_kept == pytest.approx(3.0, abs=0.01)
    assert flash.exponent == pytest.approx(1.0, abs=0.01) and flash.n2_matrices_kept == pytest.approx(0.0, abs=0.01)
    assert compiled.largest_n == 16384 and compiled.n2_matrices_kept == pytest.approx(2.0, abs=0.01)  # oom not fitted


def test_attention_facts():
    records = [record("plain", 16, n) for n in LENGTHS] + [record("sdpa", 16, n) for n in (*LENGTHS, 32768)]
    records += [record("flash", 16, n) for n in LENGTHS] + [record("sdpa_cudnn", 16, n, "unsupported") for n in LENGTHS]
    f = facts.AttentionFacts(facts.frame(records))
    assert f.implementations == ("plain", "flash", "sdpa", "sdpa_cudnn")
    assert f.unsupported == {"sdpa_cudnn": "sdpa_cudnn: cannot run here"} and "sdpa_cudnn" not in f.boundaries
    assert f.fused_growth.implementation == "sdpa" and f.fused_growth.largest_n == 32768
    assert f.plain_times_at == 16384 and [d for d, _, _ in f.plain_times] == [16] and f.prediction_error == 0.0
    off = facts.frame([record("plain", 16, 1024), record("plain", 16, 4096, retained_by_forward_mib=1.02 * 1536.0)])
    assert facts.AttentionFacts(off).prediction_error == pytest.approx(1.02 * 1536 / off.predicted_retained_mib[1] - 1)


def _pair(plain_ms, compiled_ms, plain_interval=None, compiled_interval=None, trials=1, n=4096):
    return [
        record("plain", 64, n, fwd=plain_ms, bwd=3 * plain_ms, fwd_interval=plain_interval, trials=trials),
        record("compiled", 64, n, fwd=compiled_ms, bwd=compiled_ms, fwd_interval=compiled_interval, trials=trials),
    ]


def _verdict(records, phase="forward"):
    row = facts.compile_frame(facts.frame(records)).iloc[0]
    return row[f"{phase}_verdict"], row[f"{phase}_speedup"]


def test_compiled_is_faster_only_beyond_the_noise():
    assert _verdict(_pair(1.3, 1.0, (1.29, 1.31), (0.99, 1.01), trials=5)) == ("faster", pytest.approx(1.3))
    assert _verdict(_pair(1.3, 1.0, (0.9, 1.7), (0.8, 1.4), trials=5))[0] == "within noise"  # overlapping intervals
    # single trials: "the same" reaches twice the margin either side of 1
    assert _verdict(_pair(1 + 1.5 * SAME_MARGIN, 1.0))[0] == "within noise"
    assert _verdict(_pair(1 + 3 * SAME_MARGIN, 1.0))[0] == "faster"
    assert _verdict(_pair(1.0, 1 + 3 * SAME_MARGIN))[0] == "slower"
    assert _verdict(_pair(1.0, 1.0), "backward") == ("faster", pytest.approx(3.0))  # each phase on its own
    c = facts.CompileFacts(facts.frame([r for n, ms in zip(LENGTHS, (0.5, 1.01, 2.0)) for r in _pair(ms, 1.0, n=n)]))
    assert c.verdicts["forward"] == {"faster": ((64, 16384),), "slower": ((64, 4096),), "within noise": ((64, 8192),)}
    assert c.speedups["forward"] == pytest.approx((1.01, 0.5, 2.0)) and (c.pairs, c.first_compile_s) == (3, 0.9)
    assert (c.n2_kept_plain, c.n2_kept_compiled) == (pytest.approx(3, abs=0.01), pytest.approx(2, abs=0.01))


def test_tables_show_intervals_unstable_marks_out_of_memory_and_within_noise_speedups():
    narrow, wide = ((56.0 * (1 - w), 56.0 * (1 + w)) for w in (UNSTABLE_WIDTH / 4, UNSTABLE_WIDTH))
    records = [record("plain", 16, n, fwd=56.0, fwd_interval=i, trials=3) for n, i in ((1024, narrow), (4096, wide))]
    cells = tables.pivot(facts.frame(records), "plain", tables.time_cell, "ms")["d = 16 (ms)"]
    assert list(cells) == ["56.0 [54.6, 57.4] / 2.00", f"56.0 [50.4, 61.6] {UNSTABLE_MARK} / 2.00"]
    compiled = record("compiled", 16, 32768, "oom", fwd=77.9, bwd=None, oom_phase="backward warm-up")
    df = facts.frame([record("plain", 16, 16384), plain_oom(16, 32768), compiled])
    assert list(tables.pivot(df, "plain", tables.time_cell, "ms").iloc[:, 1]) == [
        "1.00 / 2.00",
        "OOM (forward warm-up)",
    ]
    assert list(tables.pivot(df, "plain", tables.memory_cell, "MiB").iloc[:, 1]) == ["24,617", "OOM (98,386 predicted)"]
    assert list(tables.pivot(df, "compiled", tables.time_cell, "ms").iloc[:, 1]) == ["77.9 / OOM (backward warm-up)"]
    table = tables.compile_table(facts.compile_frame(facts.frame(_pair(1.02, 1.0) + _pair(2.0, 1.0, n=8192))))
    assert list(table.iloc[:, 1]) == ["≈1.02× / 3.06×", "2.00× / 6.00×"]
    assert [tables.sig(x) for x in (0.08031, 39.16, 1703.2)] == ["0.0803", "39.2", "1,703"]
    assert tables.human_bytes(32 * 2**30) == "32 GiB" and tables.human_bytes(1.5 * 2**20) == "1.5 MiB"
