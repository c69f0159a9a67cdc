"""Attention cells (pytorch_attention, torch_compile (a)): forward and backward time and memory of one
implementation over every (head dim, N) of its settings, on random (B, N, d) Q, K, V.

Per cell: forward warm-up and timed passes; one forward kept, its saved tensors listed and on CUDA its
memory read; backward warm-up and timed passes, each after an untimed forward. Lengths above
``full_passes_up_to`` stop a phase after ``min_measured_passes`` once it would pass
``max_phase_seconds``. Out of memory is a record naming the phase; one in backward can leak memory no
cleanup frees (pytorch/pytorch#82218), so the process then replaces itself for the cells left.
``sdpa*`` get a unit head dimension (4-D input only) and no math backend.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import timeit

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from lmperf import attention
from lmperf.core import device as devices
from lmperf.core import flops
from lmperf.core.cell import free_memory, parse_job
from lmperf.core.dtypes import torch_dtype
from lmperf.core.oom import capture_oom, parse_oom_message
from lmperf.core.record import PartialOutOfMemory
from lmperf.core.timing import PhaseTimer, flatten_summary, run_passes, seconds, summarize, warm_up
from lmperf.core.units import BYTES_PER_ELEMENT, MIB
from lmperf.kinds.attention import memory_model as memory

KIND = "attention"
COMPILED = "compiled"
# Fused SDPA backends; the math backend (unfused, O(N^2) memory) is left out on purpose.
SDPA_FUSED_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
LEAK_TOLERANCE_MIB = 64.0  # memory left allocated after a cell beyond which the rest run in a fresh process
SKIP = "--skip-cells"  # internal: the fresh process's cells already done


def implementation_names() -> list[str]:
    """Every implementation a job may name (the config schema lists the same)."""
    registered = sorted(attention.IMPLEMENTATIONS)
    return registered + [COMPILED] + [f"{COMPILED}_{name}" for name in registered]


def base_implementation(name: str) -> tuple[str, bool]:
    """'compiled' -> ('plain', True); 'compiled_sdpa' -> ('sdpa', True); 'sdpa' -> ('sdpa', False)."""
    if name == COMPILED:
        return "plain", True
    if name.startswith(COMPILED + "_"):
        return name[len(COMPILED) + 1 :], True
    return name, False


def build(name: str, compile_dynamic: bool):
    """The attention function a cell times, by implementation name."""
    base, compiled = base_implementation(name)
    fn = kernel = attention.get(base)
    if base.startswith("sdpa"):

        def fn(q, k, v):  # (B, N, d) -> (B, 1, N, d): PyTorch's fused kernels take 4-D input only
            return kernel(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)).squeeze(1)

    return torch.compile(fn, dynamic=compile_dynamic) if compiled else fn


def saved_bytes(fn, q, k, v) -> tuple[torch.Tensor, int, int]:
    """``fn(q, k, v)`` noting each distinct storage autograd saves for backward: (output, bytes saved
    beyond q, k and v, the same with the output's storage where it is not among them)."""
    sizes = {t.untyped_storage().data_ptr(): 0 for t in (q, k, v)}

    def pack(tensor):
        sizes.setdefault(tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = fn(q, k, v)
    saved, storage = sum(sizes.values()), out.untyped_storage()
    return out, saved, saved + (0 if storage.data_ptr() in sizes else storage.nbytes())


def memory_pass(fn, q, k, v, device: torch.device, metrics: dict) -> torch.Tensor:
    """One forward whose output is kept: what autograd saves for backward, and on CUDA what that takes."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    out, saved, retained = saved_bytes(fn, q, k, v)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        metrics["baseline_allocated_mib"] = base / MIB
        metrics["retained_by_forward_mib"] = (torch.cuda.memory_allocated(device) - base) / MIB
        metrics["forward_peak_extra_mib"] = (torch.cuda.max_memory_allocated(device) - base) / MIB
    metrics["saved_tensors_mib"], metrics["retained_tensors_mib"] = saved / MIB, retained / MIB  # any device
    return out


def passes(fn, args, head_dim: int, seq_len: int, device: torch.device, first_cell: bool, metrics: dict, at: dict):
    """The passes of one cell in the module docstring's order; ``at["phase"]`` names the one running (an
    out-of-memory record says where), ``at["timer"]`` keeps the samples taken before."""
    limit = args.max_phase_seconds if seq_len > args.full_passes_up_to else math.inf
    budget = {"min_passes": args.min_measured_passes, "max_seconds": limit}
    timer, warm = at["timer"], PhaseTimer(device, record=False)
    # the process's first cell pays for lazy initialisation (and compilation): two warm-up passes at least
    warm_budget = {"min_passes": 2 if first_cell else 1, "max_seconds": args.max_warmup_seconds}
    gen = torch.Generator(device=device).manual_seed(args.seed + seq_len * 1000 + head_dim)
    shape, dtype = (args.batch_size, seq_len, head_dim), torch_dtype(args.precision)  # (B, N, d)
    q, k, v, grad = (
        torch.randn(shape, device=device, dtype=dtype, generator=gen, requires_grad=i < 3) for i in range(4)
    )

    def forward(t: PhaseTimer) -> None:
        with t.phase("forward"):
            fn(q, k, v)  # the output goes at once

    def backward(t: PhaseTimer, out: torch.Tensor | None = None) -> None:
        out = fn(q, k, v) if out is None else out  # a forward outside the timed region
        with t.phase("backward"):
            torch.autograd.grad(out, (q, k, v), grad)

    at["phase"] = "forward warm-up"  # first_forward_ms includes compilation where there is one
    metrics["first_forward_ms"], metrics["forward_warmup_passes"] = warm_up(
        lambda: forward(warm), args.warmup_passes, **warm_budget
    )
    at["phase"] = "forward"
    run_passes(lambda: forward(timer), args.measured_passes, **budget)
    at["phase"] = "memory pass (forward kept for backward)"
    out = memory_pass(fn, q, k, v, device, metrics)
    at["phase"] = "backward warm-up"  # the memory pass's backward is the first warm-up backward
    first_s = seconds(functools.partial(backward, warm, out))
    del out
    metrics["first_backward_ms"], metrics["backward_warmup_passes"] = warm_up(
        lambda: backward(warm), args.warmup_passes, first_s=first_s, **warm_budget
    )
    at["phase"] = "backward"
    run_passes(lambda: backward(timer), args.measured_passes, **budget)


@attention.as_unsupported()
def measure(fn, args, head_dim: int, seq_len: int, device: torch.device, first_cell: bool, extra: dict) -> dict:
    """Time and memory of one cell (with ``extra``, the process's metrics); out of memory raises
    PartialOutOfMemory with what was measured."""
    start, b, (base, compiled) = timeit.default_timer(), args.batch_size, base_implementation(args.implementation)
    shape = memory.Shape(b, seq_len, head_dim, BYTES_PER_ELEMENT[args.precision])
    # predicted MiB; a compiled plain attention saves what the partitioner chooses: measured, not predicted
    own = None if compiled and base == "plain" else memory.accounting(base, shape)
    metrics = {**extra, "n2_matrix_mib": shape.matrix_bytes / MIB}
    metrics["plain_predicted_retained_mib"] = memory.plain_accounting(shape).retained_bytes / MIB
    metrics["predicted_retained_mib"] = own.retained_bytes / MIB if own else None
    metrics["predicted_before_backward_mib"] = own.before_backward_bytes / MIB if own else None
    metrics["forward_flops"] = flops.attention_forward_flops(b, 1, seq_len, seq_len, head_dim)
    metrics["backward_flops"] = flops.attention_backward_flops(b, 1, seq_len, seq_len, head_dim)
    if device.type == "cuda":
        metrics["device_total_memory_mib"] = torch.cuda.get_device_properties(device).total_memory / MIB
    at = {"phase": "allocating inputs", "timer": PhaseTimer(device, cuda_events=False)}
    oom = capture_oom(lambda: passes(fn, args, head_dim, seq_len, device, first_cell, metrics, at), device)
    free_memory(device)  # capture_oom has returned: the failing frames and their tensors are gone
    for phase, samples in at["timer"].samples_ms.items():
        metrics.update(flatten_summary(phase, summarize(samples)))
        metrics[f"{phase}_tflops"] = flops.tflops_per_s(metrics[f"{phase}_flops"], metrics[f"{phase}_ms_mean"])
    metrics["cell_wall_s"] = timeit.default_timer() - start
    if oom is not None:
        metrics.update(oom_phase=at["phase"], oom_message=oom.first_line, **parse_oom_message(oom.message))
        raise PartialOutOfMemory(f"out of memory in {at['phase']}: {oom.first_line}", metrics)
    return metrics


def process_metrics(args, cells: list[tuple[int, int]], device: torch.device) -> dict:
    """What every record of the process keeps: the SDPA backends allowed; for our kernels on CUDA, what
    ``tl.dot`` multiplies fp32 inputs in and their warm-up: compiled for every (d, N) of ``cells`` side
    by side before the first cell (torch.compile leaves our kernels eager in ``compiled_flash`` too)."""
    base, tf32 = base_implementation(args.implementation)[0], torch.backends.cuda.matmul.allow_tf32
    if base == "sdpa":
        return {"sdpa_backends": list(SDPA_FUSED_BACKENDS)}
    if base != "flash" or device.type != "cuda":
        return {}
    from lmperf.kernels.flash.products import dot_precision_for
    from lmperf.kernels.flash.warm import warm_kernels, warm_specs

    specs = warm_specs([(args.batch_size, n, d) for d, n in cells], args.precision, causal=False, tf32=tf32)
    return {
        **warm_kernels(specs),
        **({"dot_precision": dot_precision_for("fp32", tf32)} if args.precision == "fp32" else {}),
    }


def leaked_mib(device: torch.device, start_allocated: int) -> float:
    """Memory still allocated after a cell and its cleanup, beyond what the process began with."""
    return (torch.cuda.memory_allocated(device) - start_allocated) / MIB if device.type == "cuda" else 0.0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    skip = 0
    if SKIP in argv:
        at = argv.index(SKIP)
        skip, argv = int(argv[at + 1]), argv[:at] + argv[at + 2 :]
    job = parse_job(KIND, argv, __doc__.splitlines()[0])
    args = job.args
    device = devices.check_device(args.device)
    start_allocated = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    base, compiled = base_implementation(args.implementation)
    cells = [(d, n) for d in args.head_dims for n in sorted(args.sequence_lengths)]
    extra = process_metrics(args, cells[skip:], device)
    fn, fused = None, [getattr(SDPBackend, b) for b in SDPA_FUSED_BACKENDS]
    with sdpa_kernel(fused) if base == "sdpa" else contextlib.nullcontext():
        for index in range(skip, len(cells)):
            head_dim, seq_len = cells[index]
            first_cell = fn is None or (compiled and not args.compile_dynamic)
            if first_cell:
                torch._dynamo.reset()  # static shapes: a fresh compilation per cell
                fn = build(args.implementation, args.compile_dynamic)
            cell = {"implementation": args.implementation, "head_dim": head_dim, "sequence_length": seq_len}
            cell.update(batch_size=args.batch_size, precision=args.precision)
            measure_cell = functools.partial(measure, fn, args, head_dim, seq_len, device, first_cell, extra)
            job.write(KIND, cell, measure_cell, args.output.format(head_dim=head_dim, seq_len=seq_len))
            free_memory(device)
            leaked = leaked_mib(device, start_allocated)
            if leaked > LEAK_TOLERANCE_MIB and index + 1 < len(cells):  # a fresh process: same pid, same log
                print(f"{leaked:.0f} MiB still allocated after d={head_dim}, N={seq_len}: restarting", file=sys.stderr)
                sys.stdout.flush()
                command = [sys.executable, "-m", "lmperf.kinds.attention.cell", *argv, SKIP, str(index + 1)]
                os.execv(sys.executable, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
