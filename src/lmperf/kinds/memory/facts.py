"""What the memory records say, as small frozen facts: one dataclass per answer of memory_profiling.

Pure functions of the records (no torch, no pandas); the tables and the templates of
``lmperf.kinds.memory.report`` read only these. Sizes are MiB here (the templates print GiB).
The bf16 comparison (question (c)) is in ``lmperf.kinds.memory.bf16``, single allocations
((d), (e)) in ``lmperf.kinds.memory.allocations``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lmperf.core import stats
from lmperf.core.sizes import config_from_name
from lmperf.core.stats import Estimate
from lmperf.core.units import MIB
from lmperf.kinds.memory.account import analytic_account, vocab_from_parameter_count

MODES = ("inference", "training")
PRECISIONS = ("fp32", "bf16")
# A stage shows in the timeline when it moves active memory (net, or above its start) by at least
# this share of the cell's peak.
VISIBLE_SHARE = 0.01
# The allocator's peak counts whole blocks, the replayed trace requested bytes; a cached block is
# handed out unsplit when the rest would be under 1 MiB (the large pool's split threshold), so each
# live allocation may count up to this much more in the allocator's peak.
BLOCK_SLACK_MIB = 1.0
ANALYTIC_END_OF_FORWARD = "end of forward"
ANALYTIC_OPTIMIZER_STEP = "optimizer step"


def _key(record: dict) -> tuple:
    c = record["cell"]
    return c["model"], c["context_length"], c["precision"], c["mode"]


def memory_records(records: list[dict]) -> list[dict]:
    """The memory records among ``records``, in cell order."""
    return sorted((r for r in records if r.get("kind", "memory") == "memory"), key=_key)


def measured(records: list[dict]) -> list[dict]:
    """Records with metrics to show (ok, or out of memory part-way)."""
    return [r for r in records if r["status"] != "unsupported" and r["metrics"]]


def analytic(record: dict) -> dict:
    """The analytic account of a cell, recomputed from its cell (a stored account may predate a
    correction of lmperf.kinds.memory.account); {} for a record without metrics."""
    if record["status"] == "unsupported":
        return {}
    c = record["cell"]
    config = config_from_name(c["model"])
    stored = (record["metrics"].get("analytic") or {}).get("parameter_count")
    vocab = c.get("vocab_size") or (vocab_from_parameter_count(config, stored) if stored else config.vocab_size)
    config = config_from_name(c["model"], vocab_size=vocab)
    return analytic_account(config, c["batch_size"], c["context_length"], c["precision"], c["mode"])


def analytic_peak_phase(account: dict) -> str | None:
    """Where the account's peak falls: the end of the forward or the optimizer step, whichever
    total is larger; an inference account's own phase (forward)."""
    fwd, step = account.get("end_of_forward_mib"), account.get("optimizer_step_mib")
    if fwd is None or step is None:
        return account.get("predicted_peak_phase")
    return ANALYTIC_END_OF_FORWARD if fwd >= step else ANALYTIC_OPTIMIZER_STEP


def phases(record: dict) -> dict[str, dict]:
    return {p["phase"]: p for p in record["metrics"].get("phases") or []}


def _span(values) -> tuple[float, float] | None:
    values = [v for v in values if v is not None]
    return (min(values), max(values)) if values else None


# -- (a) the stages ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StageRow:
    """One cell's stages (MiB): where each starts, ends and peaks; training cells name the
    stages that do not show (``hidden``)."""

    model: str
    context: int
    precision: str
    mode: str
    start_mib: float
    forward_end_mib: float
    forward_peak_mib: float
    peak_mib: float
    peak_phase: str | None
    backward_peak_mib: float | None = None
    backward_end_mib: float | None = None
    step_transient_mib: float | None = None
    zero_grad_frees_mib: float | None = None
    hidden: tuple[str, ...] = ()

    @property
    def visible(self) -> bool | None:
        return None if self.mode != "training" else not self.hidden


def hidden_stages(sig: dict[str, dict], peak_mib: float) -> tuple[str, ...]:
    """The training signatures that move active memory by less than VISIBLE_SHARE of the peak:
    the forward rises, the backward changes memory, the optimizer step has a transient, zero_grad drops."""
    least = VISIBLE_SHARE * peak_mib

    def net(p):
        return sig[p]["end_active_mib"] - sig[p]["start_active_mib"] if p in sig else 0.0

    def above(p):
        return sig[p]["peak_active_mib"] - sig[p]["start_active_mib"] if p in sig else 0.0

    b = sig.get("backward")
    backward_move = max(abs(net("backward")), above("backward"), b["peak_active_mib"] - b["end_active_mib"] if b else 0)
    need = {
        "forward rises": net("forward") >= least,
        "backward changes active memory": backward_move >= least,
        "optimizer step has a transient": above("optimizer_step") >= least,
        "zero_grad drops": -net("zero_grad") >= least,
    }
    return tuple(name for name, ok in need.items() if not ok)


def stage_row(record: dict) -> StageRow | None:
    m, sig = record["metrics"], phases(record)
    peak = m.get("replay_peak_active_mib")
    if "forward" not in sig or peak is None:
        return None
    model, ctx, precision, mode = _key(record)
    f = sig["forward"]
    row = StageRow(
        model,
        ctx,
        precision,
        mode,
        f["start_active_mib"],
        f["end_active_mib"],
        f["peak_active_mib"],
        peak,
        m.get("peak_phase"),
    )
    if mode != "training":
        return row
    b, o, z = sig.get("backward"), sig.get("optimizer_step"), sig.get("zero_grad")
    return dataclasses.replace(
        row,
        backward_peak_mib=b["peak_active_mib"] if b else None,
        backward_end_mib=b["end_active_mib"] if b else None,
        step_transient_mib=o["peak_active_mib"] - o["start_active_mib"] if o else None,
        zero_grad_frees_mib=z["start_active_mib"] - z["end_active_mib"] if z else None,
        hidden=hidden_stages(sig, peak),
    )


@dataclass(frozen=True)
class StageFacts:
    rows: tuple[StageRow, ...]
    forward_rise_mib: tuple[float, float] | None  # training: end of forward − start of step
    gradients_mib: tuple[float, float] | None  # training: end of backward − start of step
    step_transient_mib: tuple[float, float] | None
    zero_grad_frees_mib: tuple[float, float] | None
    inference_base_mib: tuple[float, float] | None  # where a forward-only step starts
    inference_rise_mib: float | None  # the most a forward-only step rises above its start

    @property
    def training(self) -> tuple[StageRow, ...]:
        return tuple(r for r in self.rows if r.mode == "training")

    @property
    def verdict(self) -> str | None:
        """'yes' (every training cell shows every stage), 'partly', 'no'; None without training cells."""
        if not self.training:
            return None
        shown = sum(bool(r.visible) for r in self.training)
        return "yes" if shown == len(self.training) else "no" if shown == 0 else "partly"


def stage_facts(records: list[dict]) -> StageFacts:
    order = sorted(records, key=lambda r: (r["cell"]["mode"] != "training", r["cell"]["precision"] != "fp32", _key(r)))
    rows = tuple(row for row in map(stage_row, measured(order)) if row is not None)
    tr = [r for r in rows if r.mode == "training"]
    inf = [r for r in rows if r.mode == "inference"]
    return StageFacts(
        rows=rows,
        forward_rise_mib=_span(r.forward_end_mib - r.start_mib for r in tr),
        gradients_mib=_span(r.backward_end_mib - r.start_mib for r in tr if r.backward_end_mib is not None),
        step_transient_mib=_span(r.step_transient_mib for r in tr),
        zero_grad_frees_mib=_span(r.zero_grad_frees_mib for r in tr),
        inference_base_mib=_span(r.start_mib for r in inf),
        inference_rise_mib=max((r.peak_mib - r.start_mib for r in inf), default=None),
    )


# -- (b) the peaks -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PeakCell:
    """One cell's peak: the allocator's (an Estimate, MiB), the replay's, the phase, the account's."""

    status: str
    peak: Estimate | None
    replay_mib: float | None
    reserved_mib: float | None
    phase: str | None
    analytic_mib: float | None
    analytic_phase: str | None


def peak_cell(record: dict | None) -> PeakCell | None:
    if record is None:
        return None
    m, a = record["metrics"], analytic(record)
    return PeakCell(
        status=record["status"],
        peak=stats.metric(record, "peak_allocated_mib") if record["status"] == "ok" else None,
        replay_mib=m.get("replay_peak_active_mib"),
        reserved_mib=m.get("peak_reserved_mib"),
        phase=m.get("peak_phase"),
        analytic_mib=a.get("predicted_peak_mib"),
        analytic_phase=analytic_peak_phase(a),
    )


@dataclass(frozen=True)
class PeakRow:
    context: int
    inference: PeakCell | None
    training: PeakCell | None


@dataclass(frozen=True)
class TwoPeaks:
    """The largest gap between a cell's allocator peak and its replayed peak, per live allocation."""

    gap_mib: float
    live_allocations: int
    cell: tuple

    @property
    def per_allocation_mib(self) -> float:
        return self.gap_mib / self.live_allocations if self.live_allocations else float("inf")

    @property
    def reconciled(self) -> bool:
        return self.per_allocation_mib <= BLOCK_SLACK_MIB


@dataclass(frozen=True)
class OutOfMemory:
    precision: str
    context: int
    mode: str
    where: tuple[tuple[str, float, float], ...]  # (phase, requested MiB, free MiB on the device)
    reason: str | None


@dataclass(frozen=True)
class PeakFacts:
    precision: str
    rows: tuple[PeakRow, ...]
    two_peaks: TwoPeaks | None
    analytic_error: float | None  # the largest |account − replay| / replay over training cells
    out_of_memory: tuple[OutOfMemory, ...]

    def span(self, mode: str) -> tuple[float, float] | None:
        cells = [getattr(r, mode) for r in self.rows]
        return _span(c.peak.median for c in cells if c is not None and c.peak is not None)

    def contexts_by_phase(self) -> dict[str, tuple[int, ...]]:
        """Training: the contexts whose step peaks in each phase."""
        out: dict[str, tuple[int, ...]] = {}
        for r in self.rows:
            if r.training is not None and r.training.status == "ok" and r.training.phase:
                out[r.training.phase] = out.get(r.training.phase, ()) + (r.context,)
        return out


def lookup(records: list[dict]) -> dict[tuple, dict]:
    """(context, precision, mode) -> record; one model per report section."""
    return {(r["cell"]["context_length"], r["cell"]["precision"], r["cell"]["mode"]): r for r in records}


def two_peaks(records: list[dict]) -> TwoPeaks | None:
    gaps = [
        TwoPeaks(m["peak_allocated_mib"] - m["replay_peak_active_mib"], m.get("live_allocations_at_peak") or 0, _key(r))
        for r in records
        if r["status"] == "ok"
        for m in [r["metrics"]]
        if m.get("peak_allocated_mib") is not None and m.get("replay_peak_active_mib") is not None
    ]
    return max(gaps, key=lambda g: g.gap_mib) if gaps else None


def out_of_memory(records: list[dict]) -> tuple[OutOfMemory, ...]:
    out = []
    for r in sorted(records, key=lambda r: (r["cell"]["precision"] != "fp32", _key(r))):
        if r["status"] != "oom":
            continue
        where = tuple(
            (e.get("phase"), (e.get("requested_bytes") or 0) / MIB, (e.get("device_free_bytes") or 0) / MIB)
            for e in r["metrics"].get("oom_events") or []
        )
        _, ctx, precision, mode = _key(r)
        out.append(OutOfMemory(precision, ctx, mode, where, r.get("reason")))
    return tuple(out)


def peak_facts(records: list[dict], precision: str = "fp32") -> PeakFacts:
    cells = lookup(records)
    contexts = sorted({c for c, p, _ in cells if p == precision})
    rows = tuple(
        PeakRow(c, peak_cell(cells.get((c, precision, "inference"))), peak_cell(cells.get((c, precision, "training"))))
        for c in contexts
    )
    errors = [
        abs(t.analytic_mib - t.replay_mib) / t.replay_mib
        for t in (r.training for r in rows)
        if t is not None and t.status == "ok" and t.analytic_mib and t.replay_mib
    ]
    return PeakFacts(
        precision=precision,
        rows=rows,
        two_peaks=two_peaks(measured(records)),
        analytic_error=max(errors, default=None),
        out_of_memory=out_of_memory(records),
    )


@dataclass(frozen=True)
class Composition:
    """A training cell's peak two ways, kept apart: what is live at the measured peak event, and the
    account's full-size components (gradients exist in full only after the backward)."""

    precision: str
    context: int
    phase: str | None
    live_mib: dict  # parameters, gradients, optimizer_state, other: live at the peak event
    replay_peak_mib: float | None
    saved_hooks_mib: float | None  # bytes autograd's saved-tensor hooks saw in the forward
    account: dict  # lmperf.kinds.memory.account's totals


def compositions(records: list[dict]) -> tuple[Composition, ...]:
    out = []
    for r in sorted(measured(records), key=lambda r: (r["cell"]["precision"] != "fp32", _key(r))):
        m, (_, ctx, precision, mode) = r["metrics"], _key(r)
        if mode != "training" or not m.get("breakdown_at_peak_mib"):
            continue
        out.append(
            Composition(
                precision,
                ctx,
                m.get("peak_phase"),
                dict(m["breakdown_at_peak_mib"]),
                m.get("replay_peak_active_mib"),
                m.get("saved_for_backward_mib"),
                analytic(r),
            )
        )
    return tuple(out)


def saved_error(rows: tuple[Composition, ...]) -> float | None:
    """The largest |closed form − hooks| / hooks of the bytes saved for backward (activations and,
    under bf16, the weight copies autograd saves)."""
    errors = [
        abs(c.account["activations_mib"] + c.account["weight_copies_mib"] - c.saved_hooks_mib) / c.saved_hooks_mib
        for c in rows
        if c.saved_hooks_mib and c.account
    ]
    return max(errors, default=None)
