"""bf16 against fp32 (question (c)): the peaks and the end-of-forward memory of each context in
both precisions, the verdict on each, and what explains the end-of-forward change. Pure functions
of the memory records; sizes in MiB.

A memory cell records one step's allocations, not a time: the same step allocates the same
tensors in every run. A difference is still stated only through ``lmperf.core.stats.compare``,
with a margin of its own (``SAME_MEMORY_MARGIN``).
"""

from __future__ import annotations

from dataclasses import dataclass

from lmperf.core import stats
from lmperf.core.stats import Estimate
from lmperf.kinds.memory.facts import MODES, analytic, lookup, phases

# bf16 and fp32 memory "differ" only when their ratio lies beyond this margin of 1 (stats.compare
# doubles it for cells measured once, as every memory cell is today).
SAME_MEMORY_MARGIN = 0.01
# stats.compare speaks of times; a smaller byte count is "lower".
MEMORY_WORDS = {"faster": "lower", "slower": "higher", "within noise": "within noise"}


def memory_margin(a: Estimate, b: Estimate) -> float:
    """The margin ``memory_verdict`` applies: stats.compare doubles it where either cell has no interval."""
    return SAME_MEMORY_MARGIN * (2 if stats.ratio(a, b).low is None else 1)


def memory_verdict(a: Estimate, b: Estimate) -> str:
    """'lower', 'higher' (a against b) or 'within noise', through stats.compare."""
    return MEMORY_WORDS[stats.compare(a, b, SAME_MEMORY_MARGIN)]


@dataclass(frozen=True)
class Change:
    """One quantity of one (mode, context) in fp32 and in bf16 (MiB)."""

    mode: str
    context: int
    fp32: Estimate
    bf16: Estimate

    @property
    def change(self) -> float:
        return self.bf16.median / self.fp32.median - 1

    @property
    def verdict(self) -> str:
        return memory_verdict(self.bf16, self.fp32)

    @property
    def margin(self) -> float:
        return memory_margin(self.bf16, self.fp32)


@dataclass(frozen=True)
class ForwardEnd:
    """Active memory at the end of a training forward, fp32 against bf16, with what explains it:
    the bytes autograd saved for backward (its hooks, measured) and the account's two opposite
    terms, the activation bytes bf16 saves and the bf16 weight copies autograd keeps for backward."""

    change: Change
    saved_fp32_mib: float | None
    saved_bf16_mib: float | None
    activations_saved_mib: float
    weight_copies_mib: float

    @property
    def copies_outweigh(self) -> bool:
        return self.weight_copies_mib > self.activations_saved_mib


@dataclass(frozen=True)
class PrecisionFacts:
    peaks: tuple[Change, ...]
    forward_ends: tuple[ForwardEnd, ...]
    bf16_peak_phases: tuple[tuple[int, str], ...]  # training: (context, phase of the bf16 peak)
    fit_changes: tuple[tuple[int, str, str, str], ...]  # (context, mode, fp32 status, bf16 status)

    def changes(self, mode: str) -> tuple[Change, ...]:
        return tuple(c for c in self.peaks if c.mode == mode)

    def contexts(self, changes, verdict: str) -> tuple[int, ...]:
        return tuple(c.context for c in changes if c.verdict == verdict)


def _forward_end(fp32: dict, bf16: dict) -> ForwardEnd | None:
    f, b = phases(fp32).get("forward"), phases(bf16).get("forward")
    if f is None or b is None:
        return None
    a32, a16 = analytic(fp32), analytic(bf16)
    change = Change(
        "training", fp32["cell"]["context_length"], Estimate(f["end_active_mib"]), Estimate(b["end_active_mib"])
    )
    return ForwardEnd(
        change,
        fp32["metrics"].get("saved_for_backward_mib"),
        bf16["metrics"].get("saved_for_backward_mib"),
        a32["activations_mib"] - a16["activations_mib"],
        a16["weight_copies_mib"],
    )


def precision_facts(records: list[dict]) -> PrecisionFacts:
    cells = lookup(records)
    peaks, ends, fits = [], [], []
    for mode in MODES:
        for ctx in sorted({c for c, _, m in cells if m == mode}):
            a, b = cells.get((ctx, "fp32", mode)), cells.get((ctx, "bf16", mode))
            if a is None or b is None:
                continue
            if a["status"] != b["status"]:
                fits.append((ctx, mode, a["status"], b["status"]))
            if a["status"] != "ok" or b["status"] != "ok":
                continue
            pa, pb = stats.metric(a, "peak_allocated_mib"), stats.metric(b, "peak_allocated_mib")
            if pa is not None and pb is not None:
                peaks.append(Change(mode, ctx, pa, pb))
            end = _forward_end(a, b) if mode == "training" else None
            if end is not None:
                ends.append(end)
    bf16_phases = tuple(
        (c, r["metrics"].get("peak_phase"))
        for (c, p, m), r in sorted(cells.items())
        if p == "bf16" and m == "training" and r["status"] == "ok"
    )
    return PrecisionFacts(tuple(peaks), tuple(ends), bf16_phases, tuple(fits))
