"""Memory accounting of single-head attention on Q, K, V of shape (B, N, d): pure functions.

The course's plain attention runs, tensor by tensor (M = one (B, N, N) matrix, R = one (B, N, 1)
row statistic, V = one (B, N, d) tensor; * = saved by autograd for backward):

  1 raw = Q K^T: M    2 S* = raw / sqrt(d): M, frees raw    3 m* = S.amax(-1): R    4 X = S - m: M
  5 E* = exp(X): M    6 s* = E.sum(-1): R    7 P* = E / s: M, frees X (softmax returns)    8 O = P V: V

So the forward keeps 3M + 2R (S for amax's backward, m, E for exp's, s and P for the division's and
P V's) and peaks at step 7 with 4M + 2R live. A fused kernel (FlashAttention-2, PyTorch's
memory-efficient SDPA) keeps O and one fp32 log-sum-exp per row and recomputes P in backward: no N²
term. Byte counts are exact tensor sizes (the CUDA allocator rounds each block up to 512 bytes).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# Implementations whose backward recomputes the probabilities from a per-row log-sum-exp.
FUSED_IMPLEMENTATIONS = ("sdpa", "flash")
LSE_BYTES = 4  # the log-sum-exp a fused kernel saves is fp32 whatever the input dtype


@dataclass(frozen=True)
class Shape:
    """Q, K, V of shape (batch, seq_len, head_dim), each element ``element_bytes`` wide."""

    batch: int
    seq_len: int
    head_dim: int
    element_bytes: int = 4

    @property
    def matrix_bytes(self) -> int:  # one (B, N, N) matrix: scores, probabilities, …
        return self.batch * self.seq_len * self.seq_len * self.element_bytes

    @property
    def row_bytes(self) -> int:  # one (B, N, 1) row statistic (max or sum) in the input dtype
        return self.batch * self.seq_len * self.element_bytes

    @property
    def vector_bytes(self) -> int:  # one (B, N, d) tensor: Q, K, V, O or dO
        return self.batch * self.seq_len * self.head_dim * self.element_bytes


@dataclass(frozen=True)
class Step:
    """One tensor the forward allocates: its size, what is freed once it exists, whether it is saved."""

    tensor: str
    what: str
    nbytes: int
    frees: tuple[str, ...] = ()
    saved: bool = False


def plain_forward_steps(shape: Shape) -> list[Step]:
    """The allocations of plain_attention's forward, in order (see the module docstring)."""
    m, r, v = shape.matrix_bytes, shape.row_bytes, shape.vector_bytes
    return [
        Step("raw", "Q K^T", m),
        Step("S", "scores Q K^T / sqrt(d)", m, frees=("raw",), saved=True),
        Step("m", "row max of S", r, saved=True),
        Step("X", "S - max", m),
        Step("E", "exp(S - max)", m, saved=True),
        Step("s", "row sum of E", r, saved=True),
        Step("P", "probabilities E / sum", m, frees=("X",), saved=True),
        Step("O", "output P V", v),
    ]


@dataclass(frozen=True)
class TimelinePoint:
    step: Step
    live_before: int  # bytes live just before this tensor is allocated
    live_peak: int  # bytes live once it is allocated (before anything is freed)


def timeline(steps: list[Step], base_bytes: int = 0) -> list[TimelinePoint]:
    """Live bytes around every allocation, starting from ``base_bytes`` already in use."""
    live, held, points = base_bytes, {}, []
    for step in steps:
        held[step.tensor] = step.nbytes
        points.append(TimelinePoint(step, live, live + step.nbytes))
        live += step.nbytes - sum(held.pop(name) for name in step.frees)
    return points


def first_failure(steps: list[Step], base_bytes: int, capacity_bytes: int) -> TimelinePoint | None:
    """The first allocation that would not fit in ``capacity_bytes`` (None if all fit)."""
    return next((p for p in timeline(steps, base_bytes) if p.live_peak > capacity_bytes), None)


@dataclass(frozen=True)
class Accounting:
    """Predicted bytes of one attention cell: what is live before backward and at the forward's peak."""

    inputs_bytes: int  # Q, K, V and dO (dO is allocated by the cell before the forward)
    output_bytes: int  # O
    saved_bytes: int  # what autograd saves for backward beyond Q, K, V
    forward_peak_extra_bytes: int  # most bytes the forward has live beyond the inputs

    @property
    def retained_bytes(self) -> int:  # what the forward leaves allocated while its output is kept for backward
        return self.saved_bytes + self.output_bytes

    @property
    def before_backward_bytes(self) -> int:
        return self.inputs_bytes + self.retained_bytes

    @property
    def forward_peak_bytes(self) -> int:
        return self.inputs_bytes + self.forward_peak_extra_bytes


def plain_accounting(shape: Shape) -> Accounting:
    """The course's attention: saves S, E, P and the row max and sum (3M + 2R)."""
    steps = plain_forward_steps(shape)
    return Accounting(
        inputs_bytes=4 * shape.vector_bytes,
        output_bytes=shape.vector_bytes,
        saved_bytes=sum(s.nbytes for s in steps if s.saved),
        forward_peak_extra_bytes=max(p.live_peak for p in timeline(steps)),
    )


def fused_accounting(shape: Shape) -> Accounting:
    """A FlashAttention-style kernel: saves O and an fp32 log-sum-exp per row; its forward holds only
    tiles on chip, so its peak beyond the inputs is those two. (PyTorch's memory-efficient kernel
    pads the log-sum-exp to a multiple of 32 rows: a few hundred bytes.)"""
    lse, out = shape.batch * shape.seq_len * LSE_BYTES, shape.vector_bytes
    return Accounting(4 * out, out, lse, out + lse)


def accounting(implementation: str, shape: Shape) -> Accounting | None:
    """The prediction for an implementation whose saved tensors are known, else None (what
    torch.compile saves is its partitioner's choice: measured, not predicted)."""
    if implementation == "plain":
        return plain_accounting(shape)
    return fused_accounting(shape) if implementation in FUSED_IMPLEMENTATIONS else None


def fit_exponent(xs, ys) -> float:
    """Least-squares slope of log(y) against log(x): y ~ x^slope."""
    return statistics.linear_regression([math.log(x) for x in xs], [math.log(y) for y in ys]).slope
