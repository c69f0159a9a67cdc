"""The markdown tables: intervals and the unstable mark, out-of-memory cells, the within-noise mark."""

from __future__ import annotations

from lmperf.core.stats import UNSTABLE_WIDTH
from lmperf.kinds.attention import compiled, facts, tables

from .report_records import plain_oom, record


def test_a_time_with_an_interval_shows_it_and_is_marked_unstable_only_when_wide():
    narrow = (56.0 * (1 - UNSTABLE_WIDTH / 4), 56.0 * (1 + UNSTABLE_WIDTH / 4))
    wide = (56.0 * (1 - UNSTABLE_WIDTH), 56.0 * (1 + UNSTABLE_WIDTH))
    df = facts.frame(
        [
            record("plain", 16, 1024, fwd=56.0, fwd_interval=narrow, trials=3),
            record("plain", 16, 4096, fwd=56.0, fwd_interval=wide, trials=3),
        ]
    )
    cells = list(tables.time_table(df, "plain")["d = 16 (ms)"])
    assert cells[0] == "56.0 [54.6, 57.4] / 2.00" and tables.UNSTABLE_MARK not in cells[0]
    assert cells[1] == f"56.0 [50.4, 61.6]{tables.UNSTABLE_MARK} / 2.00"
    # one trial: the value alone
    single = facts.frame([record("plain", 16, 1024, fwd=0.2724)])
    assert list(tables.time_table(single, "plain")["d = 16 (ms)"]) == ["0.272 / 2.00"]


def test_out_of_memory_cells_say_so_with_the_predicted_need():
    df = facts.frame([record("plain", 16, 16384), plain_oom(16, 32768)])
    assert list(tables.time_table(df, "plain")["d = 16 (ms)"])[1] == "OOM (forward warm-up)"
    assert list(tables.memory_table(df, "plain")["d = 16 (MiB)"]) == ["24,617", "OOM (98,386 predicted)"]
    # a forward that ran, then a backward that ran out: the forward's time stays
    partial = facts.frame([record("compiled", 16, 32768, "oom", fwd=77.9, bwd=None, oom_phase="backward warm-up")])
    assert list(tables.time_table(partial, "compiled")["d = 16 (ms)"]) == ["77.9 / OOM (backward warm-up)"]


def test_within_noise_speedups_are_marked_and_uncompared_lengths_left_out():
    records = [record("plain", 16, n, fwd=ms) for n, ms in ((1024, 1.02), (4096, 2.0))]
    records += [record("compiled", 16, n, fwd=1.0) for n in (1024, 4096)]
    records += [plain_oom(16, 32768), record("compiled", 16, 32768, fwd=9.0)]
    table = tables.compile_table(compiled.compile_frame(facts.frame(records)))
    assert list(table.N) == ["1024", "4096"]
    assert list(table["d = 16 (speed-up)"]) == [
        f"{tables.SAME_MARK}1.02× / {tables.SAME_MARK}1.00×",
        f"2.00× / {tables.SAME_MARK}1.00×",
    ]


def test_numbers_keep_three_significant_digits():
    assert [tables.sig(x) for x in (0.08031, 0.6328, 39.16, 1703.2, 24681.0)] == [
        "0.0803",
        "0.633",
        "39.2",
        "1,703",
        "24,681",
    ]
    assert tables.human_bytes(32 * 2**30) == "32 GiB" and tables.human_bytes(1.5 * 2**20) == "1.5 MiB"
