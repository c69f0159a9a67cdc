"""Memory accounting of single-head attention on Q, K, V of shape (B, N, d): pure functions.

The course's plain attention (``lmperf.attention.plain_attention``) runs, tensor by tensor
(M = one (B, N, N) matrix, R = one (B, N, 1) row statistic, V = one (B, N, d) tensor):

  step  tensor                     allocates   freed after the step     autograd saves it because
  1     raw = Q K^T                M
  2     S = raw / sqrt(d)          M           raw                      amax's backward needs S
  3     m = S.amax(-1)             R                                    amax's backward needs m
  4     X = S - m                  M
  5     E = exp(X)                 M                                    exp's backward needs E
  6     s = E.sum(-1)              R                                    division's backward needs s
  7     P = E / s                  M           X (softmax returns)      P V's backward needs P
  8     O = P V                    V                                    (the output, kept by the caller)

So the forward keeps 3M + 2R for backward (S, E, P, m, s; Q, K, V are inputs) and peaks at
step 7 with 4M + 2R live. A fused kernel (FlashAttention-2, PyTorch's memory-efficient SDPA)
keeps O and one log-sum-exp per row (fp32) and recomputes P in backward: no N² term at all.

Byte counts here are exact for the tensors; ``block_bytes`` applies the CUDA caching
allocator's rounding (every allocation is a multiple of 512 bytes) for comparison with
``torch.cuda.memory_allocated``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The CUDA caching allocator rounds every block up to a multiple of this (c10/cuda/CUDACachingAllocator.cpp).
ALLOCATOR_BLOCK_BYTES = 512
# Implementations whose backward recomputes the probabilities from a per-row log-sum-exp.
FUSED_IMPLEMENTATIONS = ("sdpa", "flash")
# The log-sum-exp a fused kernel saves is fp32 whatever the input dtype.
LSE_BYTES = 4


def block_bytes(nbytes: int) -> int:
    """Bytes the CUDA caching allocator accounts for one allocation of ``nbytes``."""
    return max(ALLOCATOR_BLOCK_BYTES, -(-nbytes // ALLOCATOR_BLOCK_BYTES) * ALLOCATOR_BLOCK_BYTES)


@dataclass(frozen=True)
class Shape:
    """Q, K, V of shape (batch, seq_len, head_dim), each element ``element_bytes`` wide."""

    batch: int
    seq_len: int
    head_dim: int
    element_bytes: int = 4

    @property
    def matrix_bytes(self) -> int:
        """One (B, N, N) matrix: scores, probabilities, …"""
        return self.batch * self.seq_len * self.seq_len * self.element_bytes

    @property
    def row_bytes(self) -> int:
        """One (B, N, 1) row statistic (max or sum) in the input dtype."""
        return self.batch * self.seq_len * self.element_bytes

    @property
    def vector_bytes(self) -> int:
        """One (B, N, d) tensor: Q, K, V, O or dO."""
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
    """The allocations of lmperf.attention.plain_attention's forward, in order (see module docstring)."""
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
    live_after: int  # bytes live after the step's frees


def timeline(steps: list[Step], base_bytes: int = 0, rounded: bool = False) -> list[TimelinePoint]:
    """Live bytes around every allocation, starting from ``base_bytes`` already in use."""
    size = (lambda n: block_bytes(n)) if rounded else (lambda n: n)
    live, held, points = base_bytes, {}, []
    for step in steps:
        before = live
        held[step.tensor] = size(step.nbytes)
        live += held[step.tensor]
        peak = live
        for name in step.frees:
            live -= held.pop(name)
        points.append(TimelinePoint(step, before, peak, live))
    return points


def first_failure(
    steps: list[Step], base_bytes: int, capacity_bytes: int, rounded: bool = False
) -> TimelinePoint | None:
    """The first allocation that would not fit in ``capacity_bytes`` (None if all fit)."""
    for point in timeline(steps, base_bytes, rounded):
        if point.live_peak > capacity_bytes:
            return point
    return None


@dataclass(frozen=True)
class Accounting:
    """Predicted bytes of one attention cell: what is live before backward and at the forward's peak."""

    implementation: str
    inputs_bytes: int  # Q, K, V
    grad_output_bytes: int  # dO, allocated by the benchmark before the forward
    output_bytes: int  # O
    saved_bytes: int  # what autograd saves for backward beyond Q, K, V (and O for fused kernels)
    n2_matrices_saved: int  # how many (B, N, N) matrices the saved bytes hold
    forward_peak_extra_bytes: int  # most bytes the forward has live beyond the inputs and dO

    @property
    def retained_bytes(self) -> int:
        """What the forward leaves allocated while its output is kept for backward."""
        return self.saved_bytes + self.output_bytes

    @property
    def before_backward_bytes(self) -> int:
        """Memory in use before backward: inputs, dO, the output and everything saved."""
        return self.inputs_bytes + self.grad_output_bytes + self.retained_bytes

    @property
    def forward_peak_bytes(self) -> int:
        return self.inputs_bytes + self.grad_output_bytes + self.forward_peak_extra_bytes


def plain_accounting(shape: Shape, rounded: bool = False) -> Accounting:
    """The course's attention: saves S, E, P and the row max and sum (3M + 2R)."""
    size = block_bytes if rounded else (lambda n: n)
    steps = plain_forward_steps(shape)
    points = timeline(steps, rounded=rounded)
    saved = sum(size(s.nbytes) for s in steps if s.saved)
    return Accounting(
        implementation="plain",
        inputs_bytes=3 * size(shape.vector_bytes),
        grad_output_bytes=size(shape.vector_bytes),
        output_bytes=size(shape.vector_bytes),
        saved_bytes=saved,
        n2_matrices_saved=sum(1 for s in steps if s.saved and s.nbytes == shape.matrix_bytes),
        forward_peak_extra_bytes=max(p.live_peak for p in points),
    )


def fused_accounting(shape: Shape, implementation: str = "sdpa", rounded: bool = False) -> Accounting:
    """A FlashAttention-style kernel: saves O (the output) and a fp32 log-sum-exp per row.

    Its forward holds only tiles on chip, so the peak beyond the inputs is O and the
    log-sum-exp. (PyTorch's memory-efficient kernel pads the log-sum-exp to a multiple of 32
    rows: a few hundred bytes.)
    """
    size = block_bytes if rounded else (lambda n: n)
    lse = size(shape.batch * shape.seq_len * LSE_BYTES)
    out = size(shape.vector_bytes)
    return Accounting(
        implementation=implementation,
        inputs_bytes=3 * size(shape.vector_bytes),
        grad_output_bytes=out,
        output_bytes=out,
        saved_bytes=lse,
        n2_matrices_saved=0,
        forward_peak_extra_bytes=out + lse,
    )


def accounting(implementation: str, shape: Shape, rounded: bool = False) -> Accounting | None:
    """The prediction for an implementation whose saved tensors are known, else None.

    ``compiled`` has none: what torch.compile saves is the partitioner's choice, so it is
    measured, not predicted.
    """
    if implementation == "plain":
        return plain_accounting(shape, rounded)
    if implementation in FUSED_IMPLEMENTATIONS:
        return fused_accounting(shape, implementation, rounded)
    return None


def fit_exponent(xs, ys) -> float:
    """Least-squares slope of log(y) against log(x): y ~ x^slope."""
    pairs = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len(pairs) < 2:
        raise ValueError("need at least two positive (x, y) pairs to fit an exponent")
    mx = sum(p[0] for p in pairs) / len(pairs)
    my = sum(p[1] for p in pairs) / len(pairs)
    sxx = sum((p[0] - mx) ** 2 for p in pairs)
    if sxx == 0:
        raise ValueError("all x equal: no exponent to fit")
    return sum((p[0] - mx) * (p[1] - my) for p in pairs) / sxx
