"""The facts behind nsys_profile (a)–(e): pure functions of the per-cell frame. A difference of times is a
verdict only through ``stats.compare``; where the time goes comes from the kernel class shares."""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter

import pandas as pd

from lmperf.core import stats
from lmperf.kinds.nsys.cells import ok

NON_TRIVIAL_SHARE = 0.02  # (c): a kernel's share of the forward's kernel time that counts
BUSY = 0.9  # (a): a forward is host-bound when its kernels keep the device busy for less of it
VERDICTS = ("faster", "within noise", "slower")


@dataclasses.dataclass(frozen=True)
class Spread:
    """The median of some cells' values and their range (n = 0: no values)."""

    median: float | None = None
    low: float | None = None
    high: float | None = None
    n: int = 0


def spread(values) -> Spread:
    vals = [float(v) for v in values if pd.notna(v)]
    return Spread(statistics.median(vals), min(vals), max(vals), len(vals)) if vals else Spread()


def judged(pairs) -> list[str]:
    """``stats.compare``'s verdict on each (profiled time, Estimate) pair."""
    return [stats.compare(stats.Estimate(float(a)), b) for a, b in pairs]


def verdicts(said: list[str]) -> dict[str, int]:
    """How many of the verdicts are faster, within noise, slower."""
    return {v: said.count(v) for v in VERDICTS}


def _ranked(series) -> list[tuple[str, int]]:
    """Values by how many cells have them, most first (ties by name)."""
    return sorted(Counter(v for v in series if isinstance(v, str)).items(), key=lambda kn: (-kn[1], kn[0]))


@dataclasses.dataclass(frozen=True)
class ForwardCheck:
    """(a) The profiler's forward time against the timer in the same process and the unprofiled e2e runs."""

    cells: int
    over_timer: Spread  # profiler range / timer, same process
    timer_verdicts: dict[str, int]
    busy: Spread  # kernel time / profiler range
    e2e_verdicts: dict[str, int]  # profiler range against the unprofiled e2e forward
    slower_busy: Spread  # kernel time / unprofiled forward, in the cells profiling slowed

    @property
    def matches_timer(self) -> bool:
        return self.cells > 0 and self.timer_verdicts["within noise"] == self.cells

    @property
    def slowed_where_idle(self) -> bool:
        """Whether the forwards profiling slowed are host-bound: their kernels fill less than BUSY of the
        unprofiled forward (median)."""
        return self.slower_busy.n > 0 and self.slower_busy.median < BUSY


def forward_check(df: pd.DataFrame) -> ForwardCheck | None:
    inf = ok(df, "inference")
    if inf.empty:
        return None
    timed = list(zip(inf.inference_fwd_nvtx_ms, inf.inference_fwd_timer))
    e2e = inf[inf.inference_fwd_e2e.notna()]  # the cells with an e2e record
    e2e_said = judged(zip(e2e.inference_fwd_nvtx_ms, e2e.inference_fwd_e2e))
    busy = e2e.inference_fwd_kernel_ms / [e.median for e in e2e.inference_fwd_e2e]  # over the unprofiled forward
    return ForwardCheck(
        len(inf),
        spread(p / t.median for p, t in timed),
        verdicts(judged(timed)),
        spread(inf.inference_fwd_kernel_ms / inf.inference_fwd_nvtx_ms),
        verdicts(e2e_said),
        spread(b for b, v in zip(busy, e2e_said) if v == "slower"),
    )


@dataclasses.dataclass(frozen=True)
class TopKernel:
    """(b) The forward's top kernel: which, in how many cells, its launches, and forward + backward's."""

    cells: int
    top: str  # the label most cells have as their forward's top kernel
    top_cells: int
    launches: Spread  # its launches per forward, in the cells it leads
    fb_cells: int
    fb_same: int  # cells whose forward + backward top kernel is the forward's
    fb_most: tuple[str, int] | None  # the most frequent top kernel of forward + backward, and its cells


def top_kernel(df: pd.DataFrame) -> TopKernel | None:
    inf = ok(df, "inference")
    if not (ranked := _ranked(inf.get("inference_fwd_top_kernel", []))):
        return None
    (top, n_top), fb = ranked[0], inf[inf.fb_top_kernel.map(lambda x: isinstance(x, str))]
    launches = spread(inf[inf.inference_fwd_top_kernel == top].inference_fwd_top_launches)
    fb_same = int((fb.fb_top_kernel == fb.inference_fwd_top_kernel).sum())
    fb_most = (_ranked(fb.fb_top_kernel) or [None])[0]
    return TopKernel(len(inf), top, n_top, launches, len(fb), fb_same, fb_most)


@dataclasses.dataclass(frozen=True)
class NonMatmul:
    """(c) Kernels other than GEMMs above NON_TRIVIAL_SHARE of the fp32 forward's kernel time."""

    cells: int
    share: Spread  # every non-matmul kernel together, share of forward kernel time
    kernels: pd.DataFrame  # label, class, cells, median_share, max_share; most cells first


def non_matmul(df: pd.DataFrame, kernels: pd.DataFrame) -> NonMatmul | None:
    inf = ok(df, "inference")
    if inf.empty:
        return None
    k = kernels[(kernels.phase == "inference_forward") & (kernels.precision == "fp32")]
    k = k[(k["class"] != "matmul") & (k.share > NON_TRIVIAL_SHARE)].groupby(["label", "class"])
    found = k.agg(cells=("share", "size"), median_share=("share", "median"), max_share=("share", "max"))
    found = found.reset_index().sort_values(["cells", "max_share"], ascending=False, ignore_index=True)
    return NonMatmul(len(inf), spread(1 - inf.inference_fwd_matmul_share), found)


@dataclasses.dataclass(frozen=True)
class TrainingStep:
    """(d) A full training step's kernel class shares against an inference forward's, same cells."""

    cells: int
    matmul_inference: Spread
    matmul_training: Spread
    change_points: Spread  # (training − inference) matmul share per cell, in points
    optimizer_named: bool  # kernels named as AdamW's exist (else AdamW runs as elementwise kernels)
    optimizer: Spread  # share of the step: the optimizer-class kernels, or the optimizer_step range
    classes: dict[str, Spread]  # every other class with a share of the step in some cell
    backward_over_forward: Spread  # backward kernel time / forward kernel time
    attention_softmax: Spread  # the softmax range's kernels, share of the inference forward's kernel time


def training_step(df: pd.DataFrame) -> TrainingStep | None:
    both = ok(ok(df, "inference"), "training")
    if both.empty:
        return None
    shares = list(both.train_class_share)
    named = any(s.get("optimizer") for s in shares)
    other = [c for c in dict.fromkeys(c for s in shares for c in s) if c not in ("matmul", "optimizer")]
    return TrainingStep(
        len(both),
        spread(both.inference_fwd_matmul_share),
        spread(both.train_matmul_share),
        spread((both.train_matmul_share - both.inference_fwd_matmul_share) * 100),
        named,
        spread(s.get("optimizer") for s in shares) if named else spread(both.train_optimizer_phase_share),
        {c: spread(s.get(c) for s in shares) for c in other if any(s.get(c) for s in shares)},
        spread(both.bwd_over_fwd_kernel_ms),
        spread(both.get("att_softmax_ms", pd.Series(dtype=float)) / both.inference_fwd_kernel_ms),
    )


@dataclasses.dataclass(frozen=True)
class Attention:
    """(e) Inside self-attention: the softmax range's kernels against the two matmuls', time and FLOPs."""

    cells: int  # fp32 cells with the attention ranges (the other precision's cells where none is fp32)
    precision: str
    time_ratio: Spread  # softmax / (QKᵀ + PV matmul) kernel time
    flops_ratio: Spread  # softmax / matmul FLOPs
    per_flop: Spread  # time ratio / FLOP ratio: how many times slower per FLOP the softmax is
    matmul_rate: Spread  # FLOP/s of the two matmuls
    softmax_rate: Spread  # FLOP/s of the softmax


def attention_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The inference rows with the course's attention ranges, with the ratios of (e) beside them."""
    inf = ok(df, "inference", precision=None)
    if "att_softmax_ms" not in inf:
        return inf.iloc[0:0]
    inf = inf.dropna(subset=["att_softmax_ms"])
    matmul_ms = inf.att_scores_matmul_ms + inf.att_final_matmul_ms
    matmul_flops = inf.att_scores_flops + inf.att_final_flops
    return inf.assign(
        softmax_over_matmul_time=inf.att_softmax_ms / matmul_ms,
        softmax_over_matmul_flops=inf.att_softmax_flops / matmul_flops,
        matmul_flops_per_s=matmul_flops / (matmul_ms / 1e3),
        softmax_flops_per_s=inf.att_softmax_flops / (inf.att_softmax_ms / 1e3),
    )


def attention(df: pd.DataFrame) -> Attention | None:
    rows = attention_rows(df)
    rows = rows[rows.precision == "fp32"] if (rows.precision == "fp32").any() else rows
    if rows.empty:
        return None
    time, flops = rows.softmax_over_matmul_time, rows.softmax_over_matmul_flops
    rates = spread(rows.matmul_flops_per_s), spread(rows.softmax_flops_per_s)
    return Attention(len(rows), rows.precision.iloc[0], spread(time), spread(flops), spread(time / flops), *rates)
