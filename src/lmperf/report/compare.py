"""One kind's cells on two devices: what every kind's ``compare.py`` shares (no torch).

``compare_kind`` gives a ``Comparison``: the median over the shared cells of the per-cell ratio (other
/ reference: under 1, the other device takes less time) with its 95% interval, and the kind's verdict,
evidence and table. A device is faster or slower only beyond the noise (``side``).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable, Iterable

import pandas as pd

from lmperf.core import stats
from lmperf.core.stats import Estimate

# A cell is host-bound when the next cell with at least twice its length (all else equal) takes under
# this many times its time: the work at least doubled and the time hardly moved.
LAUNCH_BOUND_GROWTH = 1.3


@dataclasses.dataclass(frozen=True)
class Comparison:
    kind: str
    devices: tuple[str, ...]  # (reference, other); () when fewer than two devices have records
    what: str  # what the ratio compares, e.g. "training step time"
    ratio: Estimate | None  # other / reference, median over the shared cells
    interval: str  # how the ratio's interval was made
    cells: int  # shared cells in the ratio
    verdict: str
    evidence: str
    table: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)


@dataclasses.dataclass(frozen=True)
class Pair:
    key: str
    cell: dict
    ref: Estimate
    other: Estimate

    @property
    def ratio(self) -> Estimate:
        return stats.ratio(self.other, self.ref)


@dataclasses.dataclass(frozen=True)
class Shared:
    """What a kind's judge gets: devices, their records by cell key, the shared cells, the ratio, all records."""

    ref: str
    other: str
    a: dict[str, dict]
    b: dict[str, dict]
    cells: list[Pair]
    ratio: Estimate
    records: dict[str, list[dict]]


def attention_of(record: dict) -> str:
    return (record.get("provenance") or {}).get("settings", {}).get("attention", "plain")


def compared_cell(record: dict) -> str:
    """A record's cell as one key, with the attention its settings name where it is not ``plain``."""
    attention = attention_of(record)
    return json.dumps(record["cell"] | ({"attention": attention} if attention != "plain" else {}), sort_keys=True)


def by_cell(records: Iterable[dict], kinds: tuple[str, ...]) -> dict[str, dict]:
    return {compared_cell(r): r for r in records if r["kind"] in kinds}


def time_of(record: dict | None, names: tuple[str, ...]) -> Estimate | None:
    """The first of ``names`` an ``ok`` record holds, as an Estimate."""
    if record is None or record.get("status") != "ok":
        return None
    return next((e for e in (stats.metric(record, n) for n in names) if e is not None and e.median > 0), None)


def pairs(ref: dict[str, dict], other: dict[str, dict], value: Callable[[dict], Estimate | None]) -> list[Pair]:
    found = ((key, value(ref[key]), value(other[key])) for key in sorted(set(ref) & set(other), key=natural))
    return [Pair(key, json.loads(key), a, b) for key, a, b in found if a is not None and b is not None]


def natural(key: str) -> tuple:
    cell = json.loads(key)
    return tuple((k, 0, v, "") if isinstance(v, (int, float)) else (k, 1, 0, str(v)) for k, v in sorted(cell.items()))


def compare_kind(records, kind, what, value, judge, noun=None, none=None, select=None) -> Comparison:
    """``kind`` on the first two devices of ``records`` that have some (the first is the reference): the
    median ratio of ``value`` over the shared cells, and ``judge(Shared)`` -> (verdict, evidence[, table rows]).
    ``select`` gives a device's records by cell key (default: those of ``kind``)."""
    present = [d for d, recs in records.items() if recs]
    if len(present) < 2:
        return not_compared(kind, what, tuple(records), f"fewer than two devices have {noun or kind} records")
    devices = ref, other = present[0], present[1]
    a, b = ((select or (lambda rs: by_cell(rs, (kind,))))(records[d]) for d in devices)
    cells = pairs(a, b, value)
    if not cells:
        return not_compared(kind, what, devices, none or f"no {kind} cell was measured on both devices")
    ratio, how = median_ratio([p.ratio for p in cells])
    verdict, evidence, *table = judge(Shared(ref, other, a, b, cells, ratio, records))
    return Comparison(kind, devices, what, ratio, how, len(cells), verdict, evidence, pd.DataFrame(*table))


def median_ratio(ratios: list[Estimate]) -> tuple[Estimate | None, str]:
    """The median of per-cell ratios, its interval (the medians of the cells' interval ends where every
    cell has one, else a bootstrap over the cells), and how the interval was made."""
    if not ratios:
        return None, "no shared cells"
    medians = [r.median for r in ratios]
    if all(r.low is not None and r.high is not None for r in ratios):
        low, high = statistics.median(r.low for r in ratios), statistics.median(r.high for r in ratios)
        est = Estimate(statistics.median(medians), low, high, min(r.trials for r in ratios), "range")
        return est, "the cells' trial intervals"
    est = stats.estimate(medians, few="range")
    return est, {"bootstrap": "bootstrap over cells", "range": "range over cells", "single": "one cell"}[est.method]


def ratio_of(cells: list[Pair]) -> Estimate | None:
    return median_ratio([p.ratio for p in cells])[0]


def side(ratio: Estimate, margin: float = stats.SAME_MARGIN) -> str:
    """``faster`` / ``slower`` (the other device, beyond the noise) or ``within noise``."""
    return stats.compare(ratio, Estimate(1.0, 1.0, 1.0), margin)  # 1 with an interval: the ratio keeps its own


def speed(other: str, ratio: Estimate | None) -> str:
    """'`h200` faster (0.87×)', '`h200` slower (1.30×)' or 'level (1.01×)', by ``side``."""
    if ratio is None:
        return "not measured"
    verdict = side(ratio)
    return f"level ({ratio.median:.2f}×)" if verdict == "within noise" else f"`{other}` {verdict} ({ratio.median:.2f}×)"


def host_bound(times: dict[str, float], axis: str, growth: float = LAUNCH_BOUND_GROWTH) -> dict[str, bool]:
    """Per cell key of one device's ``times``: True (host-bound) when the next cell with at least twice its
    ``axis`` value takes under ``growth`` times as long; False when longer, or for the last cell when its
    time grew by ``growth`` from the one before. Untested cells are absent."""
    series: dict[str, list[tuple[float, str]]] = {}
    for key in times:
        cell = json.loads(key)
        rest = json.dumps({k: v for k, v in cell.items() if k != axis}, sort_keys=True)
        series.setdefault(rest, []).append((float(cell[axis]), key))
    tested: dict[str, bool] = {}
    for points in series.values():
        points.sort()
        for (n, key), (m, longer) in zip(points, points[1:]):
            if m >= 2 * n:
                tested[key] = times[longer] / times[key] < growth
        if len(points) > 1:  # the last cell has no longer one: tested against the one before
            (n, shorter), (m, last) = points[-2], points[-1]
            if m >= 2 * n and times[last] / times[shorter] >= growth:
                tested[last] = False
    return tested


def split_by_host(cells: list[Pair], ref_test: dict[str, bool], other_test: dict[str, bool]) -> dict[str, list[Pair]]:
    """``host`` (host-bound on either device), ``gpu`` (tested on both, bound on neither), ``untested``."""
    groups: dict[str, list[Pair]] = {"host": [], "gpu": [], "untested": []}
    for p in cells:
        if ref_test.get(p.key) or other_test.get(p.key):
            groups["host"].append(p)
        elif p.key in ref_test and p.key in other_test:
            groups["gpu"].append(p)
        else:
            groups["untested"].append(p)
    return groups


def bound_verdict(other: str, host: Estimate | None, gpu: Estimate | None) -> str:
    """The verdict from the ratios on host-bound and GPU-bound cells, each judged by ``side``."""
    h, g = (None if ratio is None else side(ratio) for ratio in (host, gpu))
    if h is None and g is None:
        return "no cell could be tested for what bounds it"
    if h in (None, "within noise") and g in (None, "within noise"):
        tested = " and ".join(words for words, v in (("host-bound", h), ("GPU-bound", g)) if v)
        return f"{tested} cells level, within the noise"
    if g in (None, "within noise"):
        level = "level where the GPU's work sets the time, " if g else ""
        return f"{level}`{other}` {h} where the host sets it: the hosts' kernel-launch speed"
    if h in (None, "within noise"):
        level = ", level where the host sets it" if h else ""
        return f"`{other}` {g} where the GPU's work sets the time{level}: the GPUs differ"
    if h == g:
        return f"`{other}` {g} on host- and GPU-bound cells alike"
    return f"`{other}` {h} where the host sets the time (kernel-launch speed), {g} where the GPU's work does"


def level_from(groups: list[tuple[float, Estimate]]) -> float | None:
    """The smallest axis value from which every group's ratio is within the noise, where a shorter
    one is not (None: level everywhere, or nowhere from some value on)."""
    groups = sorted(groups, key=lambda g: g[0])
    level = [side(r) == "within noise" for _, r in groups]
    return next((groups[i][0] for i in range(1, len(groups)) if all(level[i:]) and not level[i - 1]), None)


def not_compared(kind: str, what: str, devices: tuple[str, ...], why: str) -> Comparison:
    return Comparison(kind, devices, what, None, "—", 0, f"not compared: {why}", "—")
