"""The memory account of the course's model, recomputed from each record's cell (no torch). Under bf16
autocast ``x @ self.weight.T`` casts each weight anew (``weight.T`` is a view, not a cached leaf) and
autograd saves every copy: a training step holds a bf16 copy of every matmul weight.
"""

from __future__ import annotations

from lmperf.core.sizes import ModelConfig


def weight_copy_bytes(config: ModelConfig, precision: str) -> int:
    """The bf16 copies of every weight that enters a matmul (each block's projections and the head)."""
    d, f = config.d_model, config.d_ff
    return 0 if precision == "fp32" else 2 * (config.num_layers * (4 * d * d + 3 * d * f) + config.vocab_size * d)


def predicted_peak_mib(parameters_mib: float, saved_mib: float) -> tuple[float, str]:
    """A training step's peak from its parts, and where it falls: the larger of the end of the forward
    (fp32 parameters, AdamW's two moments and ``saved_mib``, what autograd saves for backward) and the
    optimizer step (parameters, gradients, the moments and the foreach step's ``sqrt(v)`` temporary)."""
    forward, step = 3 * parameters_mib + saved_mib, 5 * parameters_mib
    return (forward, "end of forward") if forward >= step else (step, "optimizer step")
