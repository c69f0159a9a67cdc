"""Numbers with their noise (lmperf.core.stats): medians over trials with 95% intervals, and
verdicts only beyond the noise."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from lmperf.core import stats
from lmperf.core.stats import Estimate


def test_an_estimates_interval_by_the_number_of_trials(fresh_seed):
    rng = random.Random(fresh_seed)
    assert stats.estimate([3.0, float("nan"), None]) == Estimate(3.0)  # one finite trial: no interval
    three = [rng.uniform(1, 2) for _ in range(3)]
    logs = [math.log(v) for v in three]  # Student's t (2 degrees of freedom: 4.303) on the log times
    half = 4.303 * statistics.stdev(logs) / math.sqrt(3)
    low, high = math.exp(statistics.mean(logs) - half), math.exp(statistics.mean(logs) + half)
    est = stats.estimate(three)
    assert (est.median, est.trials, est.method) == (statistics.median(three), 3, "t")
    assert (est.low, est.high) == pytest.approx((low, high)) and est.low < min(three) and est.high > max(three)
    values = [rng.gauss(10, 1) for _ in range(9)]
    est = stats.estimate(values, seed=fresh_seed)
    assert (est.trials, est.method, est.median) == (9, "bootstrap", statistics.median(values))
    assert min(values) <= est.low <= est.median <= est.high <= max(values)
    assert stats.estimate([5.0] * 6) == Estimate(5.0, 5.0, 5.0, 6, "bootstrap")
    with pytest.raises(ValueError, match="no finite values"):
        stats.estimate([float("inf")])


def test_the_bootstrap_interval_covers_the_true_median_about_95_percent_of_the_time():
    """Against the distribution itself: 100 draws of 11 trials from N(0, 1), whose median is 0."""
    rng = random.Random(1)
    covered = sum(
        est.low <= 0 <= est.high
        for est in (stats.estimate([rng.gauss(0, 1) for _ in range(11)], i) for i in range(100))
    )
    assert 85 <= covered <= 100


def test_summary_and_metric_round_trip_through_a_record():
    summary = stats.summary([1.0, 2.0, 4.0])
    low, high = summary.pop("interval")
    assert summary == {"median": 2.0, "trials": 3, "method": "t"}
    record = {"metrics": {"step_ms": 2.0, "step_ms_interval": [low, high], "trials": [{}, {}, {}], "single": 7.0}}
    assert stats.metric(record, "step_ms") == Estimate(2.0, low, high, 3, "t")
    assert stats.metric(record, "single") == Estimate(7.0, trials=3) and stats.metric(record, "absent") is None


def test_format_width_and_instability():
    est = Estimate(56.2, 55.9, 56.6, 5, "bootstrap")
    assert est.format(1, "ms") == "56.2 ms [55.9, 56.6]" and Estimate(3.0).format(2) == "3.00"
    assert est.width == pytest.approx(0.7 / 56.2) and not est.unstable
    assert Estimate(10.0, 9.0, 11.0, 5).unstable and Estimate(10.0).width is None


def test_a_ratios_interval_takes_the_ends_of_both():
    r = stats.ratio(Estimate(10.0, 9.0, 12.0, 5), Estimate(5.0, 4.0, 6.0, 3))
    assert (r.median, r.low, r.high, r.trials) == (2.0, 9.0 / 6.0, 12.0 / 4.0, 3)
    assert stats.ratio(Estimate(10.0), Estimate(5.0, 4.0, 6.0, 3)).low is None


@pytest.mark.parametrize(
    "a, b, verdict",
    [
        (Estimate(90.0, 89.0, 91.0, 5), Estimate(100.0, 99.0, 101.0, 5), "faster"),
        (Estimate(110.0, 109.0, 111.0, 5), Estimate(100.0, 99.0, 101.0, 5), "slower"),
        (Estimate(90.0, 80.0, 100.0, 5), Estimate(100.0, 99.0, 101.0, 5), "within noise"),  # interval reaches 1
        (Estimate(98.0, 97.9, 98.1, 5), Estimate(100.0, 99.9, 100.1, 5), "within noise"),  # inside the margin
        (Estimate(96.0), Estimate(100.0), "within noise"),  # single trials: twice the margin
        (Estimate(93.0), Estimate(100.0), "faster"),
    ],
)
def test_a_verdict_only_beyond_the_noise(a, b, verdict):
    assert stats.compare(a, b) == verdict
