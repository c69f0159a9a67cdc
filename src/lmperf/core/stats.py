"""Numbers with their noise: the median over independent trials, its 95% interval (bootstrap from
``BOOTSTRAP_MIN_TRIALS`` trials; below, Student's t on the trials' log times, since the range of three
trials covers the median only 75% of the time), and verdicts only beyond ``SAME_MARGIN``. No torch.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

BOOTSTRAP_MIN_TRIALS = 5
BOOTSTRAP_RESAMPLES = 2000
# Student's t, 97.5th percentile, by degrees of freedom (a standard table): the t interval's multiplier
T_975 = {1: 12.706, 2: 4.303, 3: 3.182}
# two numbers are "the same" when their ratio's interval reaches into 1 ± this
SAME_MARGIN = 0.03
# an estimate whose interval is wider than this share of its median is unstable
UNSTABLE_WIDTH = 0.10


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A median over trials with its interval (``low``/``high`` None: a single trial)."""

    median: float
    low: float | None = None
    high: float | None = None
    trials: int = 1
    method: str = "single"  # bootstrap | t | range (a ratio's or an aggregate's ends) | single

    @property
    def width(self) -> float | None:
        if self.low is None or self.high is None or not self.median:
            return None
        return (self.high - self.low) / abs(self.median)

    @property
    def unstable(self) -> bool:
        width = self.width
        return width is not None and width > UNSTABLE_WIDTH

    def format(self, digits: int = 1, unit: str = "") -> str:
        """``56.2 ms [55.9, 56.6]`` (no brackets for a single trial)."""
        text = f"{self.median:.{digits}f}" + (f" {unit}" if unit else "")
        if self.low is None or self.high is None:
            return text
        return text + f" [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def estimate(values: list[float], seed: int = 0, few: str = "t") -> Estimate:
    """The median of ``values`` (one per trial) with its 95% interval; below ``BOOTSTRAP_MIN_TRIALS``
    values, ``few="range"`` gives their range instead of a t interval (a spread over cells, which are
    not repeated measurements of one number)."""
    values = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not values:
        raise ValueError("no finite values to estimate from")
    median = statistics.median(values)
    if len(values) == 1:
        return Estimate(median)
    if len(values) < BOOTSTRAP_MIN_TRIALS and few == "range":
        return Estimate(median, min(values), max(values), len(values), "range")
    if len(values) < BOOTSTRAP_MIN_TRIALS:
        return t_interval(median, values)
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(BOOTSTRAP_RESAMPLES))
    low = medians[int(0.025 * BOOTSTRAP_RESAMPLES)]
    high = medians[int(0.975 * BOOTSTRAP_RESAMPLES) - 1]
    return Estimate(median, low, high, len(values), "bootstrap")


def t_interval(median: float, values: list[float]) -> Estimate:
    """Student's t 95% interval of the geometric mean of 2-4 positive ``values`` (a time's noise is
    multiplicative), widened to hold the median; the range of non-positive ones."""
    if min(values) <= 0:
        return Estimate(median, min(values), max(values), len(values), "range")
    logs = [math.log(v) for v in values]
    half = T_975[len(values) - 1] * statistics.stdev(logs) / math.sqrt(len(values))
    low, high = math.exp(statistics.mean(logs) - half), math.exp(statistics.mean(logs) + half)
    return Estimate(median, min(low, median), max(high, median), len(values), "t")


def summary(values: list[float], seed: int = 0) -> dict:
    """``{"median": …, "interval": [low, high] | None, "trials": k, "method": …}`` for a record."""
    est = estimate(values, seed)
    interval = None if est.low is None else [est.low, est.high]
    return {"median": est.median, "interval": interval, "trials": est.trials, "method": est.method}


def metric(record: dict, name: str) -> Estimate | None:
    """Metric ``name`` of ``record`` as an Estimate (its ``<name>_interval`` beside it, if any)."""
    metrics = record.get("metrics") or {}
    value = metrics.get(name)
    if value is None:
        return None
    interval = metrics.get(f"{name}_interval")
    trials = len(metrics.get("trials") or []) or 1
    if not interval:
        return Estimate(float(value), trials=trials)
    method = "bootstrap" if trials >= BOOTSTRAP_MIN_TRIALS else "t"
    return Estimate(float(value), float(interval[0]), float(interval[1]), trials, method)


def ratio(numerator: Estimate, denominator: Estimate) -> Estimate:
    """numerator / denominator, its interval from the ends of both (conservative, no independence assumed)."""
    median = numerator.median / denominator.median
    if None in (numerator.low, numerator.high, denominator.low, denominator.high):
        return Estimate(median, trials=min(numerator.trials, denominator.trials))
    low = numerator.low / denominator.high
    high = numerator.high / denominator.low
    return Estimate(median, low, high, min(numerator.trials, denominator.trials), "range")


def compare(a: Estimate, b: Estimate, margin: float = SAME_MARGIN) -> str:
    """``'faster'`` when a is shorter than b beyond the noise, ``'slower'`` when longer, else
    ``'within noise'``; without intervals, beyond twice the margin."""
    r = ratio(a, b)
    low, high = r.low, r.high
    if r.low is None:
        low = high = r.median
        margin *= 2
    if high < 1 - margin:
        return "faster"
    if low > 1 + margin:
        return "slower"
    return "within noise"
