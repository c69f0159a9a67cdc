"""Facts of the speed-ladder report, from records (no torch). A ladder is one (model, context), its rungs
ordered by ``rung_index``; its waterfall runs from the first rung that runs along the parents the
records name to the fastest rung, in time per token, so its parts add up to the total.
"""

from __future__ import annotations

import collections
import dataclasses
import math

from lmperf.core import stats
from lmperf.core.sizes import SIZES, config_from_name, parameter_count
from lmperf.core.stats import Estimate

# bytes a fused fp32 AdamW step moves per parameter: reads param, grad, exp_avg, exp_avg_sq, writes 3
ADAMW_BYTES_PER_PARAM = 28
UNFUSED_ATTENTION = {"plain"}  # attentions that compute every score, masked or not
LEGACY_CONVENTION = "causal attention counted in full"  # records from before the field
# MFU metrics (lmperf.kinds.ladder.cell) -> what they divide by; the first one the rungs give heads the
# sentences and figures. An FP8 rung's bf16 ones are its bf16-equivalent MFU.
YARDSTICKS = {
    "mfu_datasheet_bf16": "the bf16 datasheet peak",
    "mfu_measured_bf16": "the measured bf16 GEMM ceiling",
    "mfu_datasheet_fp8": "the fp8 datasheet peak",
    "mfu_measured_fp8": "the measured fp8 GEMM ceiling",
}


def scaled(e: Estimate, factor: float) -> Estimate:
    """The estimate times a positive constant (a unit change), interval included."""
    low, high = (None, None) if e.low is None else (e.low * factor, e.high * factor)
    return Estimate(e.median * factor, low, high, e.trials, e.method)


def number(metrics: dict, key: str) -> float | None:
    """``metrics[key]`` as a float; None where it is not a number."""
    value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclasses.dataclass(frozen=True)
class Rung:
    """One rung's record, read."""

    model: str
    context_length: int
    name: str
    index: float
    status: str
    reason: str | None
    parent: str | None
    kept: bool | None  # whether later rungs may build on it (its first trial beat its parent beyond the margin)
    change: str
    config: dict
    step_ms: Estimate | None
    tokens_per_step: int | None
    compile_s: float | None
    first_step_s: float | None
    peak_gib: float | None
    mfu: dict  # YARDSTICKS key -> share
    flop_convention: str
    attention_kernel: str
    step_flops: float | None
    step_flops_causal_half: float | None
    parameter_count: int | None
    hbm_gbps: float | None
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.us_per_token is not None

    @property
    def us_per_token(self) -> Estimate | None:
        if self.step_ms is None or not self.tokens_per_step:
            return None
        return scaled(self.step_ms, 1e3 / self.tokens_per_step)

    @property
    def tokens_per_s(self) -> float:
        return 1e6 / self.us_per_token.median if self.ok else math.nan

    @property
    def batch_words(self) -> str:
        batch, accum = self.config.get("batch_size"), self.config.get("accumulation_steps") or 1
        return "—" if batch is None else f"{batch}" + (f"×{accum}" if accum > 1 else "")


def rung_from_record(record: dict, order: list[str] | None = None) -> Rung:
    m, c, order = record["metrics"], record["cell"], order or []
    config = m.get("config") or {}
    peak_mib = number(m, "peak_allocated_mib")
    return Rung(
        model=c["model"],
        context_length=int(c["context_length"]),
        name=c["rung"],
        index=float(m.get("rung_index", order.index(c["rung"]) if c["rung"] in order else math.inf)),
        status=record["status"],
        reason=record.get("reason"),
        parent=m.get("parent"),
        kept=m.get("kept"),
        change=m.get("change") or c["rung"],
        config=config,
        step_ms=stats.metric(record, "step_ms_median") if record["status"] == "ok" else None,
        tokens_per_step=m.get("tokens_per_step"),
        compile_s=number(m, "compile_s"),
        first_step_s=number(m, "first_step_s"),
        peak_gib=None if peak_mib is None else peak_mib / 1024,
        mfu={k: float(m[k]) for k in YARDSTICKS if number(m, k) is not None},
        flop_convention=m.get("flop_convention") or LEGACY_CONVENTION,
        attention_kernel=m.get("attention_kernel") or config.get("attention") or "—",
        step_flops=number(m, "step_flops"),
        step_flops_causal_half=number(m, "step_flops_causal_half"),
        parameter_count=m.get("parameter_count"),
        hbm_gbps=number(m, "datasheet_hbm_gbps"),
        wall_s=number(m, "rung_wall_s") or 0.0,
    )


def model_rank(model: str) -> tuple:
    """Registered sizes by parameter count, then any other name alphabetically."""
    return (0, parameter_count(config_from_name(model)), model) if model in SIZES else (1, 0, model)


@dataclasses.dataclass(frozen=True)
class Step:
    """A rung against its parent, in time per token; ``verdict`` from the intervals (stats.compare)."""

    rung: str
    parent: str
    before_us: Estimate
    after_us: Estimate
    verdict: str

    @property
    def saved_us(self) -> float:
        return self.before_us.median - self.after_us.median


@dataclasses.dataclass(frozen=True)
class Ladder:
    model: str
    context_length: int
    rungs: tuple[Rung, ...]
    start: Rung | None  # the first rung of the best rung's chain
    best: Rung | None
    chain: tuple[Step, ...]  # start -> ... -> best, each rung against its parent
    not_kept: tuple[Step, ...]  # rungs that ran off the chain (the next rungs built on another)
    failed: tuple[Rung, ...]
    speedup: Estimate | None  # best tokens/s over start's

    @property
    def largest(self) -> Step | None:
        return max(self.chain, key=lambda s: s.before_us.median / s.after_us.median, default=None)

    @property
    def wall_s(self) -> float:
        return sum(r.wall_s for r in self.rungs)


def step_of(rung: Rung, parent: Rung) -> Step:
    verdict = stats.compare(rung.us_per_token, parent.us_per_token)
    return Step(rung.name, parent.name, parent.us_per_token, rung.us_per_token, verdict)


def build_ladder(rungs: list[Rung]) -> Ladder:
    rungs = sorted(rungs, key=lambda r: (r.index, r.name))
    by_name, ok = {r.name: r for r in rungs}, [r for r in rungs if r.ok]
    ladder = (rungs[0].model, rungs[0].context_length, tuple(rungs))
    failed = tuple(r for r in rungs if not r.ok)
    if not ok:
        return Ladder(*ladder, None, None, (), (), failed, None)
    chain = [max(ok, key=lambda r: r.tokens_per_s)]  # best, its parent, … while the parent ran
    while (p := by_name.get(chain[-1].parent or "")) is not None and p.ok and p not in chain:
        chain.append(p)
    chain.reverse()
    steps = tuple(step_of(r, p) for p, r in zip(chain, chain[1:]))
    not_kept = tuple(
        step_of(r, by_name[r.parent]) for r in ok if r not in chain and r.parent in by_name and by_name[r.parent].ok
    )
    speedup = stats.ratio(chain[0].us_per_token, chain[-1].us_per_token)
    return Ladder(*ladder, chain[0], chain[-1], steps, not_kept, failed, speedup)


def ladders_from(records: list[dict], order: list[str] | None = None) -> list[Ladder]:
    """One Ladder per (model, context) of the ladder records, by context then model size."""
    groups: dict[tuple, list[Rung]] = {}
    for record in records:
        if record["kind"] == "ladder":
            rung = rung_from_record(record, order)
            groups.setdefault((rung.model, rung.context_length), []).append(rung)
    return [build_ladder(groups[k]) for k in sorted(groups, key=lambda k: (k[1], model_rank(k[0])))]


@dataclasses.dataclass(frozen=True)
class Fp8Gain:
    """A ladder's fastest FP8 rung against its fastest bf16 rung without FP8."""

    model: str
    context_length: int
    bf16: Rung
    fp8: Rung
    speedup: Estimate  # the FP8 rung's tokens/s over the bf16 rung's
    verdict: str  # stats.compare of the FP8 rung's time per token against the bf16 rung's


def fp8_gains(ladders: list[Ladder]) -> list[Fp8Gain]:
    """One Fp8Gain per ladder where an FP8 rung and a bf16 rung without FP8 both ran."""
    gains = []
    for la in ladders:
        bf16 = [r for r in la.rungs if r.ok and r.config.get("precision") == "bf16"]
        with_fp8 = [r for r in bf16 if r.config.get("fp8")]
        without = [r for r in bf16 if not r.config.get("fp8")]
        if with_fp8 and without:
            f, b = (max(rs, key=lambda r: r.tokens_per_s) for rs in (with_fp8, without))
            ratio, verdict = stats.ratio(b.us_per_token, f.us_per_token), stats.compare(f.us_per_token, b.us_per_token)
            gains.append(Fp8Gain(la.model, la.context_length, b, f, ratio, verdict))
    return gains


def round_parts(parts: list[float], digits: int) -> list[float]:
    """Parts rounded to ``digits`` so that they add up to their rounded total (largest remainder)."""
    unit = 10.0**-digits
    total = round(sum(parts) / unit)
    floors = [math.floor(p / unit) for p in parts]
    order = sorted(range(len(parts)), key=lambda i: -(parts[i] / unit - floors[i]))
    for i in order[: total - sum(floors)]:
        floors[i] += 1
    return [round(f * unit, digits) for f in floors]


def yardsticks(rungs) -> list[str]:
    """The MFU metrics some ok rung gives, in YARDSTICKS' order; the first is the headline."""
    return [k for k in YARDSTICKS if any(r.ok and k in r.mfu for r in rungs)]


@dataclasses.dataclass(frozen=True)
class Answer:
    """What the section's first sentences say, across every ladder of the device."""

    ladders: int
    ran: int  # ladders with a rung that ran
    baseline_fits: int
    slowest: Ladder | None  # the smallest speed-up of best over start (ladders with a chain)
    fastest: Ladder | None
    top: Ladder | None  # the highest headline MFU
    gains: tuple[tuple[str, int], ...]  # the rung that is each ladder's largest gain, counted
    longest_compile: Rung | None


def answer_facts(ladders: list[Ladder], head: str | None) -> Answer:
    ran = [la for la in ladders if la.best is not None]
    by_speedup = sorted((la for la in ran if la.chain), key=lambda la: la.speedup.median)
    with_mfu = [la for la in ran if head in la.best.mfu]
    counts = collections.Counter(la.largest.rung for la in ran if la.largest is not None)
    compiled = [r for la in ladders for r in la.rungs if r.ok and r.compile_s is not None]
    return Answer(
        ladders=len(ladders),
        ran=len(ran),
        baseline_fits=sum(any(r.name == "baseline" and r.ok for r in la.rungs) for la in ladders),
        slowest=by_speedup[0] if by_speedup else None,
        fastest=by_speedup[-1] if by_speedup else None,
        top=max(with_mfu, key=lambda la: la.best.mfu[head]) if with_mfu else None,
        gains=tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        longest_compile=max(compiled, key=lambda r: r.compile_s, default=None),
    )
