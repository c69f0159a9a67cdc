"""GEMM ceiling cell: the best rate square N×N matmuls reach here per precision (fp32, tf32, bf16, and fp8
as ``torch._scaled_mm`` of e4m3 operands), the ceiling the ladder's measured MFU divides by. A precision
that cannot run here is ``skipped``, saying why.
"""

from __future__ import annotations

import sys
import timeit

import torch

from lmperf.core import device as devices
from lmperf.core.cell import parse_job
from lmperf.core.dtypes import torch_dtype
from lmperf.core.flops import tflops_per_s
from lmperf.core.peaks import PEAKS
from lmperf.core.timing import synchronize


def time_gemm(n: int, precision: str, args, device: torch.device) -> list[float]:
    """TFLOP/s of each repeat of ``measured_calls`` back-to-back N×N matmuls."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"  # tf32: float32 matrices, TF32 matmuls
    try:
        a, b = (torch.randn(n, n, device=device) for _ in range(2))
        if precision == "fp8":  # e4m3 operands, B column-major as _scaled_mm wants, unit scales
            a, b = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()
            one = torch.ones((), device=device)

            def matmul():
                torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        else:
            a, b = a.to(torch_dtype(precision)), b.to(torch_dtype(precision))
            out = torch.empty_like(a)

            def matmul():
                torch.matmul(a, b, out=out)

        for _ in range(args.warmup_calls):
            matmul()
        rates = []
        for _ in range(args.repeats):
            synchronize(device)
            start = timeit.default_timer()
            for _ in range(args.measured_calls):
                matmul()
            synchronize(device)
            elapsed_ms = (timeit.default_timer() - start) * 1e3
            rates.append(tflops_per_s(2 * n**3 * args.measured_calls, elapsed_ms))
        return rates
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def cannot_run(precision: str, device: torch.device) -> str | None:
    if precision in ("tf32", "fp8") and device.type != "cuda":
        return f"{precision} is a CUDA tensor-core mode; not measured on the CPU"
    if precision == "fp8" and torch.cuda.get_device_capability(device) < (8, 9):
        return "FP8 tensor cores need compute capability 8.9 or newer"
    return None


def measure(args, device: torch.device, slug: str) -> dict:
    torch.manual_seed(args.seed)
    skipped = {p: why for p in args.precisions if (why := cannot_run(p, device))}
    precisions = [p for p in args.precisions if p not in skipped]
    metrics: dict = {"sizes": sorted(args.sizes), "precisions": precisions, "runs": [], "skipped": skipped}
    for precision in precisions:
        for n in sorted(args.sizes):
            rates = time_gemm(n, precision, args, device)
            metrics["runs"].append({"precision": precision, "n": n, "tflops_samples": rates, "tflops_best": max(rates)})
        best = max((r for r in metrics["runs"] if r["precision"] == precision), key=lambda r: r["tflops_best"])
        metrics |= {f"{precision}_tflops": best["tflops_best"], f"{precision}_best_n": best["n"]}
        metrics[f"{precision}_datasheet_tflops"] = PEAKS.get(slug, {}).get(precision)
    return metrics


def main(argv=None) -> int:
    job = parse_job("gemm_peak", argv, __doc__.splitlines()[0])
    args = job.args
    device = devices.check_device(args.device)
    job.write("gemm_peak", {"probe": "square_gemm"}, lambda: measure(args, device, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
