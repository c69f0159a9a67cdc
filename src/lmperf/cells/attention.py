"""Attention cells: forward and backward time and memory of one attention implementation.

Answers pytorch_attention and torch_compile (a). One process runs one implementation over
every (head dim, sequence length) of the grid and writes one record per pair. Random Q, K, V
of shape (batch, seq_len, head_dim), no head dimension. Per cell, in this order:

1. forward warm-up (the first pass compiles, for ``compiled``);
2. forward passes timed one by one: ``timeit.default_timer``, synchronize before and after
   each pass, CUDA events alongside; each forward records the autograd graph, as in training;
3. the memory pass: one forward whose output is kept; ``torch.cuda.memory_allocated`` then is
   the memory in use before backward; autograd's saved tensors are listed through
   ``saved_tensors_hooks`` (on any device); its backward is the first backward warm-up;
4. backward warm-up, then backward passes timed one by one: each re-runs the forward
   *outside* the timed region, then times ``torch.autograd.grad`` of the output (no
   ``retain_graph``: a compiled backward may reuse its saved buffers, so a second backward
   on the same graph is not the same computation).

A timed phase of a length above ``--full-passes-up-to`` stops early, after at least
``--min-measured-passes``, when the next pass would take it past ``--max-phase-seconds``; warm-up likewise with ``--max-warmup-seconds`` (the first
pass always runs and does not count; a process's first cell warms up twice at least). The
record keeps how many passes ran. Out of memory is a record
(status ``oom``) that says in which phase it happened, what was measured before, and the
allocator's numbers from the error message. On CPU the memory fields say why they are empty.
An out-of-memory error inside backward can leave memory allocated that no cleanup frees
(pytorch/pytorch#82218); when more than ``LEAK_TOLERANCE_MIB`` stays allocated after a cell, the
process replaces itself (``os.execv``, ``--skip-cells``) so the remaining cells start on an empty card.

Implementations: any name in ``lmperf.attention.IMPLEMENTATIONS``, ``compiled`` (torch.compile
of ``plain``) or ``compiled_<name>``. ``sdpa`` gets a unit head dimension (PyTorch's fused
kernels take only 4-D input; 3-D input falls back to the unfused math path) and runs with the
math backend disabled, so it is always a fused kernel or an error.

    python -m lmperf.cells.attention --device cpu --implementation plain \
        --output 'results/cpu/attention/plain_fp32_d{head_dim}_n{seq_len}.json' \
        --head-dims 16 32 --sequence-lengths 64 128
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
import timeit

import torch

from lmperf import attention
from lmperf import attention_memory as memory
from lmperf import device as devices
from lmperf import flops
from lmperf.cells.common import PRECISIONS, base_parser, free_memory
from lmperf.record import PartialOutOfMemory, is_out_of_memory, run_cell
from lmperf.timing import PhaseTimer, flatten_summary, summarize

KIND = "attention"
COMPILED = "compiled"
# Fused SDPA backends; the math backend (unfused, O(N^2) memory) is left out on purpose.
SDPA_FUSED_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
# Cells up to this length also check output and gradients against plain attention in float64.
CHECK_MAX_SEQ_LEN = 1024
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Measured only on CUDA; None elsewhere, with memory_unsupported_reason saying why.
CUDA_MEMORY_FIELDS = ("device_total_memory_mib", "device_free_memory_at_start_mib", "baseline_allocated_mib",
                      "memory_before_backward_mib", "retained_by_forward_mib", "forward_peak_extra_mib",
                      "forward_backward_peak_extra_mib")
MIB = 2**20
# Autograd nodes that only re-view a tensor: skipped to name the node that did the work.
_VIEW_NODES = ("Select", "Squeeze", "Unsqueeze", "View", "Unsafe", "Alias", "Transpose", "Expand",
               "Slice", "AsStrided")


def implementation_names() -> list[str]:
    """Every name --implementation accepts."""
    registered = sorted(attention.IMPLEMENTATIONS)
    return registered + [COMPILED] + [f"{COMPILED}_{name}" for name in registered]


def base_implementation(name: str) -> tuple[str, bool]:
    """'compiled' -> ('plain', True); 'compiled_sdpa' -> ('sdpa', True); 'sdpa' -> ('sdpa', False)."""
    if name == COMPILED:
        return "plain", True
    if name.startswith(COMPILED + "_"):
        return name[len(COMPILED) + 1:], True
    return name, False


def _unit_head(fn):
    """Call a (B, H, N, d) kernel on (B, N, d) tensors through a head dimension of 1 (views only)."""

    def call(q, k, v, is_causal=False):
        return fn(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), is_causal).squeeze(1)  # (B, N, d)

    call.__name__ = f"{fn.__name__}_unit_head"
    return call


def build(name: str, compile_dynamic: bool = True):
    """The attention function a cell times, by implementation name."""
    base, compiled = base_implementation(name)
    fn = attention.get(base)
    if base == "sdpa":
        fn = _unit_head(fn)
    if compiled:
        fn = torch.compile(fn, dynamic=compile_dynamic)
    return fn


def backend_context(name: str):
    """For sdpa: allow only the fused backends for the whole process."""
    if base_implementation(name)[0] != "sdpa":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, b) for b in SDPA_FUSED_BACKENDS])


def work_node(tensor: torch.Tensor) -> str | None:
    """Name of the autograd node that produced ``tensor``, looking through views."""
    node = tensor.grad_fn
    for _ in range(8):
        if node is None or not node.name().startswith(_VIEW_NODES):
            break
        node = next((n for n, _ in node.next_functions if n is not None), None)
    return node.name() if node is not None else None


def repeat(one_pass, max_passes: int, min_passes: int, max_seconds: float) -> int:
    """Run ``one_pass`` up to ``max_passes`` times, stopping (after ``min_passes``) before the
    next pass would take the total past ``max_seconds``. Returns the number of passes run."""
    start = timeit.default_timer()
    done = 0
    while done < max_passes:
        t0 = timeit.default_timer()
        one_pass()
        done += 1
        now = timeit.default_timer()
        if done >= min_passes and (now - start) + (now - t0) > max_seconds:
            break
    return done


def warm_up(one_pass, passes: int, max_seconds: float, min_passes: int = 1,
            first_s: float | None = None) -> tuple[float, int]:
    """Run ``one_pass`` up to ``passes`` times; returns (first pass in ms, passes run).

    The first pass (compilation, lazy initialisation) always runs and does not count against
    ``max_seconds``; another runs only while the previous pass says it would still fit, or
    while fewer than ``min_passes`` have run. ``first_s``: the first pass was already run
    elsewhere and took this long.
    """
    if first_s is None:
        t0 = timeit.default_timer()
        one_pass()
        first_s = timeit.default_timer() - t0
    last = first_s
    first_ms, done = first_s * 1e3, 1
    start = timeit.default_timer()
    while done < passes and (done < min_passes or (timeit.default_timer() - start) + last <= max_seconds):
        t0 = timeit.default_timer()
        one_pass()
        last = timeit.default_timer() - t0
        done += 1
    return first_ms, done


# Memory left allocated after a cell beyond which the next cells run in a fresh process.
LEAK_TOLERANCE_MIB = 64.0

_SIZE = r"([\d.]+) (GiB|MiB|KiB|bytes|B)\b"
_UNITS = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "bytes": 1, "B": 1}
_OOM_FIELDS = {
    "oom_requested_mib": r"Tried to allocate " + _SIZE,
    "oom_total_capacity_mib": r"total capacity of " + _SIZE,
    "oom_free_mib": r"of which " + _SIZE + " is free",
    "oom_allocated_by_pytorch_mib": _SIZE + " is allocated by PyTorch",
}


def parse_oom_message(message: str) -> dict:
    """The allocator's numbers from a CUDA out-of-memory message, in MiB (absent ones omitted)."""
    out = {}
    for key, pattern in _OOM_FIELDS.items():
        match = re.search(pattern, message)
        if match:
            out[key] = float(match.group(1)) * _UNITS[match.group(2)] / MIB
    return out


def _oom_facts(exc: BaseException, phase: str, device: torch.device) -> dict:
    """What an OOM says, read while the failing frames still hold their tensors."""
    message = str(exc)
    facts = {"oom_phase": phase, "oom_message": message.splitlines()[0] if message else type(exc).__name__}
    facts.update(parse_oom_message(message))
    if device.type == "cuda":
        facts["oom_allocated_when_caught_mib"] = torch.cuda.memory_allocated(device) / MIB
    return facts


class SavedTensors:
    """saved_tensors_hooks that note every distinct storage autograd saves (the tensor is kept as is)."""

    def __init__(self, exclude: tuple[torch.Tensor, ...]):
        self._exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.storages: dict[int, tuple[int, tuple[int, ...], str]] = {}

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self._exclude:
            self.storages.setdefault(storage.data_ptr(),
                                     (storage.nbytes(), tuple(tensor.shape), str(tensor.dtype).replace("torch.", "")))
        return tensor

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)

    def nbytes(self, also: torch.Tensor | None = None) -> int:
        """Bytes of the distinct saved storages, plus ``also``'s (the output) if not among them."""
        total = sum(size for size, _, _ in self.storages.values())
        if also is not None and also.untyped_storage().data_ptr() not in self.storages:
            total += also.untyped_storage().nbytes()
        return total


def predictions(implementation: str, shape: memory.Shape) -> dict:
    """Predicted bytes (MiB, exact tensor sizes) for this implementation and for plain attention."""
    out = {}
    plain = memory.plain_accounting(shape)
    out["plain_predicted_retained_mib"] = plain.retained_bytes / MIB
    out["plain_predicted_before_backward_mib"] = plain.before_backward_bytes / MIB
    out["plain_predicted_forward_peak_extra_mib"] = plain.forward_peak_extra_bytes / MIB
    out["plain_predicted_saved_n2_matrices"] = plain.n2_matrices_saved
    base, compiled = base_implementation(implementation)
    # a compiled plain attention saves what the partitioner chooses: measured, not predicted
    own = None if compiled and base == "plain" else memory.accounting(base, shape)
    out["predicted_retained_mib"] = own.retained_bytes / MIB if own else None
    out["predicted_before_backward_mib"] = own.before_backward_bytes / MIB if own else None
    out["n2_matrix_mib"] = shape.matrix_bytes / MIB
    return out


def _check_against_float64(fn, q, k, v, grad_out) -> dict:
    """Max abs error of output and gradients against plain attention in float64."""
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = attention.plain_attention(q64, k64, v64)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), grad_out.double())
    return {
        "check_output_max_abs_error": (out.double() - ref).abs().max().item(),
        "check_grad_max_abs_error": max((g.double() - r).abs().max().item() for g, r in zip(grads, ref_grads)),
    }


def measure(fn, args, head_dim: int, seq_len: int, device: torch.device, first_cell: bool = False) -> dict:
    """Time and memory of one (head_dim, seq_len) cell; OOM raises PartialOutOfMemory with what was measured."""
    cell_start = timeit.default_timer()
    dtype = PRECISIONS[args.precision] or torch.float32
    shape = memory.Shape(args.batch_size, seq_len, head_dim, ELEMENT_BYTES[args.precision])
    cuda = device.type == "cuda"
    metrics: dict = {"batch_size": args.batch_size, "head_dim": head_dim, "sequence_length": seq_len}
    metrics.update(predictions(args.implementation, shape))
    forward_flops = flops.attention_forward_flops(args.batch_size, 1, seq_len, seq_len, head_dim)
    metrics["forward_flops"] = forward_flops
    metrics["backward_flops"] = flops.attention_backward_flops(args.batch_size, 1, seq_len, seq_len, head_dim)
    if cuda:
        props = torch.cuda.get_device_properties(device)
        free_bytes, _ = torch.cuda.mem_get_info(device)
        metrics["device_total_memory_mib"] = props.total_memory / MIB
        metrics["device_free_memory_at_start_mib"] = free_bytes / MIB
    else:
        metrics.update(dict.fromkeys(CUDA_MEMORY_FIELDS))
        metrics["memory_unsupported_reason"] = (
            f"{device.type}: torch.cuda memory statistics need a CUDA device; saved tensors are still listed")

    timer = PhaseTimer(device)
    warm = PhaseTimer(device, record=False)
    # The course's lengths run every measured pass; only longer ones (the OOM search) are capped.
    capped = seq_len > args.full_passes_up_to
    budget = dict(min_passes=args.min_measured_passes, max_seconds=args.max_phase_seconds if capped else math.inf)
    # The process's first cell pays for lazy initialisation (and compilation): two warm-up passes at least.
    warm_budget = dict(min_passes=2 if first_cell else 1, max_seconds=args.max_warmup_seconds)
    phase = "allocating inputs"
    oom = None
    q = k = v = grad_out = out = grads = None
    try:
        gen = torch.Generator(device=device).manual_seed(args.seed + seq_len * 1000 + head_dim)
        q, k, v = (torch.randn(args.batch_size, seq_len, head_dim, device=device, dtype=dtype, generator=gen,
                               requires_grad=True) for _ in range(3))  # (B, N, d)
        grad_out = torch.randn(args.batch_size, seq_len, head_dim, device=device, dtype=dtype, generator=gen)

        def forward_pass(t=timer):
            with t.phase("forward"):
                out = fn(q, k, v)
            del out

        def backward_pass(t=timer):
            out = fn(q, k, v)
            with t.phase("backward"):
                grads = torch.autograd.grad(out, (q, k, v), grad_out)
            del grads, out

        phase = "forward warm-up"
        # first_forward_ms includes compilation where there is one
        metrics["first_forward_ms"], metrics["forward_warmup_passes"] = warm_up(
            lambda: forward_pass(warm), args.warmup_passes, **warm_budget)

        phase = "forward"
        repeat(forward_pass, args.measured_passes, **budget)
        metrics.update(flatten_summary("forward", summarize(timer.samples_ms["forward"])))

        phase = "memory pass (forward kept for backward)"
        if cuda:
            torch.cuda.synchronize(device)
            baseline = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        saved = SavedTensors(exclude=(q, k, v))
        with saved.hooks():
            out = fn(q, k, v)
        if cuda:
            torch.cuda.synchronize(device)
            before_backward = torch.cuda.memory_allocated(device)
            metrics["baseline_allocated_mib"] = baseline / MIB
            metrics["memory_before_backward_mib"] = before_backward / MIB
            metrics["retained_by_forward_mib"] = (before_backward - baseline) / MIB
            metrics["forward_peak_extra_mib"] = (torch.cuda.max_memory_allocated(device) - baseline) / MIB
        metrics["saved_tensors_mib"] = saved.nbytes() / MIB
        metrics["retained_tensors_mib"] = saved.nbytes(also=out) / MIB  # saved ∪ output: device-independent
        metrics["saved_tensors"] = [list(s) for s in saved.storages.values()]
        metrics["output_node"] = work_node(out)

        phase = "backward warm-up"
        t0 = timeit.default_timer()
        with warm.phase("first backward"):  # the memory pass's backward is the first warm-up backward
            grads = torch.autograd.grad(out, (q, k, v), grad_out)
        first_backward_s = timeit.default_timer() - t0
        del grads, out
        # first_backward_ms includes a lazy compilation where there is one
        metrics["first_backward_ms"], metrics["backward_warmup_passes"] = warm_up(
            lambda: backward_pass(warm), args.warmup_passes, first_s=first_backward_s, **warm_budget)

        phase = "backward"
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        repeat(backward_pass, args.measured_passes, **budget)
        metrics.update(flatten_summary("backward", summarize(timer.samples_ms["backward"])))
        if cuda:
            metrics["forward_backward_peak_extra_mib"] = (torch.cuda.max_memory_allocated(device) - baseline) / MIB
        for name, samples in timer.event_samples_ms().items():
            metrics[f"{name}_event_ms_samples"] = samples

        if seq_len <= CHECK_MAX_SEQ_LEN:
            phase = "float64 check"
            metrics.update(_check_against_float64(fn, q, k, v, grad_out))
    except Exception as exc:  # noqa: BLE001 - only OOM becomes a record, the rest re-raises
        if not is_out_of_memory(exc):
            raise
        oom = _oom_facts(exc, phase, device)
    # Out of the except block: the failing frames (and their tensors) are gone.
    q = k = v = grad_out = out = grads = None
    free_memory(device)
    for name in ("forward", "backward"):
        if f"{name}_ms_mean" not in metrics and timer.samples_ms.get(name):
            metrics.update(flatten_summary(name, summarize(timer.samples_ms[name])))
    for name in ("forward", "backward"):
        mean = metrics.get(f"{name}_ms_mean")
        if mean:
            metrics[f"{name}_tflops"] = metrics[f"{name}_flops"] / (mean / 1e3) / 1e12
    metrics["cell_wall_s"] = timeit.default_timer() - cell_start
    if oom is not None:
        metrics.update(oom)
        raise PartialOutOfMemory(f"out of memory in {oom['oom_phase']}: {oom['oom_message']}", metrics)
    return metrics


def parse_args(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.description = __doc__.splitlines()[0]
    for action in p._actions:  # --output is a template here: one record per (head dim, length)
        if action.dest == "output":
            action.help = "record path template with {head_dim} and {seq_len}"
    p.add_argument("--implementation", required=True, choices=implementation_names())
    p.add_argument("--head-dims", type=int, nargs="+", required=True)
    p.add_argument("--sequence-lengths", type=int, nargs="+", required=True)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--precision", choices=sorted(ELEMENT_BYTES), default="fp32")
    p.add_argument("--warmup-passes", type=int, default=5)
    p.add_argument("--measured-passes", type=int, default=100)
    p.add_argument("--min-measured-passes", type=int, default=2)
    p.add_argument("--max-phase-seconds", type=float, default=float("inf"),
                   help="stop a phase early (after --min-measured-passes) before it would pass this")
    p.add_argument("--full-passes-up-to", type=int, default=0,
                   help="sequence lengths up to this run every measured pass, whatever --max-phase-seconds says")
    p.add_argument("--max-warmup-seconds", type=float, default=float("inf"),
                   help="stop warm-up early before it would pass this (the first pass is not counted)")
    p.add_argument("--compile-dynamic", action=argparse.BooleanOptionalAction, default=True,
                   help="torch.compile(dynamic=True): one compilation for every shape")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-cells", type=int, default=0,
                   help="skip the first K (head dim, length) cells (set when a process restarts itself after a leak)")
    args = p.parse_args(argv)
    if "{head_dim}" not in args.output or "{seq_len}" not in args.output:
        p.error("--output must contain {head_dim} and {seq_len}")
    if args.warmup_passes < 1 or args.measured_passes < 1 or not 1 <= args.min_measured_passes <= args.measured_passes:
        p.error("need --warmup-passes >= 1 and 1 <= --min-measured-passes <= --measured-passes")
    if min(args.head_dims + args.sequence_lengths + [args.batch_size]) < 1:
        p.error("head dims, sequence lengths and batch size must be positive")
    return args


def leaked_mib(device: torch.device, start_allocated: int) -> float:
    """Memory still allocated after a cell and its cleanup, beyond what the process began with."""
    if device.type != "cuda":
        return 0.0
    return (torch.cuda.memory_allocated(device) - start_allocated) / MIB


def restart_without_leak(argv: list[str], cells_done: int) -> None:
    """Replace this process by a fresh one that runs the cells after the first ``cells_done``.

    An out-of-memory error inside backward can leave the autograd engine's intermediate
    buffers allocated however the caller cleans up (pytorch/pytorch#82218, open): every later
    cell in this process would then start with that memory taken and run out early. A fresh
    process (same pid, same log) starts with the whole card again.
    """
    kept = [a for i, a in enumerate(argv) if a != "--skip-cells" and (i == 0 or argv[i - 1] != "--skip-cells")]
    new_argv = [sys.executable, "-m", "lmperf.cells.attention", *kept, "--skip-cells", str(cells_done)]
    print(f"restarting in a fresh process for the cells after the first {cells_done}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execv(sys.executable, new_argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    device = devices.check_device(args.device)
    start_allocated = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    compiled = base_implementation(args.implementation)[1]
    settings = {key: value for key, value in vars(args).items() if key not in ("output", "skip_cells")}
    settings["timing"] = ("default_timer per pass, synchronize before and after; backward re-runs the "
                          "forward outside the timed region (no retain_graph)")
    if base_implementation(args.implementation)[0] == "sdpa":
        settings["sdpa_backends"] = list(SDPA_FUSED_BACKENDS)
    grid = [(head_dim, seq_len) for head_dim in args.head_dims for seq_len in sorted(args.sequence_lengths)]
    fn, first_cell = None, True
    with backend_context(args.implementation):
        for index, (head_dim, seq_len) in enumerate(grid):
            if index < args.skip_cells:
                continue
            if fn is None or (compiled and not args.compile_dynamic):
                torch._dynamo.reset()  # static shapes: a fresh compilation per cell
                fn = build(args.implementation, args.compile_dynamic)
                first_cell = True
            cell = {"implementation": args.implementation, "head_dim": head_dim, "sequence_length": seq_len,
                    "batch_size": args.batch_size, "precision": args.precision}
            output = args.output.format(head_dim=head_dim, seq_len=seq_len)
            run_cell(KIND, cell, output, lambda: devices.provenance(args.device, settings),
                     lambda: measure(fn, args, head_dim, seq_len, device, first_cell))
            first_cell = False
            free_memory(device)
            leaked = leaked_mib(device, start_allocated)
            if leaked > LEAK_TOLERANCE_MIB and index + 1 < len(grid):
                print(f"{leaked:.0f} MiB still allocated after d={head_dim}, N={seq_len}", file=sys.stderr)
                restart_without_leak(argv, index + 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
