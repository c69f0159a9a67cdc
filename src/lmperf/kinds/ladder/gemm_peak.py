"""GEMM ceiling cell: the best matmul rate this device reaches per precision (measured MFU ceiling).

For each precision (fp32 on CUDA cores, tf32 and bf16 on tensor cores) and each square size N,
``C = A @ B`` on N×N operands is timed: warm-up calls, then ``--measured-calls`` calls between
two synchronizes (``timeit.default_timer``), repeated ``--repeats`` times; a repeat's rate is
2·N³·calls / time. The record keeps every repeat's rate and, per precision, the best one: the
ceiling that the ladder's "MFU (measured)" divides by. One record for all precisions.

    python -m lmperf gemm_peak --output results/h100/gemm_peak/peak.json --device h100 \
        --sizes 4096 8192 16384 --precisions fp32 tf32 bf16
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

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # tf32: float32 matrices with TF32 matmuls allowed


def gemm_flops(n: int) -> int:
    """2·N³: one multiply and one add per term of an N×N by N×N product."""
    return 2 * n**3


def time_gemm(n: int, precision: str, args, device: torch.device) -> list[float]:
    """TFLOP/s of each repeat of ``measured_calls`` back-to-back N×N matmuls."""
    dtype = torch_dtype(precision)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        for _ in range(args.warmup_calls):
            torch.matmul(a, b, out=out)
        rates = []
        for _ in range(args.repeats):
            synchronize(device)
            start = timeit.default_timer()
            for _ in range(args.measured_calls):
                torch.matmul(a, b, out=out)
            synchronize(device)
            elapsed_ms = (timeit.default_timer() - start) * 1e3
            rates.append(tflops_per_s(gemm_flops(n) * args.measured_calls, elapsed_ms))
        del a, b, out
        return rates
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def measure(args, device: torch.device, slug: str) -> dict:
    torch.manual_seed(args.seed)
    precisions = [p for p in args.precisions if not (p == "tf32" and device.type != "cuda")]
    metrics: dict = {"sizes": sorted(args.sizes), "precisions": precisions, "runs": []}
    if len(precisions) < len(args.precisions):
        metrics["skipped"] = {"tf32": "TF32 is a CUDA tensor-core mode; not measured on the CPU"}
    for precision in precisions:
        best = None
        for n in sorted(args.sizes):
            rates = time_gemm(n, precision, args, device)
            metrics["runs"].append({"precision": precision, "n": n, "tflops_samples": rates, "tflops_best": max(rates)})
            if best is None or max(rates) > best[0]:
                best = (max(rates), n)
        metrics[f"{precision}_tflops"] = best[0]
        metrics[f"{precision}_best_n"] = best[1]
        peak = PEAKS.get(slug, {}).get(precision)
        metrics[f"{precision}_datasheet_tflops"] = peak
        metrics[f"{precision}_fraction_of_datasheet"] = best[0] / peak if peak else None
    return metrics


def main(argv=None) -> int:
    job = parse_job("gemm_peak", argv, __doc__.splitlines()[0])
    args = job.args
    device = devices.check_device(args.device)
    job.write("gemm_peak", {"probe": "square_gemm"}, lambda: measure(args, device, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
