"""Facts of the speed-ladder report, computed from records by pure functions (no pandas, no torch).

A ladder is one (model, context): its rungs are whatever records it has (``cell.rung``), ordered by
the record's ``rung_index``; a rung the code does not know is shown by its name. Each ladder gives a
waterfall: from the first rung that runs, along the parents the records name, to the fastest rung,
in time per token (batch sizes change along the way, so time per step does not compare). Its
parts are differences of one chain, so they add up to the total by construction.

MFU is read as the records give it: every metric named ``mfu…`` is a yardstick, parsed from its
name (``mfu_<ceiling>[_<precision>][_causal_half]``), never assumed.
"""

from __future__ import annotations

import dataclasses
import math
import re

from lmperf.core import stats
from lmperf.core.sizes import SIZES, config_from_name, parameter_count
from lmperf.core.stats import Estimate

# bytes a fused fp32 AdamW step moves per parameter: reads param, grad, exp_avg, exp_avg_sq, writes 3
ADAMW_BYTES_PER_PARAM = 28
# the profile replays the best rung; when the step time it read from the ladder then and the
# ladder record's now differ by more than this share, the two come from different runs
PROFILE_RUN_TOLERANCE = 0.005
# what a record from before issue 51 counted (lmperf.core.flops): every attention score
LEGACY_CONVENTION = "causal attention counted in full"
ALTERNATIVE_SUFFIX = "_causal_half"
UNFUSED_ATTENTION = {"plain"}  # attentions that compute every score, masked or not


@dataclasses.dataclass(frozen=True)
class Rung:
    """One rung's record, read: what it changed, its step time and what the record derives."""

    model: str
    context_length: int
    name: str
    index: float
    status: str
    reason: str | None
    parent: str | None
    change: str
    config: dict
    step_ms: Estimate | None
    step_statistic: str
    tokens_per_step: int | None
    compile_s: float | None
    first_step_s: float | None
    peak_gib: float | None
    mfu: dict
    flop_convention: str
    attention_kernel: str
    step_flops: float | None
    step_flops_causal_half: float | None
    parameter_count: int | None
    hbm_gbps: float | None
    wall_s: float
    commit: str

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


def scaled(e: Estimate, factor: float) -> Estimate:
    """The estimate times a positive constant (a unit change), interval included."""
    low = None if e.low is None else e.low * factor
    high = None if e.high is None else e.high * factor
    return Estimate(e.median * factor, low, high, e.trials, e.method)


def _num(metrics: dict, key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def rung_from_record(record: dict, order: list[str] | None = None) -> Rung:
    m, c = record["metrics"], record["cell"]
    statistic = m.get("step_statistic", "mean")  # records before the field timed by the mean
    order = order or []
    index = m.get("rung_index", order.index(c["rung"]) if c["rung"] in order else math.inf)
    config = m.get("config") or {}
    peak_mib = _num(m, "peak_allocated_mib")
    return Rung(
        model=c["model"],
        context_length=int(c["context_length"]),
        name=c["rung"],
        index=float(index),
        status=record["status"],
        reason=record.get("reason"),
        parent=m.get("parent"),
        change=m.get("change") or c["rung"],
        config=config,
        step_ms=stats.metric(record, f"step_ms_{statistic}") if record["status"] == "ok" else None,
        step_statistic=statistic,
        tokens_per_step=m.get("tokens_per_step"),
        compile_s=_num(m, "compile_s"),
        first_step_s=_num(m, "first_step_s"),
        peak_gib=None if peak_mib is None else peak_mib / 1024,
        mfu={k: float(v) for k, v in m.items() if k.startswith("mfu") and _num(m, k) is not None},
        flop_convention=m.get("flop_convention") or LEGACY_CONVENTION,
        attention_kernel=m.get("attention_kernel") or config.get("attention") or "—",
        step_flops=_num(m, "step_flops"),
        step_flops_causal_half=_num(m, "step_flops_causal_half"),
        parameter_count=m.get("parameter_count"),
        hbm_gbps=_num(m, "datasheet_hbm_gbps"),
        wall_s=_num(m, "rung_wall_s") or 0.0,
        commit=(record["provenance"].get("git_commit") or "unknown")[:7],
    )


def model_rank(model: str) -> tuple:
    """Registered sizes by parameter count, then any other name alphabetically."""
    if model in SIZES:
        return (0, parameter_count(config_from_name(model)), model)
    return (1, 0, model)


# -- the waterfall ---------------------------------------------------------------------------------


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

    @property
    def factor(self) -> float:
        return self.before_us.median / self.after_us.median


@dataclasses.dataclass(frozen=True)
class Ladder:
    model: str
    context_length: int
    rungs: tuple[Rung, ...]
    start: Rung | None  # where the waterfall starts: the first rung of the best rung's chain
    best: Rung | None
    chain: tuple[Step, ...]  # start -> ... -> best, each rung against its parent
    not_kept: tuple[Step, ...]  # rungs that ran, off the chain (the next rungs built on another)
    failed: tuple[Rung, ...]
    speedup: Estimate | None  # best tokens/s over start's

    @property
    def baseline_fits(self) -> bool:
        return any(r.name == "baseline" and r.ok for r in self.rungs)

    @property
    def total_saved_us(self) -> float:
        """start - best in µs per token: the sum of the chain's savings (a telescoping sum)."""
        return self.start.us_per_token.median - self.best.us_per_token.median if self.best else math.nan

    @property
    def largest(self) -> Step | None:
        return max(self.chain, key=lambda s: s.factor, default=None)

    @property
    def wall_s(self) -> float:
        return sum(r.wall_s for r in self.rungs)


def step_of(rung: Rung, parent: Rung) -> Step:
    verdict = stats.compare(rung.us_per_token, parent.us_per_token)
    return Step(rung.name, parent.name, parent.us_per_token, rung.us_per_token, verdict)


def chain_to(best: Rung, by_name: dict[str, Rung]) -> list[Rung]:
    """best, its parent, the parent's parent, … while the parent ran; returned first to last."""
    chain, seen = [best], {best.name}
    while True:
        parent = by_name.get(chain[-1].parent or "")
        if parent is None or not parent.ok or parent.name in seen:
            return chain[::-1]
        chain.append(parent)
        seen.add(parent.name)


def build_ladder(rungs: list[Rung]) -> Ladder:
    rungs = sorted(rungs, key=lambda r: (r.index, r.name))
    by_name = {r.name: r for r in rungs}
    ok = [r for r in rungs if r.ok]
    failed = tuple(r for r in rungs if not r.ok)
    head = rungs[0]
    if not ok:
        return Ladder(head.model, head.context_length, tuple(rungs), None, None, (), (), failed, None)
    best = max(ok, key=lambda r: r.tokens_per_s)
    chain = chain_to(best, by_name)
    on_chain = {r.name for r in chain}
    steps = tuple(step_of(r, p) for p, r in zip(chain, chain[1:]))
    not_kept = tuple(
        step_of(r, by_name[r.parent])
        for r in ok
        if r.name not in on_chain and r.parent in by_name and by_name[r.parent].ok
    )
    speedup = stats.ratio(chain[0].us_per_token, best.us_per_token)
    return Ladder(head.model, head.context_length, tuple(rungs), chain[0], best, steps, not_kept, failed, speedup)


def ladders_from(records: list[dict], order: list[str] | None = None) -> list[Ladder]:
    """One Ladder per (model, context) of the ladder records, by context then model size."""
    groups: dict[tuple, list[Rung]] = {}
    for record in records:
        if record["kind"] == "ladder":
            rung = rung_from_record(record, order)
            groups.setdefault((rung.model, rung.context_length), []).append(rung)
    keys = sorted(groups, key=lambda k: (k[1], model_rank(k[0])))
    return [build_ladder(groups[k]) for k in keys]


def round_parts(parts: list[float], digits: int) -> list[float]:
    """Parts rounded to ``digits`` so that they add up to their rounded total (largest remainder)."""
    unit = 10.0**-digits
    total = round(sum(parts) / unit)
    floors = [math.floor(p / unit) for p in parts]
    order = sorted(range(len(parts)), key=lambda i: -(parts[i] / unit - floors[i]))
    for i in order[: total - sum(floors)]:
        floors[i] += 1
    return [round(f * unit, digits) for f in floors]


# -- MFU yardsticks, read from the metric names ----------------------------------------------------

CEILING_WORDS = {"datasheet": "datasheet peak", "measured": "measured GEMM ceiling"}
PRECISION = re.compile(r"^(fp|bf|tf)\d+\w*$")


@dataclasses.dataclass(frozen=True)
class Yardstick:
    """What an ``mfu…`` metric divides by, parsed from its name."""

    key: str
    ceiling: str | None  # datasheet | measured | None (the record's own definition)
    precision: str | None  # bf16, fp8, … | None: the rung's own matmul precision
    alternative: bool  # counted with causal attention half (the ``_causal_half`` twin)
    extra: str = ""  # name parts this code does not know, shown as they are

    @property
    def words(self) -> str:
        """'the bf16 datasheet peak', 'the measured bf16 GEMM ceiling', …"""
        if self.ceiling is None and not self.extra:
            return "the peak the record names (`mfu`)"
        if self.ceiling not in CEILING_WORDS:
            return f"`{self.key}`"
        precision = self.precision or "rung's own precision"
        if self.ceiling == "measured":
            text = f"the measured {precision} GEMM ceiling"
        else:
            text = f"the {precision} datasheet peak"
        return text + (f" ({self.extra})" if self.extra else "")

    @property
    def column(self) -> str:
        name = f"{self.precision or 'own'} {self.ceiling or self.key}" + (f" {self.extra}" if self.extra else "")
        return f"MFU {name}" + (", attention half" if self.alternative else "")


def parse_yardstick(key: str) -> Yardstick:
    rest = key[len("mfu") :].strip("_")
    alternative = rest.endswith(ALTERNATIVE_SUFFIX.strip("_"))
    rest = rest.removesuffix(ALTERNATIVE_SUFFIX.strip("_")).strip("_")
    tokens = [t for t in rest.split("_") if t]
    ceiling = tokens.pop(0) if tokens and tokens[0] in CEILING_WORDS else None
    if ceiling == "measured" and tokens[:1] == ["ceiling"]:
        tokens.pop(0)
    precision = next((t for t in tokens if PRECISION.match(t)), None)
    extra = " ".join(t for t in tokens if t != precision)
    if ceiling is None and tokens:
        ceiling = "other"
    return Yardstick(key, ceiling, precision, alternative, extra)


def yardstick_rank(y: Yardstick) -> tuple:
    """Common yardsticks (an explicit precision, bf16 first) before the rung's own; datasheet first."""
    ceiling = {"datasheet": 0, "measured": 1}.get(y.ceiling, 2)
    return (y.alternative, y.precision is None, y.precision != "bf16", y.precision or "", ceiling, y.key)


def yardsticks(rungs) -> list[Yardstick]:
    """Every yardstick some ok rung gives a value for, in order of rank."""
    keys = {k for r in rungs if r.ok for k in r.mfu}
    return sorted(map(parse_yardstick, keys), key=yardstick_rank)


def headline(rungs) -> Yardstick | None:
    """The yardstick the sentences and the figures' labels use: the first one of a common precision."""
    found = yardsticks(rungs)
    common = [y for y in found if y.precision and not y.alternative]
    return (common or found or [None])[0]


def alternative_of(y: Yardstick | None, rungs) -> Yardstick | None:
    """The same yardstick counted with causal attention half, if the records give it."""
    if y is None or y.alternative:
        return None
    key = y.key + ALTERNATIVE_SUFFIX
    return parse_yardstick(key) if any(key in r.mfu for r in rungs) else None


# -- the answer across ladders ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Answer:
    """What the section's first sentences say, across every ladder of the device."""

    ladders: int
    ran: int  # ladders with at least one rung that ran
    single: tuple[Ladder, ...]  # ladders where one rung ran (no waterfall)
    baseline_fits: int
    slowest: Ladder | None  # the smallest speed-up of best over start
    fastest: Ladder | None  # the largest
    top: Ladder | None  # the highest headline MFU
    gains: tuple[tuple[str, int], ...]  # the rung that is each ladder's largest single gain, counted
    longest_compile: Rung | None  # the rung whose compile took longest (records that give one)


def answer_facts(ladders: list[Ladder], head: Yardstick | None) -> Answer:
    ran = [la for la in ladders if la.best is not None]
    by_speedup = sorted((la for la in ran if la.chain), key=lambda la: la.speedup.median)
    with_mfu = [la for la in ran if head and head.key in la.best.mfu]
    compiled = [r for la in ladders for r in la.rungs if r.ok and r.compile_s is not None]
    counts: dict[str, int] = {}
    for ladder in ran:
        if ladder.largest is not None:
            counts[ladder.largest.rung] = counts.get(ladder.largest.rung, 0) + 1
    return Answer(
        ladders=len(ladders),
        ran=len(ran),
        single=tuple(la for la in ran if not la.chain),
        baseline_fits=sum(la.baseline_fits for la in ladders),
        slowest=by_speedup[0] if by_speedup else None,
        fastest=by_speedup[-1] if by_speedup else None,
        top=max(with_mfu, key=lambda la: la.best.mfu[head.key]) if with_mfu else None,
        gains=tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        longest_compile=max(compiled, key=lambda r: r.compile_s, default=None),
    )


@dataclasses.dataclass(frozen=True)
class CpuPrecision:
    """On a CPU: the bf16 rung against its parent, and the square GEMM rates of bf16 and fp32."""

    parent: str
    speed: Estimate  # bf16's tokens/s over its parent's
    verdict: str  # faster | within noise | slower (stats.compare)
    gemm_bf16_over_fp32: float | None


def cpu_precision(ladder: Ladder, gemm_tflops: dict[str, float]) -> CpuPrecision | None:
    by_name = {r.name: r for r in ladder.rungs}
    bf16 = by_name.get("bf16")
    parent = by_name.get(bf16.parent or "") if bf16 else None
    if bf16 is None or parent is None or not bf16.ok or not parent.ok:
        return None
    fp32, b = gemm_tflops.get("fp32"), gemm_tflops.get("bf16")
    return CpuPrecision(
        parent=parent.name,
        speed=stats.ratio(parent.us_per_token, bf16.us_per_token),
        verdict=stats.compare(bf16.us_per_token, parent.us_per_token),
        gemm_bf16_over_fp32=b / fp32 if b and fp32 else None,
    )
