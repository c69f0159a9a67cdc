"""Facts of flash_benchmarking: how much faster our kernels (`flash_triton`) run than PyTorch's unfused
attention (`plain`, the baseline) and than SDPA, per precision, head dimension and length band;
where each runs out of memory; what was not measured; what the float32 rows multiplied in.

A speed-up is the other implementation's time over ours. Over several shapes it is the geometric
mean of the per-shape speed-ups (the ratio of the geometric means of the times), its interval from
the times' intervals where the records have trials; a verdict comes from ``stats.compare`` only.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from lmperf.core import stats
from lmperf.core.stats import Estimate
from lmperf.kinds.flash.frames import PASSES, PRECISION_ORDER
from lmperf.kinds.flash.products import record_products, sdpa_products

OURS = "flash_triton"
BASELINES = ("plain", "sdpa")
# length bands (upper ends, inclusive): the sub-millisecond cells, the middle, the long ones
BAND_ENDS = (1024, 8192, math.inf)


@dataclasses.dataclass(frozen=True)
class Cell:
    precision: str
    implementation: str
    head_dim: int
    length: int
    status: str
    reason: str | None
    time: dict[str, Estimate | None]  # pass -> median over trials (with its interval)


@dataclasses.dataclass(frozen=True)
class Speedup:
    """The baseline's time over ours over some shapes (head_dim/band None: all of them)."""

    precision: str
    baseline: str
    pass_: str
    head_dim: int | None
    band: str | None
    value: Estimate
    shapes: int
    verdict: str  # ours "faster" / "slower" than the baseline, or "within noise"
    unstable: bool  # a time of the shapes has an interval wider than the unstable width


@dataclasses.dataclass(frozen=True)
class Products:
    """What one float32-input precision's rows multiplied in (PRODUCT_LABELS values)."""

    precision: str
    ours: tuple[str, ...]
    plain: str  # "IEEE" | "TF32"
    sdpa: str | None


@dataclasses.dataclass(frozen=True)
class BenchFacts:
    records: int
    precisions: tuple[str, ...]
    head_dims: tuple[int, ...]
    bands: tuple[str, ...]
    speedups: tuple[Speedup, ...]
    shape_verdicts: tuple[tuple[str, str, int, int, int], ...]  # precision, baseline, faster, slower, within
    oom_from: tuple[tuple[str, str, int, int], ...]  # precision, implementation, head dim, first N out of memory
    ours_longest: tuple[tuple[str, int, int], ...]  # precision, head dim, longest N ours ran
    missing: tuple[tuple[str, str, int, tuple[int, ...]], ...]  # precision, implementation, d, lengths
    unsupported: tuple[tuple[str, tuple[str, ...]], ...]  # reason, the implementations it stopped
    backends: tuple[tuple[str, str], ...]  # precision, sdpa backend
    products: tuple[Products, ...]
    settings: dict

    def speedup(self, precision, baseline, pass_="forward_backward", head_dim=None, band=None) -> Speedup | None:
        for s in self.speedups:
            if (s.precision, s.baseline, s.pass_, s.head_dim, s.band) == (precision, baseline, pass_, head_dim, band):
                return s
        return None


def cells(records: list[dict]) -> list[Cell]:
    return [
        Cell(
            precision=r["cell"]["precision"],
            implementation=r["cell"]["implementation"],
            head_dim=int(r["cell"]["head_dim"]),
            length=int(r["cell"]["sequence_length"]),
            status=r["status"],
            reason=r.get("reason"),
            time={p: stats.metric(r, f"{p}_ms_median") if r["status"] == "ok" else None for p in PASSES},
        )
        for r in records
    ]


def geomean(estimates: list[Estimate]) -> Estimate:
    """The geometric mean of estimates; its interval the geometric means of their ends (when all have one)."""

    def mean_log(values):
        return math.exp(statistics.fmean(math.log(v) for v in values))

    median = mean_log(e.median for e in estimates)
    trials = min(e.trials for e in estimates)
    if any(e.low is None or e.high is None for e in estimates):
        return Estimate(median, trials=trials)
    return Estimate(median, mean_log(e.low for e in estimates), mean_log(e.high for e in estimates), trials, "range")


def band_label(lengths: list[int], end: float) -> str | None:
    """'N 128–1024' for the lengths of the band ending at ``end``."""
    start = max([0, *(e for e in BAND_ENDS if e < end)])
    mine = sorted(n for n in lengths if start < n <= end)
    if not mine:
        return None
    return f"N {mine[0]}" if len(mine) == 1 else f"N {mine[0]}–{mine[-1]}"


def _bands(lengths: list[int]) -> dict[int, str]:
    """Each length's band label."""
    out = {}
    for end in BAND_ENDS:
        label = band_label(lengths, end)
        start = max([0, *(e for e in BAND_ENDS if e < end)])
        out.update({n: label for n in lengths if start < n <= end})
    return out


def _pairs(all_cells: list[Cell], precision: str, baseline: str) -> list[tuple[Cell, Cell]]:
    """(ours, baseline) for every shape of a precision where both ran."""
    ok = {(c.implementation, c.head_dim, c.length): c for c in all_cells if c.precision == precision}
    return [
        (ours, ok[baseline, d, n])
        for (impl, d, n), ours in sorted(ok.items())
        if impl == OURS and (baseline, d, n) in ok and ours.status == "ok" and ok[baseline, d, n].status == "ok"
    ]


def summarise(pairs, precision, baseline, pass_, head_dim=None, band=None) -> Speedup | None:
    """The speed-up of ours over the baseline for one pass over the given (ours, baseline) pairs."""
    pairs = [(o.time[pass_], b.time[pass_]) for o, b in pairs if o.time[pass_] and b.time[pass_]]
    if not pairs:
        return None
    ours, base = geomean([o for o, _ in pairs]), geomean([b for _, b in pairs])
    unstable = any(e.unstable for pair in pairs for e in pair)
    verdict = stats.compare(ours, base)
    return Speedup(precision, baseline, pass_, head_dim, band, stats.ratio(base, ours), len(pairs), verdict, unstable)


def _speedups(all_cells: list[Cell], precision: str, baseline: str, band_of: dict[int, str]) -> list[Speedup]:
    pairs = _pairs(all_cells, precision, baseline)
    out = [summarise(pairs, precision, baseline, p) for p in PASSES]
    bands = list(dict.fromkeys(band_of[o.length] for o, _ in sorted(pairs, key=lambda pair: pair[0].length)))
    for d in [None, *sorted({o.head_dim for o, _ in pairs})]:
        for band in bands:
            mine = [(o, b) for o, b in pairs if d in (None, o.head_dim) and band_of[o.length] == band]
            out.append(summarise(mine, precision, baseline, "forward_backward", d, band))
    return [s for s in out if s is not None]


def _shape_verdicts(all_cells, precision, baseline) -> tuple[str, str, int, int, int]:
    found = [
        stats.compare(o.time["forward_backward"], b.time["forward_backward"])
        for o, b in _pairs(all_cells, precision, baseline)
        if o.time["forward_backward"] and b.time["forward_backward"]
    ]
    return precision, baseline, found.count("faster"), found.count("slower"), found.count("within noise")


def _oom_from(all_cells: list[Cell]) -> list[tuple[str, str, int, int]]:
    first: dict[tuple[str, str, int], int] = {}
    for c in all_cells:
        if c.status == "oom":
            key = (c.precision, c.implementation, c.head_dim)
            first[key] = min(first.get(key, c.length), c.length)
    return [(*key, n) for key, n in sorted(first.items(), key=lambda kv: _order(kv[0][0]) + kv[0][1:])]


def _ours_longest(all_cells: list[Cell]) -> list[tuple[str, int, int]]:
    longest: dict[tuple[str, int], int] = {}
    for c in all_cells:
        if c.implementation == OURS and c.status == "ok":
            longest[c.precision, c.head_dim] = max(longest.get((c.precision, c.head_dim), 0), c.length)
    return [(p, d, n) for (p, d), n in sorted(longest.items(), key=lambda kv: _order(kv[0][0]) + (kv[0][1],))]


def planned(records: list[dict], grid: dict | None = None) -> set[tuple[str, str, int, int]]:
    """(precision, implementation, head dim, N) of every cell the records' settings and the grid ask for."""
    asked = [(r["provenance"].get("settings") or {}) | {"precisions": [r["cell"]["precision"]]} for r in records]
    if grid:
        asked.append(grid)
    return {
        (p, impl, int(d), int(n))
        for s in asked
        for p in s.get("precisions") or []
        for impl in s.get("implementations") or []
        for d in s.get("head_dims") or []
        for n in s.get("sequence_lengths") or []
    }


def _missing(all_cells: list[Cell], want: set) -> list[tuple[str, str, int, tuple[int, ...]]]:
    """Cells with no record (not measured): those asked for, and every (d, N) another implementation of the
    same precision has."""
    have = {(c.precision, c.implementation, c.head_dim, c.length) for c in all_cells}
    shapes = {(c.precision, c.head_dim, c.length) for c in all_cells}
    impls = {(c.precision, c.implementation) for c in all_cells}
    want = want | {(p, i, d, n) for p, i in impls for q, d, n in shapes if q == p}
    gaps: dict[tuple[str, str, int], list[int]] = {}
    for p, i, d, n in sorted(want - have):
        gaps.setdefault((p, i, d), []).append(n)
    return [(*key, tuple(ns)) for key, ns in sorted(gaps.items(), key=lambda kv: _order(kv[0][0]) + kv[0][1:])]


def _unsupported(all_cells: list[Cell]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    by: dict[str, list[str]] = {}
    for c in all_cells:
        if c.status == "unsupported" and c.implementation not in by.setdefault(c.reason or "", []):
            by[c.reason or ""].append(c.implementation)
    return tuple((reason, tuple(impls)) for reason, impls in by.items() if impls)


def _order(precision: str) -> tuple[int]:
    return (PRECISION_ORDER.get(precision, 9),)


def _products(records: list[dict], precision: str) -> Products | None:
    """What the rows of a float32-input precision multiplied in; None for 16-bit precisions."""
    if precision not in ("fp32", "tf32"):
        return None
    mine = [r for r in records if r["cell"]["precision"] == precision]
    ours = [r for r in mine if r["cell"]["implementation"] == OURS]
    plain = [r for r in mine if r["cell"]["implementation"] == "plain"]
    found = sorted({p[0] for p in map(record_products, ours) if p})
    if precision == "tf32":
        found = found or (["TF32"] if ours else [])
    # tf32 cells time every implementation with TF32 matmuls allowed; fp32 ones with them off, unless the
    # process had them on (old records)
    tf32 = precision == "tf32" or any(r["provenance"].get("matmul_allow_tf32") for r in plain)
    return Products(
        precision=precision, ours=tuple(found), plain="TF32" if tf32 else "IEEE", sdpa=sdpa_products(mine, "sdpa")
    )


def _settings(records: list[dict]) -> dict:
    ok = [r for r in records if r["status"] == "ok"] or records
    s = ok[0]["provenance"].get("settings") or {} if ok else {}
    sources: dict[str, int] = {}
    for r in records:
        for choice in ((r["metrics"].get("tiles") or {}) if r["cell"]["implementation"] == OURS else {}).values():
            if isinstance(choice, dict) and choice.get("source"):
                sources[choice["source"]] = sources.get(choice["source"], 0) + 1
    keys = ("warmup_ms", "rep_ms", "batch_size", "causal")
    return {k: s.get(k) for k in keys} | {"tile_sources": sources}


def bench_facts(records: list[dict], grid: dict | None = None) -> BenchFacts:
    """The facts of flash_benchmarking from its records (and the grid's cells, to tell what is missing)."""
    all_cells = cells(records)
    precisions = sorted({c.precision for c in all_cells}, key=lambda p: _order(p))
    band_of = _bands(sorted({c.length for c in all_cells}))
    present = [b for b in BASELINES if any(c.implementation == b for c in all_cells)]
    backends = {(r["cell"]["precision"], (r["provenance"].get("settings") or {}).get("sdpa_backend")) for r in records}
    return BenchFacts(
        records=len(records),
        precisions=tuple(precisions),
        head_dims=tuple(sorted({c.head_dim for c in all_cells})),
        bands=tuple(dict.fromkeys(band_of[n] for n in sorted(band_of))),
        speedups=tuple(s for p in precisions for b in present for s in _speedups(all_cells, p, b, band_of)),
        shape_verdicts=tuple(_shape_verdicts(all_cells, p, b) for p in precisions for b in present),
        oom_from=tuple(_oom_from(all_cells)),
        ours_longest=tuple(_ours_longest(all_cells)),
        missing=tuple(_missing(all_cells, planned(records, grid))),
        unsupported=_unsupported(all_cells),
        backends=tuple(sorted((p, b) for p, b in backends if b)),
        products=tuple(x for x in (_products(records, p) for p in precisions) if x),
        settings=_settings(records),
    )
