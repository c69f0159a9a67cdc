"""Mixed-precision probes: accumulation in fp16/fp32, autocast's dtypes, layer norm in low precision.

Each probe runs on a given torch device and returns plain values (floats, dtype names), so the
cell records them and the tests check them against float64 references:

- ``accumulation``: the course's four loops adding 0.01 to an accumulator 1000 times.
- ``toy_model_dtypes``: the course's ToyModel (fc1 → ReLU → LayerNorm → fc2) under autocast,
  the dtypes read from forward hooks, the loss and the gradients, not asserted from docs.
- ``layer_norm_errors``: where layer normalisation loses accuracy when its inputs and
  intermediates are fp16 or bf16: the inputs' own rounding, the mean and sum of squares
  accumulated in the low-precision type, their overflow, the one-pass variance's cancellation,
  and the output computed in the low-precision type versus the fused kernel (fp32 statistics).
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from lmperf.core.dtypes import DTYPES, dtype_name

# Explicit mantissa bits (the stored fraction): the spacing of numbers in [2^e, 2^(e+1)) is 2^(e-bits).
MANTISSA_BITS = {"fp32": 23, "fp16": 10, "bf16": 7, "fp64": 52}


def spacing(x: float, dtype: str) -> float:
    """Distance from |x| to the next representable number of ``dtype`` (normal range)."""
    if x == 0 or not math.isfinite(x):
        return float("nan")
    return 2.0 ** (math.floor(math.log2(abs(x))) - MANTISSA_BITS[dtype])


# -- accumulation ------------------------------------------------------------------------------

ACCUMULATION_VARIANTS = {
    # name: (accumulator dtype, increment dtype, cast the increment to the accumulator's dtype first)
    "fp32 += fp32": ("fp32", "fp32", False),
    "fp16 += fp16": ("fp16", "fp16", False),
    "fp32 += fp16": ("fp32", "fp16", False),
    "fp32 += fp16 cast to fp32": ("fp32", "fp16", True),
}


def accumulate(variant: str, steps: int = 1000, increment: float = 0.01, device="cpu") -> dict:
    """One of the course's loops, exactly as written there, and what its result means."""
    acc_dtype, inc_dtype, cast = ACCUMULATION_VARIANTS[variant]
    s = torch.tensor(0, dtype=DTYPES[acc_dtype], device=device)
    for _ in range(steps):
        x = torch.tensor(increment, dtype=DTYPES[inc_dtype], device=device)
        s += x.type(DTYPES[acc_dtype]) if cast else x
    result = float(s.item())
    stored_increment = float(torch.tensor(increment, dtype=DTYPES[inc_dtype]).item())
    exact = steps * increment
    return {
        "variant": variant,
        "accumulator_dtype": acc_dtype,
        "increment_dtype": inc_dtype,
        "cast": cast,
        "steps": steps,
        "increment": increment,
        "result": result,
        "exact": exact,
        "abs_error": abs(result - exact),
        "rel_error": abs(result - exact) / exact,
        "stored_increment": stored_increment,
        # what an exact accumulator would reach with the increment as stored
        "exact_sum_of_stored_increment": steps * stored_increment,
        "accumulator_spacing_at_result": spacing(result, acc_dtype),
    }


# -- the toy model under autocast ----------------------------------------------------------------


class ToyModel(nn.Module):
    """The course's toy model: fc1 (no bias) → ReLU → LayerNorm(10) → fc2 (no bias)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(x))
        x = self.ln(x)
        return self.fc2(x)


def toy_model_dtypes(
    autocast_dtype: str,
    device: torch.device,
    in_features: int = 16,
    out_features: int = 4,
    batch_size: int = 8,
    seed: int = 0,
) -> dict:
    """Dtypes inside ``torch.autocast(dtype=autocast_dtype)`` with fp32 parameters, read from
    hooks and tensors: parameters (as the module holds them, inside autocast), each module's
    output, the logits, the loss and the parameters' gradients after backward.

    Raises ``NotImplementedError`` when this device's autocast does not support the dtype.
    """
    device = torch.device(device)
    torch.manual_seed(seed)
    model = ToyModel(in_features, out_features).to(device)
    x = torch.randn(batch_size, in_features, device=device)
    targets = torch.randint(0, out_features, (batch_size,), device=device)
    outputs: dict[str, str] = {}
    hooks = [
        module.register_forward_hook(lambda mod, inp, out, name=name: outputs.__setitem__(name, dtype_name(out.dtype)))
        for name, module in (("fc1", model.fc1), ("relu", model.relu), ("ln", model.ln), ("fc2", model.fc2))
    ]
    dtype = DTYPES[autocast_dtype]
    if not torch.amp.is_autocast_available(device.type):
        raise NotImplementedError(f"no autocast for device type {device.type!r}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast(device_type=device.type, dtype=dtype):
            enabled = torch.is_autocast_enabled(device.type)
            params_inside = {name: dtype_name(p.dtype) for name, p in model.named_parameters()}
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, targets)
    for h in hooks:
        h.remove()
    disabled = [str(w.message) for w in caught if "autocast" in str(w.message).lower()]
    if not enabled or disabled:
        raise NotImplementedError(
            f"{device.type} autocast does not support {autocast_dtype}: "
            + ("; ".join(disabled) or "autocast reported disabled")
        )
    loss.backward()
    return {
        "autocast_dtype": autocast_dtype,
        "parameters": params_inside,
        "fc1_output": outputs["fc1"],
        "relu_output": outputs["relu"],
        "ln_output": outputs["ln"],
        "logits": dtype_name(logits.dtype),
        "fc2_output": outputs["fc2"],
        "loss": dtype_name(loss.dtype),
        "gradients": {name: dtype_name(p.grad.dtype) for name, p in model.named_parameters()},
    }


# -- layer normalisation in low precision ---------------------------------------------------------


def _sequential_sum(columns: torch.Tensor, square: bool = False) -> torch.Tensor:
    """Row sums accumulated left to right in the tensor's own dtype (each partial sum rounded)."""
    acc = torch.zeros(columns.shape[0], dtype=columns.dtype, device=columns.device)
    for j in range(columns.shape[1]):
        c = columns[:, j]
        acc = acc + (c * c if square else c)
    return acc


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64; inf when a holds non-finite values."""
    a64 = a.to(torch.float64)
    if not torch.isfinite(a64).all():
        return float("inf")
    return float((a64 - b.to(torch.float64)).abs().max())


def layer_norm_errors(
    dtype: str, mean: float, std: float, width: int, rows: int, device, seed: int = 0, eps: float = 1e-5
) -> dict:
    """Errors of each part of layer normalisation with inputs in ``dtype``, against float64.

    Inputs: ``rows`` activations of ``width`` features drawn as mean + std·N(0, 1) (a large mean
    relative to the spread is what residual-stream features look like). Errors of the mean and
    of the output are in units of the float64 standard deviation (the scale normalisation
    divides by); the variance's error is relative. An error is ``inf`` where the computation
    overflowed (records store it as null).
    """
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    x64 = (mean + std * torch.randn(rows, width, generator=gen, dtype=torch.float64)).to(device)
    mu64 = x64.mean(-1)
    var64 = x64.var(-1, unbiased=False)
    sd64 = var64.sqrt()
    y64 = (x64 - mu64[:, None]) / torch.sqrt(var64[:, None] + eps)
    lp = DTYPES[dtype]
    x = x64.to(lp)
    finfo_max = float(torch.finfo(lp).max)

    def mean_err(m):
        return _max_abs(m, mu64) / float(sd64.min()) if torch.isfinite(m.to(torch.float64)).all() else float("inf")

    def var_err(v):
        v64 = v.to(torch.float64)
        return float(((v64 - var64).abs() / var64).max()) if torch.isfinite(v64).all() else float("inf")

    # 1. the inputs' own rounding
    input_err = _max_abs(x, x64) / float(sd64.min())
    # 2. statistics accumulated in the low-precision type, element by element
    sum_seq = _sequential_sum(x)
    sumsq_seq = _sequential_sum(x, square=True)
    mean_seq = sum_seq / width
    # 3. statistics accumulated in fp32 (as PyTorch's reductions and the fused kernel do) but
    #    stored in the low-precision type
    mean_acc32 = x.float().mean(-1).to(lp)
    sumsq_acc32 = (x.float() ** 2).sum(-1).to(lp)
    mean_sq_acc32 = (x.float() ** 2).mean(-1).to(lp)
    var_onepass = (mean_sq_acc32 - mean_acc32 * mean_acc32).to(lp)  # E[x²] − E[x]², in lp
    var_twopass = ((x.float() - mean_acc32.float()[:, None]) ** 2).mean(-1).to(lp)
    # 4. the normalised output: every intermediate in lp (two-pass statistics); the fused kernel
    #    (fp32 statistics inside, output rounded to lp); fp32 from the same rounded inputs
    xc = x - mean_acc32[:, None]
    y_lowp = xc / torch.sqrt((xc * xc).mean(-1, keepdim=True) + eps)
    y_kernel = nn.functional.layer_norm(x, (width,), eps=eps)
    y_fp32 = nn.functional.layer_norm(x.float(), (width,), eps=eps)
    exact_sumsq = float((x64 * x64).sum(-1).max())
    return {
        "dtype": dtype,
        "mean": mean,
        "std": std,
        "width": width,
        "rows": rows,
        "dtype_max": finfo_max,
        "spacing_at_mean": spacing(mean, dtype) if mean else None,
        "input_rounding_err_std": input_err,
        "mean_lowp_accumulation_err_std": mean_err(mean_seq),
        "mean_fp32_accumulation_err_std": mean_err(mean_acc32),
        "sum_of_squares_exact_max": exact_sumsq,
        "sum_of_squares_lowp_accumulation_overflow": bool(torch.isinf(sumsq_seq).any()),
        "sum_of_squares_fp32_accumulation_overflow": bool(torch.isinf(sumsq_acc32).any()),
        "var_one_pass_rel_err": var_err(var_onepass),
        "var_two_pass_rel_err": var_err(var_twopass),
        "output_lowp_err": _max_abs(y_lowp, y64),
        "output_kernel_err": _max_abs(y_kernel, y64),
        "output_fp32_from_rounded_input_err": _max_abs(y_fp32, y64),
        "kernel_output_dtype": dtype_name(y_kernel.dtype),
    }
