"""The facts behind nsys_profile (a)–(e), verdicts included: pure functions of the per-cell frame.

Each answer's facts are a small frozen dataclass computed from ``cells.frame``; the report fills its
templates from them. A difference of times is a verdict only through ``lmperf.core.stats.compare``
(else "within noise"); what the time goes to is read from the cells' own kernel class shares and
busy fractions, never from a threshold on a time ratio. No torch here.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pandas as pd

from lmperf.core import stats
from lmperf.kinds.nsys.cells import ok
from lmperf.kinds.nsys.text import Spread, spread

# (c): a non-matmul kernel is "non-trivial" above this share of the forward's kernel time.
NON_TRIVIAL_SHARE = 0.02
# (a): a forward is host-bound when its kernels keep the device busy for less than this share of it
BUSY = 0.9
# a forward is "mostly matmuls" when matmul kernels take more than this share of its kernel time
MOSTLY = 0.5
VERDICTS = ("faster", "within noise", "slower")


def verdicts(pairs) -> dict[str, int]:
    """How many (a, b) Estimate pairs ``stats.compare`` calls faster, within noise, slower (a against b)."""
    counts = Counter(stats.compare(a, b) for a, b in pairs)
    return {v: counts.get(v, 0) for v in VERDICTS}


def _est(x) -> stats.Estimate:
    return x if isinstance(x, stats.Estimate) else stats.Estimate(float(x))


@dataclasses.dataclass(frozen=True)
class ForwardCheck:
    """(a) The profiler's forward time against the timer in the same process and the unprofiled e2e runs."""

    cells: int
    over_timer: Spread  # profiler range / timer, same process
    timer_verdicts: dict[str, int]
    busy: Spread  # kernel time / profiler range
    e2e_cells: int
    over_e2e: Spread  # profiler range / unprofiled e2e forward
    e2e_verdicts: dict[str, int]
    slower_models: tuple[tuple[str, float], ...]  # (model, its largest profiled / e2e) where slower
    slower_busy: Spread  # kernel time / unprofiled forward, in the cells profiling slowed
    other_busy: Spread  # the same, in the others
    slower_idle: int  # slower cells whose kernels fill less than BUSY of the unprofiled forward
    other_idle: int  # the same among the others
    training_over_timer: Spread
    nvtx_pairs: int
    nvtx_cost: Spread  # forward with the ranges on / off, no profiler attached
    nvtx_verdicts: dict[str, int]

    @property
    def matches_timer(self) -> bool:
        return self.cells > 0 and self.timer_verdicts["within noise"] == self.cells

    @property
    def slowdown_where_idle(self) -> bool:
        """Whether profiling slowed the host-bound forwards: most slower cells' kernels fill less than BUSY of
        the unprofiled forward, and a larger share of them than of the other cells."""
        slower, other = self.slower_busy.n, self.other_busy.n
        if not slower or 2 * self.slower_idle < slower:
            return False
        return not other or self.slower_idle / slower > self.other_idle / other


def forward_check(df: pd.DataFrame) -> ForwardCheck:
    inf = ok(df, "inference")
    profiled = [_est(v) for v in inf.get("inference_fwd_nvtx_ms", [])]
    timers = list(inf.get("inference_fwd_timer", []))
    rows = []  # (model, profiled / e2e, kernel time / e2e, verdict) per cell with an e2e record
    for r, p in zip(inf.itertuples(), profiled):
        if r.inference_fwd_e2e is not None:
            e = r.inference_fwd_e2e
            rows.append((r.model, p.median / e.median, r.inference_fwd_kernel_ms / e.median, stats.compare(p, e)))
    slower = [x for x in rows if x[3] == "slower"]
    by_model: dict[str, float] = {}
    for model, ratio, _, _ in slower:
        by_model[model] = max(ratio, by_model.get(model, 0.0))
    train = ok(df, "training")
    t_prof = [_est(v) for v in train.get("training_fwd_nvtx_ms", [])]
    pairs = df.dropna(subset=["nvtx_on"]).drop_duplicates(["model", "precision"]) if "nvtx_on" in df else df[:0]
    on, off = list(pairs.get("nvtx_on", [])), list(pairs.get("nvtx_off", []))
    return ForwardCheck(
        cells=len(inf),
        over_timer=spread(p.median / t.median for p, t in zip(profiled, timers)),
        timer_verdicts=verdicts(zip(profiled, timers)),
        busy=spread(k / p.median for k, p in zip(inf.get("inference_fwd_kernel_ms", []), profiled)),
        e2e_cells=len(rows),
        over_e2e=spread(x[1] for x in rows),
        e2e_verdicts={v: sum(x[3] == v for x in rows) for v in VERDICTS},
        slower_models=tuple(by_model.items()),
        slower_busy=spread(x[2] for x in slower),
        other_busy=spread(x[2] for x in rows if x[3] != "slower"),
        slower_idle=sum(x[2] < BUSY for x in slower),
        other_idle=sum(x[2] < BUSY for x in rows if x[3] != "slower"),
        training_over_timer=spread(p.median / t.median for p, t in zip(t_prof, train.get("training_fwd_timer", []))),
        nvtx_pairs=len(pairs),
        nvtx_cost=spread(a.median / b.median for a, b in zip(on, off)),
        nvtx_verdicts=verdicts(zip(on, off)),
    )


@dataclasses.dataclass(frozen=True)
class TopKernel:
    """(b) The forward's top kernel: which, in how many cells, its launches, and forward + backward's."""

    cells: int
    top: str | None  # the label most cells have as their forward's top kernel
    top_name: str | None  # its full (demangled) name
    top_cells: int
    launches: tuple[tuple[str, tuple[tuple[int, float], ...]], ...]  # model -> ((ctx, launches per forward), …)
    others: tuple[tuple[str, int], ...]  # the other cells' top kernels, with their cell counts
    fb_cells: int
    fb_same: int  # cells whose forward + backward top kernel is the forward's
    fb_most: tuple[str, int] | None  # the most frequent forward + backward top kernel, and its cells

    @property
    def same_in_backward(self) -> bool:
        return self.fb_cells > 0 and self.fb_same == self.fb_cells


def _ranked(series: pd.Series) -> list[tuple[str, int]]:
    counts = series.dropna().value_counts()
    return sorted(((k, int(n)) for k, n in counts.items()), key=lambda kn: (-kn[1], kn[0]))


def top_kernel(df: pd.DataFrame) -> TopKernel:
    inf = ok(df, "inference")
    if inf.empty:
        return TopKernel(0, None, None, 0, (), (), 0, 0, None)
    top, n_top = _ranked(inf.inference_fwd_top_kernel)[0]
    led = inf[inf.inference_fwd_top_kernel == top]
    launches = tuple(
        (model, tuple((int(r.context_length), float(r.inference_fwd_top_launches)) for r in g.itertuples()))
        for model, g in led.groupby("model", sort=False)
    )
    fb = inf.dropna(subset=["fb_top_kernel"])
    fb_ranked = _ranked(fb.fb_top_kernel)
    return TopKernel(
        cells=len(inf),
        top=top,
        top_name=led.inference_fwd_top_kernel_name.iloc[0],
        top_cells=n_top,
        launches=launches,
        others=tuple(_ranked(inf[inf.inference_fwd_top_kernel != top].inference_fwd_top_kernel)),
        fb_cells=len(fb),
        fb_same=int((fb.fb_top_kernel == fb.inference_fwd_top_kernel).sum()),
        fb_most=fb_ranked[0] if fb_ranked else None,
    )


@dataclasses.dataclass(frozen=True)
class Bf16Forward:
    """(b), beside fp32: the bf16 autocast forward's kernel time and what its class shares show."""

    cells: int  # bf16 cells with an fp32 cell of the same size and context
    time_ratio: Spread  # bf16 / fp32 forward kernel time
    time_verdicts: dict[str, int]  # bf16 against fp32
    matmul_ratio: Spread  # bf16 / fp32 matmul kernel time
    other_ratio: Spread  # bf16 / fp32 time of every other kernel
    matmul_share_bf16: Spread
    matmul_share_fp32: Spread
    top: tuple[str, int] | None  # the bf16 forward's most frequent top kernel, and its cells
    top_class: str | None  # that kernel's class
    new_matmuls: bool  # bf16's top matmul kernels are none of fp32's

    @property
    def mostly_matmul(self) -> bool:
        """Whether matmul kernels still take most of the bf16 forward's kernel time (median cell)."""
        return self.cells > 0 and self.matmul_share_bf16.median > MOSTLY


def bf16_forward(df: pd.DataFrame, kernels: pd.DataFrame) -> Bf16Forward:
    bf16, fp32 = ok(df, "inference", "bf16"), ok(df, "inference", "fp32")
    pairs = bf16.merge(fp32, on=["model", "context_length"], suffixes=("", "_fp32"))
    if pairs.empty:
        return Bf16Forward(
            0, spread([]), verdicts([]), spread([]), spread([]), spread([]), spread([]), None, None, False
        )
    mm = [
        (b.get("matmul", 0.0), f.get("matmul", 0.0))
        for b, f in zip(pairs.inference_class_ms, pairs.inference_class_ms_fp32)
    ]
    other = [
        (k - b, kf - f) for (b, f), k, kf in zip(mm, pairs.inference_fwd_kernel_ms, pairs.inference_fwd_kernel_ms_fp32)
    ]
    top = _ranked(pairs.inference_fwd_top_kernel)
    classes = kernels[kernels.label == top[0][0]]["class"] if top and not kernels.empty else pd.Series(dtype=str)
    return Bf16Forward(
        cells=len(pairs),
        time_ratio=spread(pairs.inference_fwd_kernel_ms / pairs.inference_fwd_kernel_ms_fp32),
        time_verdicts=verdicts(
            (stats.Estimate(b), stats.Estimate(f))
            for b, f in zip(pairs.inference_fwd_kernel_ms, pairs.inference_fwd_kernel_ms_fp32)
        ),
        matmul_ratio=spread(b / f for b, f in mm if f),
        other_ratio=spread(b / f for b, f in other if f),
        matmul_share_bf16=spread(pairs.inference_fwd_matmul_share),
        matmul_share_fp32=spread(pairs.inference_fwd_matmul_share_fp32),
        top=top[0] if top else None,
        top_class=classes.iloc[0] if len(classes) else None,
        new_matmuls=not set(pairs.inference_fwd_top_matmul.dropna()) & set(fp32.inference_fwd_top_matmul.dropna()),
    )


@dataclasses.dataclass(frozen=True)
class NonMatmul:
    """(c) Non-matmul kernels above NON_TRIVIAL_SHARE of the fp32 forward's kernel time."""

    cells: int
    share: Spread  # every non-matmul kernel together, share of forward kernel time
    kernels: pd.DataFrame  # label, class, cells, median_share, max_share; most cells first

    @property
    def any(self) -> bool:
        return not self.kernels.empty


def non_matmul(df: pd.DataFrame, kernels: pd.DataFrame, threshold: float = NON_TRIVIAL_SHARE) -> NonMatmul:
    inf = ok(df, "inference")
    columns = ["label", "class", "cells", "median_share", "max_share"]
    found = pd.DataFrame(columns=columns)
    if not kernels.empty:
        k = kernels[
            (kernels.phase == "inference_forward")
            & (kernels.precision == "fp32")
            & (kernels["class"] != "matmul")
            & (kernels.share > threshold)
        ]
        if not k.empty:
            found = (
                k.groupby(["label", "class"])
                .agg(cells=("share", "size"), median_share=("share", "median"), max_share=("share", "max"))
                .reset_index()
                .sort_values(["cells", "max_share"], ascending=False)
                .reset_index(drop=True)
            )
    return NonMatmul(len(inf), spread(1 - inf.inference_fwd_matmul_share) if len(inf) else spread([]), found)


def _class_spread(shares, cls: str) -> Spread:
    return spread(s.get(cls) for s in shares if isinstance(s, dict))


@dataclasses.dataclass(frozen=True)
class TrainingStep:
    """(d) A full training step's kernel class shares against an inference forward's, same cells."""

    cells: int
    matmul_inference: Spread
    matmul_training: Spread
    lower_in_training: int  # cells whose matmul share is lower in the training step
    change_points: float | None  # median over cells of (training − inference) matmul share, in points
    optimizer_named: bool  # kernels named as AdamW's exist (else AdamW runs as elementwise kernels)
    optimizer: Spread  # share of the step: the optimizer-class kernels, or the optimizer_step range
    elementwise_training: Spread
    elementwise_inference: Spread
    reduction_training: Spread
    backward_over_forward: Spread  # backward kernel time / forward kernel time
    attention_softmax: Spread  # the softmax range's kernels, share of the inference forward's kernel time

    @property
    def matmul_lower(self) -> bool:
        return self.change_points is not None and self.change_points < 0


def training_step(df: pd.DataFrame) -> TrainingStep:
    both = ok(ok(df, "inference"), "training")
    if both.empty:
        empty = spread([])
        return TrainingStep(0, empty, empty, 0, None, False, empty, empty, empty, empty, empty, empty)
    shares = list(both.train_class_share)
    named = any(s.get("optimizer") for s in shares if isinstance(s, dict))
    diff = (both.train_matmul_share - both.inference_fwd_matmul_share) * 100
    softmax = both.att_softmax_ms / both.inference_fwd_kernel_ms if "att_softmax_ms" in both else []
    return TrainingStep(
        cells=len(both),
        matmul_inference=spread(both.inference_fwd_matmul_share),
        matmul_training=spread(both.train_matmul_share),
        lower_in_training=int((diff < 0).sum()),
        change_points=float(diff.median()),
        optimizer_named=named,
        optimizer=_class_spread(shares, "optimizer") if named else spread(both.train_optimizer_phase_share),
        elementwise_training=_class_spread(shares, "elementwise"),
        elementwise_inference=_class_spread(list(both.inference_class_share), "elementwise"),
        reduction_training=_class_spread(shares, "reduction"),
        backward_over_forward=spread(both.bwd_over_fwd_kernel_ms),
        attention_softmax=spread(softmax),
    )


@dataclasses.dataclass(frozen=True)
class Attention:
    """(e) Inside self-attention: the softmax range's kernels against the two matmuls', time and FLOPs."""

    cells: int  # fp32 cells with the attention ranges (the other precision's cells where none is fp32)
    precision: str | None
    time_ratio: Spread  # softmax / (QKᵀ + PV matmul) kernel time
    flops_ratio: Spread  # softmax / matmul FLOPs
    per_flop: Spread  # time ratio / FLOP ratio: how many times slower per FLOP the softmax is
    matmul_rate: Spread  # FLOP/s of the two matmuls
    softmax_rate: Spread  # FLOP/s of the softmax
    bf16_time_ratio: Spread  # the same time ratio in the bf16 cells

    @property
    def softmax_slower_per_flop(self) -> bool:
        return self.cells > 0 and self.per_flop.median > 1


def attention_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The inference rows with attention ranges, with the ratios of (e) beside them."""
    inf = ok(df, "inference", precision=None)
    if inf.empty or "att_softmax_ms" not in inf:
        return inf.iloc[0:0]
    inf = inf.dropna(subset=["att_softmax_ms"])
    matmul_ms = inf.att_scores_matmul_ms + inf.att_final_matmul_ms
    matmul_flops = inf.att_scores_flops + inf.att_final_flops
    return inf.assign(
        att_matmul_ms=matmul_ms,
        softmax_over_matmul_time=inf.att_softmax_ms / matmul_ms,
        softmax_over_matmul_flops=inf.att_softmax_flops / matmul_flops,
        matmul_flops_per_s=matmul_flops / (matmul_ms / 1e3),
        softmax_flops_per_s=inf.att_softmax_flops / (inf.att_softmax_ms / 1e3),
    )


def attention(df: pd.DataFrame) -> Attention:
    rows = attention_rows(df)
    chosen = rows[rows.precision == "fp32"] if (rows.precision == "fp32").any() else rows
    bf16 = rows[rows.precision == "bf16"]
    return Attention(
        cells=len(chosen),
        precision=chosen.precision.iloc[0] if len(chosen) else None,
        time_ratio=spread(chosen.softmax_over_matmul_time),
        flops_ratio=spread(chosen.softmax_over_matmul_flops),
        per_flop=spread(chosen.softmax_over_matmul_time / chosen.softmax_over_matmul_flops),
        matmul_rate=spread(chosen.matmul_flops_per_s),
        softmax_rate=spread(chosen.softmax_flops_per_s),
        bf16_time_ratio=spread(bf16.softmax_over_matmul_time),
    )
