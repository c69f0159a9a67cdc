"""Facts of the speed-ladder report, from records (no torch). A ladder is one (model, context), its rungs
ordered by ``rung_index``; its waterfall runs from the first rung that runs along the parents the
records name to the fastest rung, in time per token, so its parts add up to the total.
"""

from __future__ import annotations

import collections
import math

from lmperf.core import stats
from lmperf.core.stats import Estimate
from lmperf.report.common import model_rank

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


class Rung:
    """One rung's record, read."""

    def __init__(self, record: dict, order: list[str] | None = None):
        m, c, order = record["metrics"], record["cell"], order or []
        self.model, self.context_length, self.name = c["model"], int(c["context_length"]), c["rung"]
        self.index = float(m.get("rung_index", order.index(self.name) if self.name in order else math.inf))
        self.status, self.reason = record["status"], record.get("reason")
        self.parent = m.get("parent")
        # kept: whether later rungs may build on it (its first trial beat its parent beyond the margin)
        self.kept = m.get("kept")
        self.change, self.config = m.get("change") or self.name, m.get("config") or {}
        self.step_ms = stats.metric(record, "step_ms_median") if self.status == "ok" else None
        self.tokens_per_step = m.get("tokens_per_step")
        self.compile_s, self.first_step_s = number(m, "compile_s"), number(m, "first_step_s")
        peak_mib = number(m, "peak_allocated_mib")
        self.peak_gib = None if peak_mib is None else peak_mib / 1024
        self.mfu = {k: float(m[k]) for k in YARDSTICKS if number(m, k) is not None}  # YARDSTICKS key -> share
        self.flop_convention = m.get("flop_convention") or LEGACY_CONVENTION
        self.attention_kernel = m.get("attention_kernel") or self.config.get("attention") or "—"
        self.step_flops, self.step_flops_causal_half = number(m, "step_flops"), number(m, "step_flops_causal_half")
        self.parameter_count, self.hbm_gbps = m.get("parameter_count"), number(m, "datasheet_hbm_gbps")
        self.wall_s = number(m, "rung_wall_s") or 0.0
        ran = self.step_ms is not None and self.tokens_per_step
        self.us_per_token = scaled(self.step_ms, 1e3 / self.tokens_per_step) if ran else None
        self.ok = self.status == "ok" and self.us_per_token is not None
        self.tokens_per_s = 1e6 / self.us_per_token.median if self.ok else math.nan


class Step:
    """A rung against its parent, in time per token; ``verdict`` from the intervals (stats.compare)."""

    def __init__(self, rung: Rung, parent: Rung):
        self.rung, self.parent = rung.name, parent.name
        self.before_us, self.after_us = parent.us_per_token, rung.us_per_token
        self.verdict = stats.compare(rung.us_per_token, parent.us_per_token)
        self.saved_us = self.before_us.median - self.after_us.median


class Ladder:
    """One (model, context), its rungs by ``rung_index``: the chain of steps from ``start`` (the first rung of
    the best rung's chain) to ``best``, each rung against its parent (a rung on it may be one its record says
    was not kept); ``off_chain``, the rungs that ran off it; ``speedup``, best's tokens/s over start's."""

    def __init__(self, rungs: list[Rung]):
        self.rungs = tuple(sorted(rungs, key=lambda r: (r.index, r.name)))
        self.model, self.context_length = self.rungs[0].model, self.rungs[0].context_length
        self.failed = tuple(r for r in self.rungs if not r.ok)
        self.start = self.best = self.speedup = None
        self.chain = self.off_chain = ()
        by_name, ok = {r.name: r for r in self.rungs}, [r for r in self.rungs if r.ok]
        if not ok:
            return
        chain = [max(ok, key=lambda r: r.tokens_per_s)]  # best, its parent, … while the parent ran
        while (p := by_name.get(chain[-1].parent or "")) is not None and p.ok and p not in chain:
            chain.append(p)
        chain.reverse()
        self.start, self.best = chain[0], chain[-1]
        self.chain = tuple(Step(r, p) for p, r in zip(chain, chain[1:]))
        self.off_chain = tuple(
            Step(r, by_name[r.parent]) for r in ok if r not in chain and r.parent in by_name and by_name[r.parent].ok
        )
        self.speedup = stats.ratio(self.start.us_per_token, self.best.us_per_token)


def ladders_from(records: list[dict], order: list[str] | None = None) -> list[Ladder]:
    """One Ladder per (model, context) of the ladder records, by context then model size."""
    groups: dict[tuple, list[Rung]] = {}
    for record in records:
        if record["kind"] == "ladder":
            rung = Rung(record, order)
            groups.setdefault((rung.model, rung.context_length), []).append(rung)
    return [Ladder(groups[k]) for k in sorted(groups, key=lambda k: (k[1], model_rank(k[0])))]


# a ladder's fastest FP8 rung against its fastest bf16 rung without FP8: the FP8 rung's tokens/s over the
# bf16 rung's (an Estimate) and stats.compare of their times per token
Fp8Gain = collections.namedtuple("Fp8Gain", "model context_length bf16 fp8 speedup verdict")


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


# what the section's first sentences say, across every ladder of the device: how many ladders, ran (have
# a rung that ran) and the baseline fits; the ladders with the smallest and the largest speed-up of best over
# start (ladders with a chain), those whose speed-up is within the noise, and with the highest headline MFU;
# (rung, how many ladders) it is the largest gain of, beyond the noise; the rung with the longest compile
Answer = collections.namedtuple("Answer", "ladders ran baseline_fits slowest fastest noise top gains longest_compile")


def answer_facts(ladders: list[Ladder], head: str | None) -> Answer:
    ran = [la for la in ladders if la.best is not None]
    by_speedup = sorted((la for la in ran if la.chain), key=lambda la: la.speedup.median)
    with_mfu = [la for la in ran if head in la.best.mfu]
    largest = (max(la.chain, key=lambda s: s.before_us.median / s.after_us.median) for la in ran if la.chain)
    counts = collections.Counter(s.rung for s in largest if s.verdict == "faster")
    compiled = [r for la in ladders for r in la.rungs if r.ok and r.compile_s is not None]
    return Answer(
        ladders=len(ladders),
        ran=len(ran),
        baseline_fits=sum(any(r.name == "baseline" and r.ok for r in la.rungs) for la in ladders),
        slowest=by_speedup[0] if by_speedup else None,
        fastest=by_speedup[-1] if by_speedup else None,
        noise=tuple(la for la in by_speedup if Step(la.best, la.start).verdict == "within noise"),
        top=max(with_mfu, key=lambda la: la.best.mfu[head]) if with_mfu else None,
        gains=tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        longest_compile=max(compiled, key=lambda r: r.compile_s, default=None),
    )
