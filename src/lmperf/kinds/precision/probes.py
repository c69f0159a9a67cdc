"""Mixed-precision probes: accumulation in fp16/fp32, autocast's dtypes, layer norm in low precision;
each returns plain values (floats, dtype names)."""

from __future__ import annotations

import collections
import math

import torch
from torch import nn

from lmperf.core.dtypes import DTYPES, dtype_name

# Explicit mantissa bits: the spacing of numbers in [2^e, 2^(e+1)) is 2^(e-bits).
MANTISSA_BITS = {"fp32": 23, "fp16": 10, "bf16": 7, "fp64": 52}
# The course's four loops: name -> (accumulator dtype, increment dtype, cast the increment first)
ACCUMULATION_VARIANTS = {
    "fp32 += fp32": ("fp32", "fp32", False),
    "fp16 += fp16": ("fp16", "fp16", False),
    "fp32 += fp16": ("fp32", "fp16", False),
    "fp32 += fp16 cast to fp32": ("fp32", "fp16", True),
}


def spacing(x: float, dtype: str) -> float:
    """Distance from |x| to the next representable number of ``dtype`` (normal range)."""
    if x == 0 or not math.isfinite(x):
        return float("nan")
    return 2.0 ** (math.floor(math.log2(abs(x))) - MANTISSA_BITS[dtype])


def accumulate(variant: str, steps: int, increment: float, device) -> dict:
    """One of the course's loops, exactly as written there, and what its result means."""
    acc_dtype, inc_dtype, cast = ACCUMULATION_VARIANTS[variant]
    s = torch.tensor(0, dtype=DTYPES[acc_dtype], device=device)
    for _ in range(steps):
        x = torch.tensor(increment, dtype=DTYPES[inc_dtype], device=device)
        s += x.type(DTYPES[acc_dtype]) if cast else x
    result, stored = float(s.item()), float(torch.tensor(increment, dtype=DTYPES[inc_dtype]).item())
    return {
        "variant": variant,
        "steps": steps,
        "result": result,
        "exact": steps * increment,
        "abs_error": abs(result - steps * increment),
        "stored_increment": stored,
        "exact_sum_of_stored_increment": steps * stored,  # what an exact accumulator reaches
        "accumulator_spacing_at_result": spacing(result, acc_dtype),
    }


def toy_model(in_features: int, out_features: int) -> nn.Sequential:
    """The course's toy model: fc1 (no bias) → ReLU → LayerNorm(10) → fc2 (no bias)."""
    layers = dict(fc1=nn.Linear(in_features, 10, bias=False), relu=nn.ReLU(), ln=nn.LayerNorm(10))
    return nn.Sequential(collections.OrderedDict(**layers, fc2=nn.Linear(10, out_features, bias=False)))


def toy_model_dtypes(
    autocast_dtype: str, device, in_features: int, out_features: int, batch_size: int, seed: int
) -> dict:
    """Dtypes inside ``torch.autocast(dtype=autocast_dtype)`` with fp32 parameters, read from hooks and
    tensors, not asserted from docs: the parameters as the module holds them, each module's output, the
    loss and the gradients."""
    device = torch.device(device)
    torch.manual_seed(seed)
    model = toy_model(in_features, out_features).to(device)
    x = torch.randn(batch_size, in_features, device=device)
    targets = torch.randint(0, out_features, (batch_size,), device=device)
    out: dict[str, str] = {}
    for name in ("fc1", "relu", "ln"):
        getattr(model, name).register_forward_hook(
            lambda m, i, o, name=name: out.__setitem__(name, dtype_name(o.dtype))
        )
    with torch.autocast(device_type=device.type, dtype=DTYPES[autocast_dtype]):
        parameters = {name: dtype_name(p.dtype) for name, p in model.named_parameters()}
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, targets)
    loss.backward()
    return {
        "parameters": parameters,
        **{f"{name}_output": dtype for name, dtype in out.items()},
        "logits": dtype_name(logits.dtype),
        "loss": dtype_name(loss.dtype),
        "gradients": {name: dtype_name(p.grad.dtype) for name, p in model.named_parameters()},
    }


def _sequential_sum(columns: torch.Tensor) -> torch.Tensor:
    """Row sums accumulated left to right in the tensor's own dtype (each partial sum rounded)."""
    acc = torch.zeros(columns.shape[0], dtype=columns.dtype, device=columns.device)
    for j in range(columns.shape[1]):
        acc = acc + columns[:, j]
    return acc


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| in float64; inf where ``a`` holds non-finite values (records store it as null)."""
    a64 = a.to(torch.float64)
    return float((a64 - b.to(torch.float64)).abs().max()) if torch.isfinite(a64).all() else float("inf")


def layer_norm_errors(
    dtype: str, mean: float, std: float, width: int, rows: int, device, seed: int, eps: float = 1e-5
) -> dict:
    """Errors of each part of layer norm on ``rows`` × ``width`` inputs mean + std·N(0, 1) in ``dtype``,
    against float64: mean and output in units of the float64 std, variance relative."""
    gen = torch.Generator().manual_seed(seed)
    x64 = (mean + std * torch.randn(rows, width, generator=gen, dtype=torch.float64)).to(device)
    mu64, var64 = x64.mean(-1), x64.var(-1, unbiased=False)
    sd = float(var64.sqrt().min())
    y64 = (x64 - mu64[:, None]) / torch.sqrt(var64[:, None] + eps)
    lp = DTYPES[dtype]
    x = x64.to(lp)

    def var_err(v: torch.Tensor) -> float:
        v64 = v.to(torch.float64)
        return float(((v64 - var64).abs() / var64).max()) if torch.isfinite(v64).all() else float("inf")

    # statistics accumulated in fp32 (as PyTorch's reductions and the fused kernel do), stored in lp
    mean_acc32 = x.float().mean(-1).to(lp)
    var_onepass = ((x.float() ** 2).mean(-1).to(lp) - mean_acc32 * mean_acc32).to(lp)  # E[x²] − E[x]², in lp
    var_twopass = ((x.float() - mean_acc32.float()[:, None]) ** 2).mean(-1).to(lp)
    # the output with every intermediate in lp (two-pass statistics), from the fused kernel, and in fp32
    xc = x - mean_acc32[:, None]
    y_lowp = xc / torch.sqrt((xc * xc).mean(-1, keepdim=True) + eps)
    return {
        "dtype": dtype,
        "mean": mean,
        "std": std,
        "width": width,
        "rows": rows,
        "dtype_max": float(torch.finfo(lp).max),
        "input_rounding_err_std": _max_abs(x, x64) / sd,
        "mean_lowp_accumulation_err_std": _max_abs(_sequential_sum(x) / width, mu64) / sd,
        "mean_fp32_accumulation_err_std": _max_abs(mean_acc32, mu64) / sd,
        "sum_of_squares_exact_max": float((x64 * x64).sum(-1).max()),
        "sum_of_squares_fp32_accumulation_overflow": bool(torch.isinf((x.float() ** 2).sum(-1).to(lp)).any()),
        "var_one_pass_rel_err": var_err(var_onepass),
        "var_two_pass_rel_err": var_err(var_twopass),
        "output_lowp_err": _max_abs(y_lowp, y64),
        "output_kernel_err": _max_abs(nn.functional.layer_norm(x, (width,), eps=eps), y64),
        "output_fp32_from_rounded_input_err": _max_abs(nn.functional.layer_norm(x.float(), (width,), eps=eps), y64),
    }
