"""The ladder's facts: rungs read as data, the waterfall adds up, verdicts flip only beyond the noise,
MFU yardsticks read from whatever the records name."""

from __future__ import annotations

import random

import pytest

from lmperf.kinds.ladder import facts, tables

from .ladder_synth import rung, us_per_token


def ladder_of(records):
    (ladder,) = facts.ladders_from(records)
    return ladder


def test_the_waterfall_follows_the_parents_and_its_parts_add_up(fresh_seed):
    rng = random.Random(fresh_seed)
    base, tf32 = rng.uniform(300, 400), rng.uniform(150, 200)
    slower_bf16 = tf32 * rng.uniform(1.2, 1.5)  # not built on: the next rung takes tf32
    comp = tf32 * rng.uniform(0.4, 0.6)
    big = comp * 2 * rng.uniform(0.6, 0.8)  # batch 8: two steps' tokens in less than twice the time
    records = [
        rung("baseline", 0, None, base),
        rung("tf32", 1, "baseline", tf32),
        rung("bf16", 2, "tf32", slower_bf16),
        rung("compile", 3, "tf32", comp),
        rung("max_batch", 4, "compile", big, batch=8),
        rung("grad_accum", 5, "max_batch", None, status="oom"),
    ]
    ladder = ladder_of(records)
    assert ladder.start.name == "baseline" and ladder.best.name == "max_batch" and ladder.baseline_fits
    assert [(s.parent, s.rung) for s in ladder.chain] == [
        ("baseline", "tf32"),
        ("tf32", "compile"),
        ("compile", "max_batch"),
    ]
    assert [(s.rung, s.verdict) for s in ladder.not_kept] == [("bf16", "slower")]
    assert [r.name for r in ladder.failed] == ["grad_accum"]
    total = us_per_token(base) - us_per_token(big, batch=8)
    assert sum(s.saved_us for s in ladder.chain) == pytest.approx(total)
    assert ladder.total_saved_us == pytest.approx(total)
    assert ladder.speedup.median == pytest.approx(us_per_token(base) / us_per_token(big, batch=8))


def test_rounded_parts_add_up_to_the_rounded_total(fresh_seed):
    rng = random.Random(fresh_seed)
    for _ in range(200):
        parts = [rng.uniform(-5, 50) for _ in range(rng.randint(1, 9))]
        digits = rng.choice([0, 1, 2])
        shown = facts.round_parts(parts, digits)
        assert round(sum(shown), digits) == round(sum(parts), digits)
        assert all(abs(a - b) < 10.0**-digits + 1e-9 for a, b in zip(shown, parts))


@pytest.mark.parametrize(
    ("child", "interval", "trials", "verdict"),
    [
        (100 / 1.3, (76.0, 78.0), 5, "faster"),  # 1.3x faster, tight intervals
        (100 / 1.3, (70.0, 101.0), 5, "within noise"),  # the same speed-up, intervals that overlap
        (100 * 1.3, (129.0, 131.0), 5, "slower"),
        (95.0, None, 1, "within noise"),  # one trial: 5% is inside twice the margin
        (90.0, None, 1, "faster"),  # one trial: 10% is outside it
    ],
)
def test_a_rung_against_its_parent_is_a_verdict_only_beyond_the_noise(child, interval, trials, verdict):
    parent_interval = (99.0, 101.0) if interval else None
    records = [
        rung("baseline", 0, None, 100.0, interval=parent_interval, trials=trials),
        rung("tf32", 1, "baseline", child, interval=interval, trials=trials),
    ]
    ladder = ladder_of(records)
    (step,) = ladder.chain or ladder.not_kept
    assert step.verdict == verdict


def test_where_the_baseline_does_not_fit_the_waterfall_starts_at_the_first_rung_that_runs():
    records = [
        rung("baseline", 0, None, None, status="oom"),
        rung("bf16", 1, "baseline", None, status="oom"),
        rung("sdpa_flash", 2, "bf16", 400.0),
        rung("compile", 3, "sdpa_flash", 300.0),
    ]
    ladder = ladder_of(records)
    assert not ladder.baseline_fits and ladder.start.name == "sdpa_flash" and ladder.best.name == "compile"
    records[0] = rung("baseline", 0, None, 800.0)
    records[1] = rung("bf16", 1, "baseline", 500.0)
    ladder = ladder_of(records)
    assert ladder.baseline_fits and ladder.start.name == "baseline"


def test_rungs_are_data_unknown_ones_shown_by_name_in_their_order():
    records = [
        rung("cuda_graphs", 9, "fp8_rowwise", 40.0),
        rung("baseline", 0, None, 100.0),
        rung("fp8_rowwise", 8, "baseline", 60.0),
    ]
    ladder = ladder_of(records)
    assert [r.name for r in ladder.rungs] == ["baseline", "fp8_rowwise", "cuda_graphs"]
    assert ladder.best.name == "cuda_graphs" and [s.rung for s in ladder.chain] == ["fp8_rowwise", "cuda_graphs"]
    pivot = tables.pivot_table([ladder], 1024, None)
    assert list(pivot["rung"]) == ["`baseline`", "`fp8_rowwise`", "`cuda_graphs`"]
    # a record without rung_index falls back to the grid's order, then to the end
    del records[2]["metrics"]["rung_index"]
    assert [r.name for r in ladder_of(records).rungs][-1] == "fp8_rowwise"
    (ladder,) = facts.ladders_from(records, order=["baseline", "fp8_rowwise", "cuda_graphs"])
    assert ladder.rungs[1].index == 1.0


@pytest.mark.parametrize(
    ("key", "ceiling", "precision", "alternative", "words"),
    [
        ("mfu_datasheet_bf16", "datasheet", "bf16", False, "the bf16 datasheet peak"),
        ("mfu_measured_bf16", "measured", "bf16", False, "the measured bf16 GEMM ceiling"),
        ("mfu_datasheet_fp8", "datasheet", "fp8", False, "the fp8 datasheet peak"),
        ("mfu_measured_ceiling", "measured", None, False, "the measured rung's own precision GEMM ceiling"),
        ("mfu_datasheet_bf16_causal_half", "datasheet", "bf16", True, "the bf16 datasheet peak"),
        ("mfu", None, None, False, "the peak the record names (`mfu`)"),
        ("mfu_roofline_x", "other", None, False, "`mfu_roofline_x`"),
    ],
)
def test_yardsticks_are_read_from_the_metric_names(key, ceiling, precision, alternative, words):
    y = facts.parse_yardstick(key)
    assert (y.ceiling, y.precision, y.alternative, y.words) == (ceiling, precision, alternative, words)


def test_the_headline_yardstick_is_the_datasheet_where_the_records_have_it_else_the_measured_ceiling():
    both = {"mfu_datasheet_bf16": 0.4, "mfu_measured_bf16": 0.5, "mfu_datasheet_bf16_causal_half": 0.38}
    ladder = ladder_of([rung("baseline", 0, None, 100.0, mfu=both)])
    head = facts.headline(ladder.rungs)
    assert head.key == "mfu_datasheet_bf16"
    assert facts.alternative_of(head, ladder.rungs).key == "mfu_datasheet_bf16_causal_half"
    # a CPU: the datasheet MFU is absent (None in the record), the measured ceiling heads
    cpu = ladder_of([rung("baseline", 0, None, 100.0, mfu={"mfu_datasheet_bf16": None, "mfu_measured_bf16": 0.3})])
    assert facts.headline(cpu.rungs).key == "mfu_measured_bf16"
    assert facts.alternative_of(facts.headline(cpu.rungs), cpu.rungs) is None
    # only a rung's-own-precision MFU: that one
    own = ladder_of([rung("baseline", 0, None, 100.0, mfu={"mfu_datasheet": 0.2})])
    assert facts.headline(own.rungs).key == "mfu_datasheet"


def test_an_fp8_rung_gets_its_fp8_column_beside_the_bf16_equivalent():
    fp8 = {"mfu_datasheet_bf16": 0.6, "mfu_measured_bf16": 0.7, "mfu_datasheet_fp8": 0.3}
    records = [
        rung("baseline", 0, None, 100.0, mfu={"mfu_datasheet_bf16": 0.3, "mfu_measured_bf16": 0.35}),
        rung("fp8_tensorwise", 1, "baseline", 50.0, mfu=fp8),
    ]
    ladder = ladder_of(records)
    head = facts.headline(ladder.rungs)
    table = tables.sizes_table([ladder], head)
    assert table["MFU bf16 datasheet (%)"].iloc[0] == "60.0%"
    assert table["MFU fp8 datasheet (%)"].iloc[0] == "30.0%"
    assert "mfu_datasheet_fp8" in tables.rung_frame([ladder]).columns


def test_the_answer_counts_largest_gains_and_names_the_longest_compile():
    def ladder(model, gain_rung):
        records = [
            rung("baseline", 0, None, 100.0, model=model),
            rung("compile", 1, "baseline", 50.0 if gain_rung == "compile" else 90.0, model=model, compile_s=7.5),
            rung(
                "max_batch",
                2,
                "compile",
                170.0 if gain_rung == "compile" else 80.0,
                model=model,
                batch=8,
                compile_s=1.0,
            ),
        ]
        return records

    records = ladder("small", "compile") + ladder("medium", "compile") + ladder("large", "max_batch")
    records[4]["metrics"]["compile_s"] = 9.0  # medium's compile rung
    ladders = facts.ladders_from(records)
    a = facts.answer_facts(ladders, None)
    assert a.gains == (("compile", 2), ("max_batch", 1))
    assert (a.longest_compile.model, a.longest_compile.name, a.longest_compile.compile_s) == ("medium", "compile", 9.0)
    # compile is best where max_batch runs slower per token (2×); max_batch best in large (2.5×)
    assert a.slowest.speedup.median == pytest.approx(2.0) and a.fastest.model == "large" and a.ran == 3


@pytest.mark.parametrize(("bf16_ms", "verdict"), [(1000.0, "slower"), (101.0, "within noise"), (50.0, "faster")])
def test_a_cpus_bf16_rung_against_its_parent(bf16_ms, verdict):
    records = [
        rung("baseline", 0, None, 100.0, device="cpu", ctx=32),
        rung("bf16", 1, "baseline", bf16_ms, device="cpu", ctx=32),
    ]
    c = facts.cpu_precision(ladder_of(records), {"fp32": 0.2, "bf16": 0.02})
    assert c.verdict == verdict and c.parent == "baseline"
    assert c.speed.median == pytest.approx(100.0 / bf16_ms) and c.gemm_bf16_over_fp32 == pytest.approx(0.1)


def test_a_wide_interval_is_marked_unstable_and_one_trial_is_not():
    wide = ladder_of([rung("baseline", 0, None, 100.0, interval=(80.0, 125.0), trials=5)])
    narrow = ladder_of([rung("baseline", 0, None, 100.0)])
    assert tables.est(wide.best.step_ms, "ms") == "100 ms [80, 125] †"
    assert tables.est(narrow.best.step_ms, "ms") == "100 ms"


def test_a_record_from_before_the_step_statistic_is_timed_by_its_mean():
    record = rung("baseline", 0, None, 10.0)
    del record["metrics"]["step_statistic"]
    record["metrics"]["step_ms_mean"] = 12.0
    assert ladder_of([record]).best.step_ms.median == 12.0
