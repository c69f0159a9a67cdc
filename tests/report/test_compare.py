"""The shared machinery of the kinds' cross-device comparisons (lmperf.report.compare)."""

from __future__ import annotations

import json

import pandas as pd

from lmperf.core.stats import Estimate
from lmperf.report import compare as cmp
from lmperf.report.common import md_table, times


def key(**cell) -> str:
    return json.dumps(cell, sort_keys=True)


def test_median_ratio_uses_the_cells_trial_intervals_when_every_cell_has_one():
    with_trials = [Estimate(0.9, 0.88, 0.92, 5, "bootstrap"), Estimate(0.8, 0.7, 0.95, 5, "bootstrap")] * 2
    ratio, how = cmp.median_ratio(with_trials + [Estimate(0.85, 0.8, 0.9, 3, "range")])
    assert how == "the cells' trial intervals"
    assert (ratio.median, ratio.low, ratio.high) == (0.85, 0.8, 0.92)
    ratio, how = cmp.median_ratio(with_trials + [Estimate(0.85)])  # one cell without trials: over cells
    assert how == "bootstrap over cells" and ratio.median == 0.85
    assert cmp.median_ratio([Estimate(1.0), Estimate(1.2)])[1] == "range over cells"
    assert cmp.median_ratio([]) == (None, "no shared cells")


def test_side_is_beyond_the_noise_only():
    assert cmp.side(Estimate(0.9, 0.88, 0.92)) == "faster"
    assert cmp.side(Estimate(0.9, 0.85, 0.98)) == "within noise"  # reaches into 1 ± 3%
    assert cmp.side(Estimate(1.1, 1.05, 1.2)) == "slower"
    assert cmp.side(Estimate(0.95)) == "within noise"  # a single number needs twice the margin
    assert cmp.side(Estimate(0.93)) == "faster"
    assert cmp.speed("h200", Estimate(1.1, 1.05, 1.2)) == "`h200` slower (1.10×)"
    assert cmp.speed("h200", Estimate(0.99, 0.95, 1.02)) == "level (0.99×)"
    assert times(Estimate(0.871, 0.85, 0.9)) == "0.87× [0.85, 0.90]" and times(None) == "—"


def test_host_bound_from_how_the_time_grows_with_the_work():
    times = {
        key(n=1024, d=64): 1.0,
        key(n=2048, d=64): 1.1,  # the work doubled, the time hardly moved: 1024 is host-bound
        key(n=4096, d=64): 4.0,  # 2048 -> 4096 grew 3.6x: 2048 is not
        key(n=16384, d=64): 60.0,  # the longest: grew into it from 4096, so not host-bound
        key(n=1024, d=128): 1.0,
        key(n=1536, d=128): 1.1,  # under twice the length: no test for 1024
        key(n=8192, d=32): 2.0,  # alone: untested
    }
    tested = cmp.host_bound(times, "n")
    assert tested == {
        key(n=1024, d=64): True,
        key(n=2048, d=64): False,
        key(n=4096, d=64): False,
        key(n=16384, d=64): False,
    }
    # the longest cell after a flat step stays untested (its own doubling is unknown)
    assert key(n=2, d=1) not in cmp.host_bound({key(n=1, d=1): 1.0, key(n=2, d=1): 1.05}, "n")


def test_bound_verdict_flips_with_each_groups_side():
    level, slow, fast = Estimate(1.0, 0.99, 1.01), Estimate(1.3, 1.2, 1.4), Estimate(0.8, 0.75, 0.85)
    assert "`h200` slower where the host sets it: the hosts' kernel-launch speed" in cmp.bound_verdict(
        "h200", slow, level
    )
    assert cmp.bound_verdict("h200", level, fast).endswith("level where the host sets it: the GPUs differ")
    assert cmp.bound_verdict("h200", level, level) == "host-bound and GPU-bound cells level, within the noise"
    assert cmp.bound_verdict("h200", level, None) == "host-bound cells level, within the noise"  # none GPU-bound
    assert cmp.bound_verdict("h200", slow, slow) == "`h200` slower on host- and GPU-bound cells alike"
    assert cmp.bound_verdict("h200", slow, fast).startswith("`h200` slower where the host sets the time")
    assert cmp.bound_verdict("h200", None, None).startswith("no cell could be tested")


def test_level_from_the_length_where_the_ratio_stops_changing():
    slow, level = Estimate(1.3, 1.2, 1.4), Estimate(1.0, 0.99, 1.01)
    assert cmp.level_from([(1024, slow), (512, slow), (2048, level), (4096, level)]) == 2048
    assert cmp.level_from([(512, level), (1024, level)]) is None  # level everywhere: no change
    assert cmp.level_from([(512, level), (1024, slow)]) is None


def test_compared_cell_keeps_a_whole_model_cells_attention_apart():
    cell = {"model": "small", "context_length": 128}
    plain = {"cell": cell, "provenance": {"settings": {}}}
    flash = {"cell": cell, "provenance": {"settings": {"attention": "flash"}}}
    assert cmp.compared_cell(plain) != cmp.compared_cell(flash)
    assert json.loads(cmp.compared_cell(flash))["attention"] == "flash"


def test_a_markdown_table_escapes_pipes_aligns_numbers_right_and_marks_what_is_missing():
    text = md_table(pd.DataFrame([{"a": " x|y ", "b": None, "n": 1.5}, {"a": "z", "b": None, "n": None}]))
    assert text.splitlines() == ["| a | b | n |", "| :--- | ---: | ---: |", "| x\\|y | — | 1.50 |", "| z | — | — |"]
    assert md_table(pd.DataFrame()) == "_(no rows)_\n"
