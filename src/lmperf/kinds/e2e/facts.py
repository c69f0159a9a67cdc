"""What the end-to-end records say: small frozen dataclasses, verdicts included, from pure functions.

Times are ``stats.Estimate``s (median over trials, 95% interval where there are several); a difference
between two runs of a cell is a ``stats.compare`` verdict (``faster``, ``slower``, ``within noise``).
Host-bound is said only where a record measures the GPU's busy share; never guessed from a ratio of times.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from lmperf.core import stats
from lmperf.core.sizes import SIZES, config_from_name, parameter_count
from lmperf.core.stats import Estimate

# Variability over a cell's measured steps (std/mean) under this reads as negligible.
LOW_CV = 0.05
# A step during which the GPU is busy less than this share of the time is host-bound.
HOST_BOUND_BUSY = 0.5
# Where a record keeps the GPU's busy share of a training step (the first one present is read).
BUSY_METRICS = ("gpu_busy_fraction", "training_step_gpu_busy_fraction")
# The timer check compares samples longer than this; a series agrees when every sample is within the share.
TIMER_CHECK_MIN_MS = 10.0
TIMER_AGREE_SHARE = 0.02
TIMER_PHASES = ("forward", "backward", "optimizer_step", "inference_forward")
STEP, INFERENCE = "training_step_ms_mean", "inference_forward_ms_mean"


def attention_of(record: dict) -> str:
    """The attention implementation the cell's model ran (its settings; the course's ``plain`` by default)."""
    return (record["provenance"].get("settings") or {}).get("attention", "plain")


def key(record: dict) -> tuple:  # (model, context_length, precision, compile, warmup_steps)
    return tuple(record["cell"][k] for k in ("model", "context_length", "precision", "compile", "warmup_steps"))


def model_rank(model: str) -> tuple:
    """Sizes sort by parameter count; names not registered go last."""
    return (0, parameter_count(config_from_name(model))) if model in SIZES else (1, model)


def sort_key(k: tuple) -> tuple:
    return (model_rank(k[0]), *k[1:])


def course_cells(records: list[dict]) -> dict[tuple, dict]:
    """The e2e records of the course's model (``plain`` attention) by cell, smallest size first."""
    cells = {key(r): r for r in records if r["kind"] == "e2e" and attention_of(r) == "plain"}
    return {k: cells[k] for k in sorted(cells, key=sort_key)}


def est(record: dict | None, name: str) -> Estimate | None:
    return None if record is None else stats.metric(record, name)


def cv(record: dict, phase: str) -> float | None:
    """std/mean of a phase's measured steps (the mean over trials' own CVs is not kept: the record's)."""
    m = record["metrics"]
    mean, std = m.get(f"{phase}_ms_mean"), m.get(f"{phase}_ms_std")
    return std / mean if mean and std is not None else None


def first_over_median(record: dict, phase: str) -> float | None:
    """The first measured step over the median of the others."""
    samples = record["metrics"].get(f"{phase}_ms_samples") or []
    return samples[0] / statistics.median(samples[1:]) if len(samples) > 1 else None


def busy(record: dict | None) -> Estimate | None:
    """The GPU's busy share of a training step, where the record measured it."""
    return next((e for e in (est(record, name) for name in BUSY_METRICS) if e is not None), None)


def trials(record: dict) -> int:
    return len(record["metrics"].get("trials") or []) or 1


def training_ok(record: dict) -> bool:
    return record["status"] == "ok" and record["metrics"].get("training_status", "ok") == "ok"


def compare(a: Estimate | None, b: Estimate | None) -> str | None:
    return None if a is None or b is None else stats.compare(a, b)


def speedup(slow: Estimate | None, fast: Estimate | None) -> Estimate | None:
    return None if slow is None or fast is None else stats.ratio(slow, fast)


# -- two ways of running one cell: fp32/bf16, eager/compiled, plain/another attention, warm-up counts --


@dataclass(frozen=True)
class Pair:
    """One cell run two ways: per phase the (base, other) times, e.g. (fp32, bf16) or (eager, compiled).
    A verdict of ``faster`` means the other way is faster than the base beyond the noise."""

    model: str
    context_length: int
    precision: str
    times: dict  # phase -> (base, other): Estimates, None where not measured (out of memory)
    busy: tuple = (None, None)  # the GPU's busy share of the training step, (base, other), where measured

    def speedup(self, phase: str) -> Estimate | None:
        """base time / other time."""
        return speedup(*self.times[phase])

    def verdict(self, phase: str) -> str | None:
        base, other = self.times[phase]
        return compare(other, base)

    @property
    def label(self) -> str:
        return f"{self.model}/{self.context_length}"


def times(pair: tuple[dict | None, dict | None], phases: dict[str, str]) -> dict:
    """{phase: (base, other)} from two records (None: not measured), ``phases``: phase -> metric."""
    return {phase: tuple(est(r, metric) for r in pair) for phase, metric in phases.items()}


def judged(rows, phase: str = "step") -> list:
    return [r for r in rows if r.verdict(phase)]


# -- benchmarking_script (b) ------------------------------------------------------------------------

STEP_PHASES = {"forward": "forward_ms_mean", "backward": "backward_ms_mean"}


@dataclass(frozen=True)
class PhaseRow:
    """One size and context at the default warm-up, fp32, eager; times None: the training step ran out of memory."""

    model: str
    context_length: int
    parameters: int | None
    times: dict  # phase -> Estimate of the mean over the measured steps
    std: dict  # phase -> std over the measured steps
    cvs: dict  # phase -> std / mean
    mfu: float | None
    busy: Estimate | None

    label = Pair.label

    @property
    def training_ok(self) -> bool:
        return all(self.times.values())

    @property
    def cv(self) -> float | None:
        values = [v for v in self.cvs.values() if v is not None]
        return max(values) if values else None

    @property
    def host_bound(self) -> bool | None:
        return None if self.busy is None else self.busy.median < HOST_BOUND_BUSY

    @property
    def unstable(self) -> bool:
        return any(e is not None and e.unstable for e in self.times.values())


@dataclass(frozen=True)
class TimingFacts:
    warmup_steps: int
    rows: tuple[PhaseRow, ...]
    trials: int  # the most trials any of these cells has (1: no intervals)

    @property
    def ok(self) -> list[PhaseRow]:
        return [r for r in self.rows if r.training_ok]

    @property
    def oom(self) -> list[PhaseRow]:
        return [r for r in self.rows if not r.training_ok]

    @property
    def backward_over_forward(self) -> list[float]:
        return [r.times["backward"].median / r.times["forward"].median for r in self.ok]

    @property
    def judged(self) -> list[PhaseRow]:
        return [r for r in self.ok if r.cv is not None]

    @property
    def noisy(self) -> list[PhaseRow]:
        """The cells whose variability is not negligible (CV at or above LOW_CV)."""
        return [r for r in self.judged if r.cv >= LOW_CV]


def timing_facts(records: list[dict], warmup: int) -> TimingFacts:
    rows = []
    for (model, ctx, precision, compiled, w), r in course_cells(records).items():
        if (precision, compiled, w) != ("fp32", "eager", warmup):
            continue
        m, ok = r["metrics"], training_ok(r)
        rows.append(
            PhaseRow(
                model,
                ctx,
                m.get("parameter_count"),
                times={p: est(r, name) if ok else None for p, name in STEP_PHASES.items()},
                std={p: m.get(f"{p}_ms_std") if ok else None for p in STEP_PHASES},
                cvs={p: cv(r, p) if ok else None for p in STEP_PHASES},
                mfu=m.get("training_step_mfu") if ok else None,
                busy=busy(r) if ok else None,
            )
        )
    count = max((trials(r) for r in records if r["kind"] == "e2e"), default=1)
    return TimingFacts(warmup, tuple(rows), count)


# -- benchmarking_script (c) ------------------------------------------------------------------------


@dataclass(frozen=True)
class WarmupRow(Pair):
    """(the default count's cell, this count's) per phase: ``slower`` where this count's mean is longer."""

    warmup_steps: int = 0
    cvs: dict = field(default_factory=dict)  # phase -> std / mean
    firsts: dict = field(default_factory=dict)  # phase -> first measured step / median of the others
    samples: tuple[float, ...] = ()  # the forward's measured steps


@dataclass(frozen=True)
class WarmupFacts:
    context_length: int
    default: int
    rows: tuple[WarmupRow, ...]

    def _judged(self, keep) -> list[WarmupRow]:
        return [r for r in self.rows if keep(r.warmup_steps) and r.verdict("forward")]

    @property
    def cold(self) -> list[WarmupRow]:  # without warm-up, beside a default-count cell
        return self._judged(lambda w: w == 0)

    @property
    def few(self) -> list[WarmupRow]:
        return self._judged(lambda w: 0 < w < self.default)


def warmup_facts(records: list[dict], default: int, context_length: int) -> WarmupFacts:
    cells = course_cells(records)
    rows = []
    for (model, ctx, precision, compiled, w), r in cells.items():
        if (ctx, precision, compiled) != (context_length, "fp32", "eager") or not training_ok(r):
            continue
        base = cells.get((model, ctx, precision, compiled, default))
        pair = (base if base is not None and training_ok(base) else None, r)
        rows.append(
            WarmupRow(
                model,
                ctx,
                precision,
                times(pair, STEP_PHASES),
                warmup_steps=w,
                cvs={p: cv(r, p) for p in STEP_PHASES},
                firsts={p: first_over_median(r, p) for p in STEP_PHASES},
                samples=tuple(r["metrics"].get("forward_ms_samples") or ()),
            )
        )
    return WarmupFacts(context_length, default, tuple(rows))


# -- benchmarking_mixed_precision (c) ---------------------------------------------------------------

PRECISION_PHASES = {**STEP_PHASES, "step": STEP}


@dataclass(frozen=True)
class PrecisionFacts:
    rows: tuple[Pair, ...]  # (fp32, bf16), default warm-up, eager
    cpu: bool

    @property
    def judged(self) -> list[Pair]:
        return judged(self.rows)

    @property
    def by_size(self) -> dict[str, list[float]]:  # each size's training-step speed-ups over its contexts
        out: dict[str, list[float]] = {}
        for r in self.judged:
            out.setdefault(r.model, []).append(r.speedup("step").median)
        return out

    @property
    def grows_with_size(self) -> bool:
        """At every context measured for both, the largest size's speed-up exceeds the smallest's beyond the noise."""
        sizes = list(self.by_size)
        ends = [[r for r in self.judged if r.model == m] for m in (sizes[0], sizes[-1])] if len(sizes) > 1 else [[], []]
        pairs = [(a, b) for a in ends[0] for b in ends[1] if a.context_length == b.context_length]
        return bool(pairs) and all(compare(a.speedup("step"), b.speedup("step")) == "faster" for a, b in pairs)

    @property
    def faster_from(self) -> str | None:
        """The smallest size from which bf16 is faster beyond the noise at every context of every size."""
        sizes = list(self.by_size)
        for i, model in enumerate(sizes):
            if all(r.verdict("step") == "faster" for r in self.judged if r.model in sizes[i:]):
                return model
        return None

    @property
    def host_bound(self) -> list[Pair]:
        """Rows whose bf16 step keeps the GPU busy under the host-bound share (measured rows only)."""
        return [r for r in self.judged if r.busy[1] is not None and r.busy[1].median < HOST_BOUND_BUSY]


def precision_facts(records: list[dict], warmup: int, cpu: bool) -> PrecisionFacts:
    cells = course_cells(records)
    rows = []
    for (model, ctx, precision, compiled, w), fp32 in cells.items():
        bf16 = cells.get((model, ctx, "bf16", compiled, w))
        if (precision, compiled, w) != ("fp32", "eager", warmup) or bf16 is None:
            continue
        pair = tuple(r if training_ok(r) else None for r in (fp32, bf16))
        rows.append(Pair(model, ctx, precision, times(pair, PRECISION_PHASES), tuple(busy(r) for r in pair)))
    return PrecisionFacts(tuple(rows), cpu)


# -- torch_compile (b) ------------------------------------------------------------------------------


def compile_scope(record: dict) -> str:
    """``blocks`` (each Transformer block and the final norm), or ``model``: before the setting, one graph."""
    return (record["provenance"].get("settings") or {}).get("compile_scope", "model")


@dataclass(frozen=True)
class CompileRow(Pair):
    """(eager, compiled) at the default warm-up; ``cold_*``: the compile job's compile times (s)."""

    scope: str = "model"
    cache_hits: int | None = None
    cold_training_s: float | None = None
    cold_inference_s: float | None = None


@dataclass(frozen=True)
class CompileFacts:
    rows: tuple[CompileRow, ...]
    uncompiled: tuple[int, ...]  # contexts with an eager cell and no compiled one
    # the compile job's cold compiles (records e2e_compile), per cell where the part completed compiling
    job_training_s: tuple[float, ...] = ()
    job_inference_s: tuple[float, ...] = ()
    job_at_once: int | None = None  # the most cells compiling at once
    job_wall_s: float | None = None  # first process start to last process end
    job_cells: int = 0

    @property
    def scopes(self) -> Counter:
        return Counter(r.scope for r in self.rows)

    @property
    def training_oom(self) -> list[CompileRow]:
        return [r for r in self.rows if r.times["step"][1] is None]

    @property
    def loaded(self) -> list[CompileRow]:  # measured cells whose record counts on-disk compile cache hits
        return [r for r in self.rows if r.cache_hits]


def compile_s(record: dict | None, part: str) -> float | None:
    """Dynamo's compile time of one part (training, inference); older records: the part's first call."""
    m = record["metrics"] if record else {}
    if m.get(f"{part}_compile_s") is not None:
        return m[f"{part}_compile_s"]
    first = m.get("training_first_step_ms" if part == "training" else "inference_first_forward_ms")
    return first / 1e3 if m.get(f"{part}_status") == "ok" and first is not None else None


def compile_job(job: list[dict]) -> dict:
    """The compile job's fields of CompileFacts, from its records."""
    spans = []
    for r in job:
        start, age = r["provenance"].get("process_start_time"), r["provenance"].get("process_age_s")
        if start and age is not None:
            spans.append((datetime.fromisoformat(start), datetime.fromisoformat(start) + timedelta(seconds=age)))
    at_once = [(r["provenance"].get("settings") or {}).get("concurrent_compiles") for r in job]
    return dict(
        job_cells=len(job),
        job_training_s=tuple(t for t in (compile_s(r, "training") for r in job) if t is not None),
        job_inference_s=tuple(t for t in (compile_s(r, "inference") for r in job) if t is not None),
        job_at_once=max((n for n in at_once if n is not None), default=None),
        job_wall_s=(max(e for _, e in spans) - min(b for b, _ in spans)).total_seconds() if spans else None,
    )


def compile_facts(records: list[dict], warmup: int) -> CompileFacts:
    cells = course_cells(records)
    job = [r for r in records if r["kind"] == "e2e_compile"]
    cold = {(r["cell"]["model"], r["cell"]["context_length"], r["cell"]["precision"]): r for r in job}
    rows = []
    for (model, ctx, precision, compiled, w), r in cells.items():
        if (compiled, w) != ("compiled", warmup):
            continue
        pair = (cells.get((model, ctx, precision, "eager", w)), r)
        steps = tuple(x if x is not None and training_ok(x) else None for x in pair)
        rows.append(
            CompileRow(
                model,
                ctx,
                precision,
                {**times(pair, {"inference": INFERENCE}), **times(steps, {"step": STEP})},
                scope=compile_scope(r),
                cache_hits=r["metrics"].get("compile_cache_hits"),
                cold_training_s=compile_s(cold.get((model, ctx, precision)), "training"),
                cold_inference_s=compile_s(cold.get((model, ctx, precision)), "inference"),
            )
        )
    eager_ctx = {k[1] for k in cells if (k[3], k[4]) == ("eager", warmup)}
    uncompiled = tuple(sorted(eager_ctx - {r.context_length for r in rows})) if rows else ()
    return CompileFacts(tuple(rows), uncompiled, **compile_job(job))


# -- timer_check ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimerFacts:
    """Timer / CUDA events − 1 of each sample longer than the threshold, as (cell, phase) series."""

    series: tuple[tuple[str, str, tuple[float, ...]], ...]  # (cell, phase, deviations)
    cells: int  # cells of the course's model
    left_out: tuple[str, ...]  # other attentions, whose cells are not compared (their coordinates are plain's)
    left_out_cells: int

    @property
    def deviations(self) -> list[float]:
        return [d for *_, devs in self.series for d in devs]

    @property
    def compared_cells(self) -> int:
        return len({cell for cell, *_ in self.series})

    @property
    def agreeing_samples(self) -> int:  # in the series whose every sample is within TIMER_AGREE_SHARE
        return sum(len(d) for *_, d in self.series if max(map(abs, d)) <= TIMER_AGREE_SHARE)

    @property
    def worst(self) -> tuple[float, str, str]:  # (|deviation|, cell, phase) of the worst sample
        return max((max(map(abs, d)), cell, phase) for cell, phase, d in self.series)


def timer_facts(records: list[dict]) -> TimerFacts:
    series, cells = [], course_cells(records)
    for (model, ctx, precision, compiled, w), r in cells.items():
        m = r["metrics"]
        for phase in TIMER_PHASES:
            pairs = zip(m.get(f"{phase}_ms_samples") or [], m.get(f"{phase}_event_ms_samples") or [])
            devs = tuple(t / e - 1 for t, e in pairs if t > TIMER_CHECK_MIN_MS and e > 0)
            if devs:
                series.append((f"{model}, ctx {ctx}, {precision}, {compiled}, w={w}", phase, devs))
    others = [r for r in records if r["kind"] == "e2e" and attention_of(r) != "plain"]
    return TimerFacts(tuple(series), len(cells), tuple(sorted({attention_of(r) for r in others})), len(others))


# -- flash_benchmarking, the whole model --------------------------------------------------------------


@dataclass(frozen=True)
class AttentionRow(Pair):
    """(plain, this attention); plain's own row has ``attention == "plain"`` and plain on both sides."""

    attention: str = "plain"
    peak_mib: tuple = (None, None)  # training peak, (plain, this attention)

    @property
    def peak_ratio(self) -> float | None:
        base, other = self.peak_mib
        return other / base if base and other else None


def attention_rows(records: list[dict]) -> tuple[AttentionRow, ...]:
    """The cells run with another attention than plain, each group led by plain's cell of the same coordinates."""
    groups: dict[tuple, dict[str, dict]] = {}
    for r in records:
        if r["kind"] == "e2e":
            groups.setdefault(key(r), {})[attention_of(r)] = r
    rows = []
    for k in sorted(groups, key=sort_key):
        by_name = {n: r if training_ok(r) else None for n, r in groups[k].items()}
        if set(by_name) == {"plain"}:
            continue
        for name in sorted(by_name, key=lambda n: (n != "plain", n)):
            pair = (by_name.get("plain"), by_name[name])
            peaks = tuple(r["metrics"].get("training_peak_allocated_mib") if r else None for r in pair)
            phases = times(pair, {"step": STEP, "inference": INFERENCE})
            rows.append(AttentionRow(k[0], k[1], k[2], phases, attention=name, peak_mib=peaks))
    return tuple(rows)
