"""The flash_benchmarking section: how much faster ours (``flash``) runs than PyTorch's unfused attention
(``plain``, the baseline) and SDPA per precision, head dim and length band; where each runs out of
memory; what float32 rows multiplied in. A speed-up is the other's time over ours, over several shapes
the geometric mean (its interval from the times' intervals); verdicts come from ``stats.compare`` only.
"""

from __future__ import annotations

import collections
import itertools
import math
import statistics

from lmperf.core import stats
from lmperf.kinds.flash.correctness_report import PRECISION_ORDER
from lmperf.kinds.flash.products import PRODUCT_SENTENCES, PRODUCT_WORDS, SDPA_FP32_WHY, record_products, sdpa_products
from lmperf.report.common import UNSTABLE_MARK, blocks, count, link, listing, md_table, source_line, summary, times

OURS = "flash"
BASELINES = ("plain", "sdpa")
PASSES = ("forward", "backward", "forward_backward")
FB = "forward_backward"
PASS_WORDS = {"forward": "fwd", "backward": "bwd", "forward_backward": "fwd+bwd"}
BAND_ENDS = (1024, 8192, math.inf)  # length bands: the sub-millisecond cells, the middle, the long ones
CSV = "tables/flash_benchmarking.csv"
FIGURE = "figures/flash_speedup.png"


# value: the baseline's time over ours; verdict: ours "faster", "slower" or "within noise"; unstable: a
# time of these shapes has an interval wider than stats.UNSTABLE_WIDTH
Speedup = collections.namedtuple("Speedup", "value shapes verdict unstable")


def geomean(estimates: list[stats.Estimate]) -> stats.Estimate:
    """The geometric mean of estimates; its interval the geometric means of their ends (when all have one)."""
    median, trials = statistics.geometric_mean(e.median for e in estimates), min(e.trials for e in estimates)
    if any(e.low is None for e in estimates):
        return stats.Estimate(median, trials=trials)
    low, high = (statistics.geometric_mean(getattr(e, end) for e in estimates) for end in ("low", "high"))
    return stats.Estimate(median, low, high, trials, "range")


def band_labels(lengths) -> dict[int, str]:
    """Each length's band: 'N 128–1024', 'N 2048–8192', 'N 16384–65536' (the lengths present)."""
    out = {}
    for start, end in itertools.pairwise((0, *BAND_ENDS)):
        mine = sorted(n for n in lengths if start < n <= end)
        out |= {n: f"N {mine[0]}" + (f"–{mine[-1]}" if len(mine) > 1 else "") for n in mine}
    return out


def _speedup(pairs: list[tuple[stats.Estimate, stats.Estimate]]) -> Speedup | None:
    """The baseline's time over ours over (ours, baseline) pairs of times."""
    if not pairs:
        return None
    ours, base = map(geomean, zip(*pairs))
    unstable = any(e.unstable for pair in pairs for e in pair)
    return Speedup(stats.ratio(base, ours), len(pairs), stats.compare(ours, base), unstable)


def _products(records: list[dict], precision: str) -> tuple:
    mine = [r for r in records if r["cell"]["precision"] == precision]
    ours = tuple(sorted({p[0] for r in mine if r["cell"]["implementation"] == OURS and (p := record_products(r))}))
    tf32 = precision == "tf32"  # every implementation's matmuls with TF32 allowed
    return precision, ours or (("TF32",) if tf32 else ()), "TF32" if tf32 else "IEEE", sdpa_products(mine)


class BenchFacts:
    """The facts of flash_benchmarking from its records (cells with no record: the report's header)."""

    def __init__(self, records: list[dict]):
        keys = ("precision", "implementation", "head_dim", "sequence_length")
        by = {tuple(r["cell"][k] for k in keys): r for r in records}
        time = {k: {p: stats.metric(r, f"{p}_ms_median") for p in PASSES} for k, r in by.items() if r["status"] == "ok"}
        self.precisions = tuple(sorted({k[0] for k in by}, key=lambda p: PRECISION_ORDER.get(p, 9)))
        self.head_dims = tuple(sorted({k[2] for k in by}))
        band_of = band_labels(sorted({k[3] for k in by}))
        self.bands = tuple(dict.fromkeys(band_of.values()))
        # ours against each baseline: per pass over all shapes, fwd+bwd per head dim and band, as (precision,
        # baseline, pass, head dim or None, band or None) -> Speedup; baseline -> Counter of the per-shape verdicts
        speedups, verdicts = {}, collections.defaultdict(collections.Counter)
        for p, b in itertools.product(self.precisions, BASELINES):
            ours = {(d, n): t for (q, i, d, n), t in time.items() if (q, i) == (p, OURS)}
            pairs = {k: (t, time[(p, b, *k)]) for k, t in ours.items() if (p, b, *k) in time}
            for x in PASSES:
                speedups[p, b, x, None, None] = _speedup([(o[x], y[x]) for o, y in pairs.values() if o[x] and y[x]])
            both = {k: (o[FB], y[FB]) for k, (o, y) in pairs.items() if o[FB] and y[FB]}
            verdicts[b].update(stats.compare(o, y) for o, y in both.values())
            for d, band in itertools.product((None, *self.head_dims), self.bands):
                mine = [v for (e, n), v in both.items() if d in (None, e) and band_of[n] == band]
                speedups[p, b, FB, d, band] = _speedup(mine)
        self.speedups, self.verdicts = {k: v for k, v in speedups.items() if v is not None}, dict(verdicts)
        # (precision, implementation, d) -> the first N out of memory; reason -> the implementations it stopped
        self.oom_from, self.unsupported = {}, collections.defaultdict(dict)
        for (p, i, d, n), r in sorted(by.items()):
            if r["status"] == "oom":
                self.oom_from.setdefault((p, i, d), n)
            if r["status"] == "unsupported":
                self.unsupported[r["reason"]][i] = None  # an ordered set
        self.longest = max((n for (_, i, _, n) in time if i == OURS), default=None)  # the longest N ours ran
        sdpa = [r for r in records if r["cell"]["implementation"] == "sdpa"]
        self.backends = {r["cell"]["precision"]: r["provenance"]["settings"].get("sdpa_backend") for r in sdpa}
        # (precision, ours' labels, plain's label, sdpa's label or None), float32 inputs only
        self.products = tuple(_products(records, p) for p in self.precisions if p in ("fp32", "tf32"))
        self.settings = next((r for r in records if r["status"] == "ok"), records[0])["provenance"]["settings"]

    def speedup(self, precision, baseline, pass_=FB, head_dim=None, band=None) -> Speedup | None:
        return self.speedups.get((precision, baseline, pass_, head_dim, band))


def cell(s: Speedup | None) -> str:
    """'2.41×', '1.01× (within noise)', '3.2× [2.9, 3.5]†'."""
    if s is None:
        return "—"
    noise = " (within noise)" if s.verdict == "within noise" else ""
    return times(s.value) + (UNSTABLE_MARK if s.unstable else "") + noise


def pass_table(facts: BenchFacts) -> list[dict]:
    """Per precision: ours against each baseline, each pass, over every shape where both ran."""
    rows, shown = [], [b for b in BASELINES if any(k[1] == b for k in facts.speedups)]
    for p in facts.precisions:
        row = {"precision": p}
        for b in shown:
            row |= {f"vs {b} {PASS_WORDS[x]}": cell(facts.speedup(p, b, x)) for x in PASSES}
            row[f"shapes vs {b}"] = str(getattr(facts.speedup(p, b), "shapes", "—"))
        rows.append(row)
    return rows


def band_table(facts: BenchFacts, baseline: str) -> list[dict]:
    """Per precision and head dim: the fwd+bwd speed-up of ours over a baseline in each length band."""
    rows = []
    for p, d in itertools.product(facts.precisions, facts.head_dims):
        found = {band: facts.speedup(p, baseline, head_dim=d, band=band) for band in facts.bands}
        if any(found.values()):
            row = {"precision": p, "d": str(d)} | {band: cell(s) for band, s in found.items()}
            if any(k[1] == baseline for k in facts.oom_from):
                row[f"{baseline} out of memory from N"] = str(facts.oom_from.get((p, baseline, d), "—"))
            rows.append(row)
    return rows


def oom_text(facts: BenchFacts, implementation: str) -> str:
    """'N = 65536 at every precision and head dim', or per length the precisions and head dims."""
    by_n = collections.defaultdict(lambda: collections.defaultdict(list))
    for (p, i, d), n in facts.oom_from.items():
        if i == implementation:
            by_n[n][p].append(d)
    parts = []
    for n, where in sorted(by_n.items()):
        full = [p for p, ds in where.items() if len(ds) == len(facts.head_dims)]
        at = [f"{listing(full)} at every head dim"] if full else []
        at += [f"{p} d = {', '.join(map(str, ds))}" for p, ds in where.items() if p not in full]
        every = len(full) == len(facts.precisions)
        parts.append(f"N = {n} " + ("at every precision and head dim" if every else f"({'; '.join(at)})"))
    return listing(parts)


def answer(facts: BenchFacts) -> str:
    """Ours against plain (verdict counts, the first and last band), where plain runs out of memory, SDPA."""
    plain, sdpa, out = facts.verdicts.get("plain"), facts.verdicts.get("sdpa"), []
    if plain:
        out.append(
            f"Our Triton FlashAttention-2 (`{OURS}`) runs forward+backward faster than PyTorch's unfused attention "
            f"(`plain`) in {plain['faster']} of the {plain.total()} shapes where both ran ({plain['within noise']} "
            f"within the noise, {plain['slower']} slower)."
        )
        first, last = facts.bands[0], facts.bands[-1]
        ends = [(p, *(facts.speedup(p, "plain", band=b) for b in (first, last))) for p in facts.precisions]
        ends = [f"{times(a.value)} to {times(b.value)} in {p}" for p, a, b in ends if a and b]
        if ends and len(facts.bands) > 1:
            out.append(
                f"From {first} to {last} its speed-up goes from {listing(ends)} (geometric means over head dims)."
            )
    plain_oom, ours_oom = oom_text(facts, "plain"), oom_text(facts, OURS)
    if plain_oom:
        ours = f"from {ours_oom}" if ours_oom else f"ran every length up to N = {facts.longest}"
        out.append(f"Plain attention runs out of memory from {plain_oom}; ours {ours}.")
    if sdpa:
        backends = {b: [p for p, x in facts.backends.items() if x == b] for b in facts.backends.values()}
        overall = listing(f"{times(s.value)} in {p}" for p in facts.precisions if (s := facts.speedup(p, "sdpa")))
        out.append(
            f"Against SDPA (backend {listing(f'{b} in {listing(ps)}' for b, ps in backends.items())}) ours is faster "
            f"in {sdpa['faster']} of {sdpa.total()} shapes and slower in {sdpa['slower']}; over all shapes its "
            f"speed-up is {overall}."
        )
    return " ".join(out)


def one_line(facts: BenchFacts) -> str:
    """Shapes faster than plain, the largest band speed-up with its interval, shapes faster than SDPA."""
    plain, sdpa = facts.verdicts.get("plain"), facts.verdicts.get("sdpa")
    if not plain:
        return ""
    text = f"Ours runs forward+backward faster than plain in {plain['faster']} of {plain.total()} shapes"
    last = [(s.value, p) for p in facts.precisions if (s := facts.speedup(p, "plain", band=facts.bands[-1]))]
    if last:
        value, p = max(last, key=lambda x: x[0].median)
        text += f", {times(value)} in {p} at {facts.bands[-1]}"
    return summary(text + (f"; faster than SDPA in {sdpa['faster']} of {sdpa.total()}." if sdpa else "."))


def notes(facts: BenchFacts) -> str:
    """What the float32-input rows multiplied in; how everything was timed."""
    out = []
    for p, ours, plain, sdpa in facts.products:
        said = PRODUCT_SENTENCES if p == "fp32" else PRODUCT_WORDS
        ours = f" and ours {listing(said.get(x, x) for x in ours)}" if ours else ""
        sdpa = f"; SDPA {PRODUCT_WORDS.get(sdpa, sdpa)}" if sdpa else ""
        out.append(f"In the {p} rows (float32 inputs) plain's matmuls ran {PRODUCT_WORDS[plain]}{ours}{sdpa}.")
    out += [f"SDPA's products: {SDPA_FP32_WHY}."] if any(x[3] for x in facts.products) else []
    s, margin = facts.settings, round(100 * stats.SAME_MARGIN)
    out.append(
        f"Timed with `triton.testing.do_bench` medians (warm-up {s['warmup_ms']:g} ms, rep {s['rep_ms']:g} ms) of the "
        f"forward, the backward and forward+backward; Q, K, V of shape ({s['batch_size']}, N, d), "
        f"{'causal' if s['causal'] else 'not causal'}, made before timing. "
        "A speed-up is the other implementation's time over ours, over several shapes the geometric mean; ours is "
        f"called faster or slower only when the speed-up's interval lies wholly outside {margin}% of 1 (a single "
        f"trial has no interval: then beyond {2 * margin}%)."
    )
    return " ".join(out)


def section(records: list[dict], device: str) -> str:
    """The section; without records or timings one line (the figure, with nothing to draw, is not linked)."""
    if not records:
        return f"FlashAttention-2 was not measured on `{device}`.\n"
    facts, closing = BenchFacts(records), source_line(records, device)
    stopped = "; ".join(f"{listing(impls)} ({reason})" for reason, impls in facts.unsupported.items())
    if not facts.speedups:
        why = f": {stopped}" if stopped else ""
        return blocks(f"The FlashAttention-2 benchmark has no timings on `{device}`{why}.", closing)
    return blocks(
        one_line(facts),
        answer(facts),
        "Speed-up of ours per pass (geometric mean over every shape where both ran):",
        md_table(pass_table(facts)),
        "Forward+backward speed-up of ours over plain by head dim and sequence length (geometric mean over the "
        "band's lengths where both ran):",
        md_table(band_table(facts, "plain")),
        notes(facts),
        f"Did not run: {stopped}." if stopped else "",
        f"![Speed-up of flash and sdpa over plain against sequence length]({link(device, FIGURE)})",
        f"Every cell ({count(len(records), 'row')}, one per implementation, precision, head dim and length, with its "
        f"interval when the records have trials): [full table]({link(device, CSV)}).",
        closing,
    )
