"""What the end-to-end records say: rows as frozen dataclasses, facts computed from the records, verdicts
included (``stats.compare``); no torch. Host-bound is said only where a record measured the GPU's busy share of its
training step (``gpu_busy_fraction``), never guessed from times.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from statistics import fmean, stdev

from lmperf.core import stats
from lmperf.core.stats import Estimate
from lmperf.report.common import model_rank
from lmperf.report.compare import attention_of

LOW_CV = 0.05  # variability over a cell's measured steps (std / mean) under this is negligible
HOST_BOUND_BUSY = 0.5  # a training step whose GPU is busy under this share of it is host-bound
# the timer check compares samples longer than this; it agrees when every sample is within the share
TIMER_CHECK_MIN_MS, TIMER_AGREE_SHARE = 10.0, 0.02
TIMER_PHASES = ("forward", "backward", "optimizer_step", "inference_forward")
STEP, INFERENCE = "training_step_ms_mean", "inference_forward_ms_mean"
STEP_PHASES = {"forward": "forward_ms_mean", "backward": "backward_ms_mean"}
PRECISION_PHASES = {**STEP_PHASES, "step": STEP}
MODEL_PHASES = {"step": STEP, "inference": INFERENCE}


def key(record: dict) -> tuple:  # (model, context_length, precision, compile, warmup_steps)
    return tuple(record["cell"][k] for k in ("model", "context_length", "precision", "compile", "warmup_steps"))


def course_cells(records: list[dict]) -> dict[tuple, dict]:
    """The e2e records of the course's model (``plain`` attention) by cell, smallest size first."""
    cells = {key(r): r for r in records if r["kind"] == "e2e" and attention_of(r) == "plain"}
    return {k: cells[k] for k in sorted(cells, key=lambda k: (model_rank(k[0]), *k[1:]))}


def est(record: dict | None, name: str) -> Estimate | None:
    return None if record is None else stats.metric(record, name)


def host_bound(busy: Estimate | None) -> bool | None:
    return None if busy is None else busy.median < HOST_BOUND_BUSY


def trials(record: dict) -> int:
    return len(record["metrics"].get("trials") or []) or 1


@dataclass(frozen=True)
class Pair:
    """One cell run two ways (fp32 and bf16, eager and compiled, …) from its two records (``base`` None:
    not measured) over ``phases`` (phase -> metric)."""

    base: dict | None
    other: dict
    phases: dict

    model = property(lambda self: self.other["cell"]["model"])
    context_length = property(lambda self: self.other["cell"]["context_length"])
    precision = property(lambda self: self.other["cell"]["precision"])
    metrics = property(lambda self: self.other["metrics"])  # the other way's
    label = property(lambda self: f"{self.model}/{self.context_length}")
    # phase -> (base, other)
    times = property(lambda self: {p: (est(self.base, m), est(self.other, m)) for p, m in self.phases.items()})
    # each way's GPU busy share of the training step, where measured
    busy = property(lambda self: tuple(est(r, "gpu_busy_fraction") for r in (self.base, self.other)))

    def speedup(self, phase: str) -> Estimate | None:
        """base time / other time."""
        base, other = self.times[phase]
        return None if base is None or other is None else stats.ratio(base, other)

    def verdict(self, phase: str) -> str | None:
        """``faster`` where the other way is faster than the base beyond the noise."""
        base, other = self.times[phase]
        return None if base is None or other is None else stats.compare(other, base)


def judged(rows, phase: str = "step") -> list:
    return [r for r in rows if r.verdict(phase)]


class PhaseRow(Pair):
    """Forward and backward of a cell at the default warm-up, fp32, eager (``base`` None), or, in the
    warm-up sweep, of the default count's cell and this count's."""

    warmup_steps = property(lambda self: self.other["cell"]["warmup_steps"])
    training_ok = property(lambda self: all(other is not None for _, other in self.times.values()))
    unstable = property(lambda self: any(other is not None and other.unstable for _, other in self.times.values()))

    def forward_ms(self) -> float:
        return self.times["forward"][1].median

    def _over_trials(self, of) -> dict:
        """phase -> the median over the cell's trials of ``of`` (their samples, a trial's steps); None without."""
        runs = self.metrics.get("trials") or [self.metrics]  # a merged record keeps each trial's samples
        each = {p: [s for t in runs if len(s := t.get(f"{p}_ms_samples") or []) > 1] for p in STEP_PHASES}
        return {p: statistics.median(of(s) for s in v) if v else None for p, v in each.items()}

    cvs = property(lambda self: self._over_trials(lambda s: stdev(s) / fmean(s)))  # a trial's std / mean
    stds = property(lambda self: self._over_trials(stdev))  # a trial's std over its steps (ms)

    cv = property(lambda self: max((v for v in self.cvs.values() if v is not None), default=None))  # the larger phase's

    @property
    def first_over_median(self) -> float | None:
        """The first measured forward over the median of the others."""
        s = self.metrics.get("forward_ms_samples") or []
        return s[0] / statistics.median(s[1:]) if len(s) > 1 else None


class TimingFacts:
    def __init__(self, records: list[dict], warmup: int):
        self.warmup_steps = warmup
        cells = course_cells(records).items()
        self.rows = tuple(PhaseRow(None, r, STEP_PHASES) for k, r in cells if k[2:] == ("fp32", "eager", warmup))
        e2e = [r for r in records if r["kind"] == "e2e"]
        self.trials = max((trials(r) for r in e2e), default=1)  # the most any of these cells has (1: no intervals)
        # e2e cells stopped at two trials: GPU-bound and agreeing (lmperf.core.trials)
        self.gpu_bound_at_two = sum(r["metrics"].get("fewer_trials_because") == "gpu_bound" for r in e2e)

    ok = property(lambda self: [r for r in self.rows if r.training_ok])
    noisy = property(lambda self: [r for r in self.ok if r.cv is not None and r.cv >= LOW_CV])


class WarmupFacts:
    def __init__(self, records: list[dict], default: int, context_length: int):
        self.default = default
        cells = course_cells(records)
        self.rows = tuple(
            PhaseRow(cells.get((*k[:4], default)) if k[4] != default else None, r, STEP_PHASES)
            for k, r in cells.items()
            if k[1:4] == (context_length, "fp32", "eager") and est(r, STEP) is not None
        )

    def judged(self, fewer: bool) -> list[PhaseRow]:
        """The rows beside a default-count cell: without warm-up, or (``fewer``) with fewer steps."""
        keep = (lambda w: 0 < w < self.default) if fewer else (lambda w: w == 0)
        return [r for r in self.rows if keep(r.warmup_steps) and r.verdict("forward")]


class PrecisionFacts:
    def __init__(self, records: list[dict], warmup: int):
        cells = course_cells(records)
        bf16 = {k: cells.get((k[0], k[1], "bf16", *k[3:])) for k in cells if k[2:] == ("fp32", "eager", warmup)}
        # (fp32, bf16), default warm-up, eager
        self.rows = tuple(Pair(cells[k], r, PRECISION_PHASES) for k, r in bf16.items() if r)

    judged = property(lambda self: judged(self.rows))

    @property
    def by_size(self) -> dict[str, float]:  # each size's median training-step speed-up over its contexts
        sizes = dict.fromkeys(r.model for r in self.judged)
        return {m: statistics.median(r.speedup("step").median for r in self.judged if r.model == m) for m in sizes}

    @property
    def faster_from(self) -> str | None:
        """The smallest size from which bf16 is faster beyond the noise at every context of every size."""
        sizes = list(self.by_size)
        not_faster = [sizes.index(r.model) for r in self.judged if r.verdict("step") != "faster"]
        return (sizes[max(not_faster, default=-1) + 1 :] or [None])[0]  # the size after the last not faster


@dataclass(frozen=True)
class CompileRow(Pair):
    """(eager, compiled) at the default warm-up; ``cold``: the compile job's record's settings and metrics."""

    cold: dict


class CompileFacts:
    def __init__(self, records: list[dict], warmup: int):
        cells = course_cells(records)
        jobs = [r for r in records if r["kind"] == "e2e_compile"]  # older ones keep concurrent_compiles in settings
        job = {tuple(r["cell"].values()): r["provenance"]["settings"] | r["metrics"] for r in jobs}
        self.rows = tuple(
            CompileRow(cells.get((*k[:3], "eager", warmup)), r, MODEL_PHASES, job.get(k[:3], {}))
            for k, r in cells.items()
            if k[3:] == ("compiled", warmup)
        )
        done = {(r.model, r.context_length, r.precision) for r in self.rows}
        # model/context of the eager cells at a compiled precision without a compiled cell
        eager = (k for k in cells if k[3:] == ("eager", warmup) and k[:3] not in done and k[2] in {d[2] for d in done})
        self.uncompiled = tuple(dict.fromkeys(f"{k[0]}/{k[1]}" for k in eager))
        self.job_cells = len(job)  # records of the compile job
        # the most compiles running at once as one of them started, itself counted
        self.at_once = max((m.get("concurrent_compiles") or 0 for m in job.values()), default=0)

    # measured cells whose record counts on-disk compile cache hits
    loaded = property(lambda self: [r for r in self.rows if r.metrics.get("compile_cache_hits")])

    def cold(self, part: str) -> list[float]:
        """Cold compile times (s) of ``part`` (training, inference) where the job completed compiling it."""
        return [r.cold[f"{part}_compile_s"] for r in self.rows if r.cold.get(f"{part}_compile_s") is not None]


def timer_deviations(records: list[dict]) -> dict[tuple[str, str], tuple[float, ...]]:
    """Timer / CUDA events − 1 of each sample longer than TIMER_CHECK_MIN_MS, per (cell, phase), of the
    course's model's cells (other attentions share their coordinates with plain's: left out)."""
    series = {}
    for (model, ctx, precision, compiled, w), r in course_cells(records).items():
        m = r["metrics"]
        for phase in TIMER_PHASES:
            pairs = zip(m.get(f"{phase}_ms_samples") or [], m.get(f"{phase}_event_ms_samples") or [])
            if devs := tuple(t / e - 1 for t, e in pairs if t > TIMER_CHECK_MIN_MS and e > 0):
                series[(f"{model}, ctx {ctx}, {precision}, {compiled}, w={w}", phase)] = devs
    return series


class AttentionRow(Pair):
    """(plain, another attention) of one cell."""

    attention = property(lambda self: attention_of(self.other))

    @property
    def peak_mib(self) -> tuple:  # the training step's peak, (plain, this attention), where it ran
        return tuple(
            r["metrics"].get("training_peak_allocated_mib") if est(r, STEP) else None for r in (self.base, self.other)
        )

    @property
    def peak_ratio(self) -> float | None:
        base, other = self.peak_mib
        return other / base if base and other else None


def attention_rows(records: list[dict]) -> tuple[AttentionRow, ...]:
    """The cells run with another attention than plain, each against plain's cell of the same coordinates."""
    plain = course_cells(records)
    others = [r for r in records if r["kind"] == "e2e" and attention_of(r) != "plain"]
    others.sort(key=lambda r: (model_rank(r["cell"]["model"]), *key(r)[1:], attention_of(r)))
    return tuple(AttentionRow(plain.get(key(r)), r, MODEL_PHASES) for r in others)
