"""What the memory records say, as small frozen facts with their verdicts, one per answer of
memory_profiling (a)-(e). Pure functions of the records (no torch); sizes in MiB."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from lmperf.core import stats
from lmperf.core.sizes import config_from_name, parameter_count
from lmperf.core.stats import Estimate
from lmperf.core.units import MIB
from lmperf.kinds.memory.account import predicted_peak_mib, weight_copy_bytes

MODES = ("inference", "training")
# A training stage shows in the timeline when it moves active memory by at least this share of the peak.
VISIBLE_SHARE = 0.01
# One step allocates the same tensors in every run; still, bf16 and fp32 memory differ only beyond this
# margin of 1 (stats.compare doubles it for single trials, as every memory cell is).
SAME_MEMORY_MARGIN = 0.01
LOWER_HIGHER = {"faster": "lower", "slower": "higher"}  # stats.compare's verdicts, for memory


def span(values) -> tuple[float, float] | None:
    values = [v for v in values if v is not None]
    return (min(values), max(values)) if values else None


@dataclass(frozen=True)
class Step:
    """One record: the recorded step of a (model, context, precision, mode)."""

    model: str
    context: int
    precision: str
    mode: str
    batch: int
    status: str
    reason: str | None
    peak: Estimate | None  # the allocator's peak (ok records)
    metrics: dict = field(repr=False)
    parameters_mib: float = 0.0
    weight_copies_mib: float = 0.0  # the bf16 weight copies a training step saves for backward
    # what autograd saved for backward in the training forward (its hooks, measured)
    saved_mib = property(lambda self: self.metrics.get("saved_for_backward_mib"))

    @property
    def predicted(self) -> tuple[float, str] | None:
        """The account's peak (MiB) and its phase, from the parameters and what autograd saved."""
        return None if self.saved_mib is None else predicted_peak_mib(self.parameters_mib, self.saved_mib)

    def at(self, phase: str, edge: str = "end") -> float | None:
        """Active memory at the ``edge`` ('start', 'end' or 'peak') of a phase."""
        return next((p[f"{edge}_active_mib"] for p in self.metrics.get("phases") or [] if p["phase"] == phase), None)

    def moves(self, phase: str) -> tuple[float, float]:
        """(net change, excursion above its start) of active memory in a phase; zeros without it."""
        start = self.at(phase, "start")
        return (0.0, 0.0) if start is None else (self.at(phase) - start, self.at(phase, "peak") - start)

    @property
    def hidden(self) -> tuple[str, ...]:
        """The training stages that move active memory by less than VISIBLE_SHARE of the peak."""
        if self.mode != "training":
            return ()
        net, above = self.moves("backward")
        moves = {
            "forward rises": self.moves("forward")[0],
            "backward changes active memory": max(abs(net), above, above - net),  # above - net: peak over end
            "optimizer step has a transient": self.moves("optimizer_step")[1],
            "zero_grad drops": -self.moves("zero_grad")[0],
        }
        least = VISIBLE_SHARE * self.metrics["replay_peak_active_mib"]
        return tuple(name for name, move in moves.items() if move < least)


def steps(records: list[dict]) -> list[Step]:
    """Every record as a Step, in cell order (vocabulary from the settings it ran with)."""
    out = []
    for r in records:
        c = r["cell"]
        config = config_from_name(c["model"], vocab_size=r["provenance"]["settings"].get("vocab_size", 10_000))
        peak = stats.metric(r, "peak_allocated_mib") if r["status"] == "ok" else None
        cell = (c["model"], c["context_length"], c["precision"], c["mode"], c["batch_size"])
        sizes = (4 * parameter_count(config) / MIB, weight_copy_bytes(config, c["precision"]) / MIB)
        out.append(Step(*cell, r["status"], r.get("reason"), peak, r["metrics"], *sizes))
    return sorted(out, key=lambda s: (s.model, s.context, s.precision, s.mode))


def measured(all_steps: list[Step]) -> list[Step]:
    """Steps with metrics to show (ok, or out of memory part-way)."""
    return [s for s in all_steps if s.status != "unsupported" and s.metrics]


@dataclass(frozen=True)
class StageFacts:
    training: tuple[Step, ...]
    shown: int  # the training cells that show every stage
    verdict: str | None  # 'yes' (every training cell shows every stage), 'partly' or 'no'; None without training
    spans: dict  # training: forward rise, gradients (end of backward − start), transient, zero_grad frees
    inference_base: tuple | None  # where a forward-only step starts
    inference_rise: float | None  # the most a forward-only step rises above its start
    parameters_mib: float | None


def stage_facts(all_steps: list[Step]) -> StageFacts:
    rows = [s for s in measured(all_steps) if s.at("forward") is not None and "replay_peak_active_mib" in s.metrics]
    tr, inf = [r for r in rows if r.mode == "training"], [r for r in rows if r.mode == "inference"]
    spans = {
        "forward": span(r.moves("forward")[0] for r in tr),
        "gradients": span(r.at("backward") - r.at("forward", "start") for r in tr if r.at("backward") is not None),
        "transient": span(r.moves("optimizer_step")[1] for r in tr),
        "zero_grad": span(-r.moves("zero_grad")[0] for r in tr),
    }
    rises = [r.metrics["replay_peak_active_mib"] - r.at("forward", "start") for r in inf]
    shown, base = sum(not r.hidden for r in tr), span(r.at("forward", "start") for r in inf)
    verdict = None if not tr else "yes" if shown == len(tr) else "partly" if shown else "no"
    params = rows[0].parameters_mib if rows else None
    return StageFacts(tuple(tr), shown, verdict, spans, base, max(rises, default=None), params)


@dataclass(frozen=True)
class PeakFacts:
    rows: tuple[tuple[int, Step | None, Step | None], ...]  # (context, forward only, full step) in fp32
    account_error: float | None  # the largest |account − replay| / replay of a training peak
    out_of_memory: tuple[Step, ...]
    by_phase: dict[str, tuple[int, ...]]  # training: the contexts whose step peaks in each phase

    def span(self, mode: str) -> tuple | None:
        return span(s.peak.median for s in (r[MODES.index(mode) + 1] for r in self.rows) if s and s.peak)


def peak_facts(all_steps: list[Step]) -> PeakFacts:
    cells = {(s.context, s.precision, s.mode): s for s in all_steps}  # one model per answer
    contexts = sorted({c for c, p, _ in cells if p == "fp32"})
    rows = tuple((c, cells.get((c, "fp32", "inference")), cells.get((c, "fp32", "training"))) for c in contexts)
    errors = [
        abs(s.predicted[0] / s.metrics["replay_peak_active_mib"] - 1)
        for s in measured(all_steps)
        if s.status == "ok" and s.predicted and "replay_peak_active_mib" in s.metrics
    ]
    ooms = tuple(sorted((s for s in all_steps if s.status == "oom"), key=lambda s: s.precision != "fp32"))
    peaked = [(c, t.metrics["peak_phase"]) for c, _, t in rows if t is not None and t.status == "ok"]
    by_phase = {phase: tuple(c for c, p in peaked if p == phase) for _, phase in peaked}
    return PeakFacts(rows, max(errors, default=None), ooms, by_phase)


@dataclass(frozen=True)
class Change:
    """One quantity of one (mode, context) in fp32 and in bf16 (MiB); for end-of-forward memory also what
    explains it: the activation bytes bf16 saves (what autograd saved for backward, by its hooks, in fp32
    less bf16's without its weight copies) against its copy of every matmul weight (the account's)."""

    what: str  # "peak" or "end of forward"
    mode: str
    context: int
    fp32: Estimate
    bf16: Estimate
    activations_saved_mib: float | None = None
    weight_copies_mib: float = 0.0

    change = property(lambda self: self.bf16.median / self.fp32.median - 1)

    @property
    def verdict(self) -> str:
        """'lower', 'higher' (bf16 against fp32) or 'within noise', through stats.compare."""
        verdict = stats.compare(self.bf16, self.fp32, SAME_MEMORY_MARGIN)  # in words for times
        return LOWER_HIGHER.get(verdict, verdict)

    @property
    def copies_outweigh(self) -> bool | None:
        return None if self.activations_saved_mib is None else self.weight_copies_mib > self.activations_saved_mib


@dataclass(frozen=True)
class PrecisionFacts:
    peaks: tuple[Change, ...]
    forward_ends: tuple[Change, ...]
    fit_changes: tuple[tuple[int, str, str, str], ...]  # (context, mode, fp32 status, bf16 status)


def precision_facts(all_steps: list[Step]) -> PrecisionFacts:
    cells = {(s.context, s.precision, s.mode): s for s in all_steps}  # one model per answer
    peaks, ends, fits = [], [], []
    for mode, ctx in sorted({(m, c) for c, _, m in cells}):
        a, b = cells.get((ctx, "fp32", mode)), cells.get((ctx, "bf16", mode))
        if a and b and a.status != b.status:
            fits.append((ctx, mode, a.status, b.status))
        if not (a and b and a.status == b.status == "ok"):
            continue
        peaks += [Change("peak", mode, ctx, a.peak, b.peak)] if a.peak and b.peak else []
        if mode == "training" and a.at("forward") is not None and b.at("forward") is not None:
            saved = a.saved_mib - b.saved_mib + b.weight_copies_mib if a.saved_mib and b.saved_mib else None
            fwd = (Estimate(a.at("forward")), Estimate(b.at("forward")))
            ends.append(Change("end of forward", mode, ctx, *fwd, saved, b.weight_copies_mib))
    return PrecisionFacts(tuple(peaks), tuple(ends), tuple(fits))


@dataclass(frozen=True)
class TopFacts:
    step: Step
    groups: tuple[tuple, ...]  # (size MiB, what, allocated in, frames, count) of identical entries
    score_shape: tuple[int, int, int, int]  # (B, H, T, T): one layer's attention scores

    def kinds(self) -> list[tuple[str, int, float]]:
        """(what, how many, size MiB) of the listed allocations, most first; named storages by category."""
        out = collections.Counter()
        for size, what, _, _, n in self.groups:
            out[what.split(":")[0], size] += n
        return sorted(((w, n, s) for (w, s), n in out.items()), key=lambda t: (-t[1], -t[2]))


def allocation_name(a: dict, shape: tuple[int, ...]) -> str:
    """An allocation as the report names it: its storage's name ('parameters: …'), else 'score-sized
    (fp32)' (or bf16) where it holds exactly one layer's attention scores (B·H·T² elements), else '—'."""
    if a.get("category"):
        return f"{a['category']}: {a['name']}"
    elements = shape[0] * shape[1] * shape[2] * shape[3]
    return next(
        (f"score-sized ({n})" for n, b in (("fp32", 4), ("bf16", 2)) if abs(a["size_bytes"] - elements * b) < 1), "—"
    )


def top_facts(all_steps: list[Step], mode: str) -> TopFacts | None:
    """The largest allocations at the peak of a mode's cell: fp32 first, then one that ran to the end,
    then the longest context."""
    cands = [s for s in measured(all_steps) if s.mode == mode and s.metrics.get("top_allocations")]
    if not cands:
        return None
    s = max(cands, key=lambda s: (s.precision == "fp32", s.status == "ok", s.context))
    shape = (s.batch, config_from_name(s.model).num_heads, s.context, s.context)
    top = s.metrics["top_allocations"]
    groups = collections.Counter(
        (a["size_mib"], allocation_name(a, shape), a["allocated_in"], tuple(a["frames"])) for a in top
    )
    return TopFacts(s, tuple((*k, n) for k, n in groups.items()), shape)
