"""The flash_benchmarking section: the answer (how much faster our kernels run than PyTorch's attention,
where plain attention runs out of memory), a per-pass summary, a per head dim and length band table,
notes on what float32 rows multiplied in and how they were timed, and the figures; the 360-row
table of every cell is the linked CSV."""

from __future__ import annotations

import pandas as pd

from lmperf.core import stats
from lmperf.kinds.flash.bench_facts import OURS, BenchFacts, Speedup
from lmperf.kinds.flash.frames import PASSES
from lmperf.kinds.flash.leaderboard_facts import tile_sources_text
from lmperf.kinds.flash.products import PRODUCT_SENTENCES, PRODUCT_WORDS, SDPA_FP32_WHY
from lmperf.kinds.flash.render import blocks, count, details, figure_link, listing, md_table, table_link, times

CSV = "flash_benchmarking.csv"
FIGURES = ("flash_speedup.png", "flash_time.png")
PASS_WORDS = {"forward": "fwd", "backward": "bwd", "forward_backward": "fwd+bwd"}
UNSTABLE_MARK = "†"


def cell(s: Speedup | None) -> str:
    """'2.41×', '1.01× (within noise)', '3.2× [2.9, 3.5]†'."""
    if s is None:
        return "—"
    text = times(s.value) + (UNSTABLE_MARK if s.unstable else "")
    return text + (" (within noise)" if s.verdict == "within noise" else "")


def backend_words(facts: BenchFacts) -> str:
    """'the FLASH_ATTENTION backend in bf16, EFFICIENT_ATTENTION in fp32 and tf32'."""
    by: dict[str, list[str]] = {}
    for p, b in facts.backends:
        by.setdefault(b, []).append(p)
    parts = [f"{b} in {listing(ps)}" for b, ps in by.items()]
    return ("backend " + listing(parts)) if parts else ""


def pass_table(facts: BenchFacts) -> pd.DataFrame:
    """Per precision: ours against each baseline, each pass, over every shape where both ran."""
    rows = []
    for p in facts.precisions:
        row = {"precision": p}
        for b in ("plain", "sdpa"):
            for pass_ in PASSES:
                s = facts.speedup(p, b, pass_)
                if s is not None or any(x.baseline == b for x in facts.speedups):
                    row[f"vs {b} {PASS_WORDS[pass_]}"] = cell(s)
            s = facts.speedup(p, b)
            if s is not None:
                row[f"shapes vs {b}"] = str(s.shapes)
        rows.append(row)
    return pd.DataFrame(rows)


def _oom_by(facts: BenchFacts, implementation: str) -> dict[tuple[str, int], int]:
    return {(p, d): n for p, i, d, n in facts.oom_from if i == implementation}


def band_table(facts: BenchFacts, baseline: str) -> pd.DataFrame:
    """Per precision and head dim: the fwd+bwd speed-up of ours over a baseline in each length band."""
    oom = _oom_by(facts, baseline)
    rows = []
    for p in facts.precisions:
        for d in facts.head_dims:
            found = [facts.speedup(p, baseline, head_dim=d, band=band) for band in facts.bands]
            if not any(found):
                continue
            row = {"precision": p, "d": str(d), **{band: cell(s) for band, s in zip(facts.bands, found)}}
            if oom:
                row[f"{baseline} out of memory from N"] = str(oom.get((p, d), "—"))
            rows.append(row)
    return pd.DataFrame(rows)


def _oom_text(facts: BenchFacts, implementation: str) -> str:
    """'N = 65536 at every precision and head dim', or per length the precisions and head dims."""
    by_n: dict[int, dict[str, list[int]]] = {}
    for p, i, d, n in facts.oom_from:
        if i == implementation:
            by_n.setdefault(n, {}).setdefault(p, []).append(d)
    everywhere = {(p, d) for p in facts.precisions for d in facts.head_dims}
    parts = []
    for n, where in sorted(by_n.items()):
        if {(p, d) for p, ds in where.items() for d in ds} == everywhere:
            parts.append(f"N = {n} at every precision and head dim")
            continue
        full = [p for p, ds in where.items() if sorted(ds) == list(facts.head_dims)]
        at = [f"{listing(full)} at every head dim"] if full else []
        at += [f"{p} d = {', '.join(map(str, ds))}" for p, ds in where.items() if p not in full]
        parts.append(f"N = {n} ({'; '.join(at)})")
    return listing(parts)


def _verdict_counts(facts: BenchFacts, baseline: str) -> tuple[int, int, int]:
    found = [v for v in facts.shape_verdicts if v[1] == baseline]
    return tuple(sum(v[k] for v in found) for k in (2, 3, 4))


def _bands_sentence(facts: BenchFacts, baseline: str) -> str:
    """'From N 128–1024 to N 16384–65536 its speed-up goes from 1.53× to 6.92× in fp32, …' (over all head dims)."""
    first, last = facts.bands[0], facts.bands[-1]
    found = [
        (p, facts.speedup(p, baseline, band=first), facts.speedup(p, baseline, band=last)) for p in facts.precisions
    ]
    found = [(p, a, b) for p, a, b in found if a and b]
    if not found:
        return ""
    if first == last:
        return f"At {first} its speed-up is " + listing(f"{times(a.value)} in {p}" for p, a, _ in found) + "."
    return (
        f"From {first} to {last} its speed-up goes from "
        + listing(f"{times(a.value)} to {times(b.value)} in {p}" for p, a, b in found)
        + " (geometric means over head dims)."
    )


def answer(facts: BenchFacts) -> str:
    """Two to four sentences: ours against plain (counts, by band), where plain runs out of memory, SDPA."""
    faster, slower, within = _verdict_counts(facts, "plain")
    out = []
    if faster + slower + within:
        out.append(
            f"Our Triton FlashAttention-2 (`{OURS}`) runs forward+backward faster than PyTorch's unfused attention "
            f"(`plain`) in {faster} of the {faster + slower + within} shapes where both ran ({within} within the "
            f"noise, {slower} slower)."
        )
        out.append(_bands_sentence(facts, "plain"))
    oom = _oom_text(facts, "plain")
    if oom:
        ours_oom = _oom_text(facts, OURS)
        longest = max((n for _, _, n in facts.ours_longest), default=None)
        ours = f"ours from {ours_oom}" if ours_oom else f"ours ran every length up to N = {longest}"
        out.append(f"Plain attention runs out of memory from {oom}; {ours}.")
    faster, slower, within = _verdict_counts(facts, "sdpa")
    if faster + slower + within:
        overall = listing(
            f"{times(s.value)} in {p}" for p in facts.precisions if (s := facts.speedup(p, "sdpa")) is not None
        )
        out.append(
            f"Against SDPA ({backend_words(facts)}) ours is faster in {faster} of {faster + slower + within} "
            f"shapes and slower in {slower}; over all shapes its speed-up is {overall}."
        )
    return " ".join(s for s in out if s)


def products_note(facts: BenchFacts) -> str:
    """What the float32-input rows multiplied in: ours by the records' dot precision, plain by the
    precision's matmul setting, SDPA by its backend and the device."""
    parts = []
    for x in facts.products:
        said = PRODUCT_SENTENCES if x.precision == "fp32" else PRODUCT_WORDS
        ours = f" and ours {listing(said.get(p, p) for p in x.ours)}" if x.ours else ""
        sdpa = f"; SDPA {PRODUCT_WORDS.get(x.sdpa, x.sdpa)}" if x.sdpa else ""
        plain = PRODUCT_WORDS.get(x.plain, x.plain)
        parts.append(f"In the {x.precision} rows (float32 inputs) plain's matmuls ran {plain}{ours}{sdpa}.")
    if any(x.sdpa for x in facts.products):
        parts.append(f"SDPA's products: {SDPA_FP32_WHY}.")
    return " ".join(parts)


def method_note(facts: BenchFacts) -> str:
    s = facts.settings
    margin = round(100 * stats.SAME_MARGIN)
    tiles = tile_sources_text(s["tile_sources"])
    return (
        f"Timed with `triton.testing.do_bench` medians (warm-up {s['warmup_ms']:g} ms, rep {s['rep_ms']:g} ms) of "
        f"the forward, the backward and forward+backward; Q, K, V of shape ({s['batch_size']}, N, d), "
        f"{'causal' if s['causal'] else 'not causal'}, made before timing"
        + (f"; our tiles per kernel and shape: {tiles}" if tiles else "")
        + ". A speed-up is the other implementation's time over ours, over several shapes the geometric mean; "
        f"ours is called faster or slower only when the speed-up's interval lies wholly outside {margin}% of 1 "
        f"(a single trial has no interval: then beyond {2 * margin}%)."
    )


def _unsupported_text(facts: BenchFacts) -> str:
    """'plain, flash_triton and sdpa (no CUDA device: …)'."""
    return "; ".join(f"{listing(impls)} ({reason})" for reason, impls in facts.unsupported)


def gaps_note(facts: BenchFacts) -> str:
    out = []
    if facts.missing:
        listed = "; ".join(f"{i} {p} d = {d} at N = {', '.join(map(str, ns))}" for p, i, d, ns in facts.missing)
        out.append(f"No record (not measured, so not out of memory): {listed}.")
    if facts.unsupported:
        out.append(f"Did not run: {_unsupported_text(facts)}.")
    return " ".join(out)


def section(facts: BenchFacts, device: str, source: str) -> str:
    if not facts.speedups:
        why = f": {_unsupported_text(facts)}" if facts.unsupported else ""
        return blocks(
            f"The FlashAttention-2 benchmark has no timings on `{device}`{why}.", figures_markdown(device), source
        )
    legend = (
        f"{UNSTABLE_MARK} an interval wider than {round(100 * stats.UNSTABLE_WIDTH)}% of its median (unstable)."
        if any(s.unstable for s in facts.speedups)
        else ""
    )
    sdpa = band_table(facts, "sdpa")
    return blocks(
        answer(facts),
        "Speed-up of ours per pass (geometric mean over every shape where both ran):",
        md_table(pass_table(facts)),
        "Forward+backward speed-up of ours over plain by head dim and sequence length (geometric mean over the "
        "band's lengths where both ran):",
        md_table(band_table(facts, "plain")),
        legend,
        details("Forward+backward speed-up of ours over SDPA by head dim and length", md_table(sdpa))
        if not sdpa.empty
        else "",
        products_note(facts),
        method_note(facts),
        gaps_note(facts),
        figures_markdown(device),
        f"Every cell ({count(facts.records, 'row')}, one per implementation, precision, head dim and length, "
        f"with its interval when the records have trials): [full table]({table_link(device, CSV)}).",
        source,
    )


def figures_markdown(device: str) -> str:
    return (
        f"![Speed-up of flash_triton and sdpa over plain]({figure_link(device, FIGURES[0])}) "
        f"![Forward+backward time against sequence length]({figure_link(device, FIGURES[1])})"
    )
