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

``flash`` and ``compiled_flash`` on CUDA first compile our Triton kernels for every remaining cell
at once, in spawned processes (lmperf.kernels.flash.warm), so their first passes load binaries rather than
compile them; every record of the process keeps that wall time as ``warm_compile_s``, apart from
the passes.

Implementations: any name in ``lmperf.attention.IMPLEMENTATIONS``, ``compiled`` (torch.compile
of ``plain``) or ``compiled_<name>``. ``sdpa`` and ``sdpa_*`` get a unit head dimension
(PyTorch's fused kernels take only 4-D input; 3-D input falls back to the unfused math path);
``sdpa`` runs with the math backend disabled, so it is always a fused kernel or an error, and
``sdpa_cudnn`` with cuDNN's alone. One that cannot run here (``attention.Unavailable``: cuDNN
attention on a CPU) writes ``unsupported`` records.

    python -m lmperf.kinds.attention.cell --device cpu --implementation plain \
        --output 'results/cpu/attention/plain_fp32_d{head_dim}_n{seq_len}.json' \
        --head-dims 16 32 --sequence-lengths 64 128
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import timeit

import torch

from lmperf import attention
from lmperf.core import device as devices
from lmperf.core import flops
from lmperf.core.cell import free_memory, parse_job, unavailable_as_unsupported
from lmperf.core.dtypes import torch_dtype
from lmperf.core.oom import OutOfMemory, capture_oom, parse_oom_message
from lmperf.core.record import PartialOutOfMemory
from lmperf.core.timing import PhaseTimer, flatten_summary, run_passes, seconds, summarize, warm_up
from lmperf.core.units import BYTES_PER_ELEMENT, MIB
from lmperf.kinds.attention import memory_model as memory

KIND = "attention"
COMPILED = "compiled"
# Fused SDPA backends; the math backend (unfused, O(N^2) memory) is left out on purpose.
SDPA_FUSED_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
# Cells up to this length also check output and gradients against plain attention in float64.
CHECK_MAX_SEQ_LEN = 1024
# Measured only on CUDA; None elsewhere, with memory_unsupported_reason saying why.
CUDA_MEMORY_FIELDS = (
    "device_total_memory_mib",
    "device_free_memory_at_start_mib",
    "baseline_allocated_mib",
    "memory_before_backward_mib",
    "retained_by_forward_mib",
    "forward_peak_extra_mib",
    "forward_backward_peak_extra_mib",
)
# Autograd nodes that only re-view a tensor: skipped to name the node that did the work.
_VIEW_NODES = ("Select", "Squeeze", "Unsqueeze", "View", "Unsafe", "Alias", "Transpose", "Expand", "Slice", "AsStrided")


def implementation_names() -> list[str]:
    """Every name --implementation accepts."""
    registered = sorted(attention.IMPLEMENTATIONS)
    return registered + [COMPILED] + [f"{COMPILED}_{name}" for name in registered]


def base_implementation(name: str) -> tuple[str, bool]:
    """'compiled' -> ('plain', True); 'compiled_sdpa' -> ('sdpa', True); 'sdpa' -> ('sdpa', False)."""
    if name == COMPILED:
        return "plain", True
    if name.startswith(COMPILED + "_"):
        return name[len(COMPILED) + 1 :], True
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
    if base.startswith("sdpa"):  # PyTorch's SDPA variants: fused kernels take 4-D input only
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


# Memory left allocated after a cell beyond which the next cells run in a fresh process.
LEAK_TOLERANCE_MIB = 64.0


class SavedTensors:
    """saved_tensors_hooks that note every distinct storage autograd saves (the tensor is kept as is)."""

    def __init__(self, exclude: tuple[torch.Tensor, ...]):
        self._exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.storages: dict[int, tuple[int, tuple[int, ...], str]] = {}

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self._exclude:
            self.storages.setdefault(
                storage.data_ptr(), (storage.nbytes(), tuple(tensor.shape), str(tensor.dtype).replace("torch.", ""))
            )
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


def _flop_counts(batch_size: int, seq_len: int, head_dim: int) -> dict:
    return {
        "forward_flops": flops.attention_forward_flops(batch_size, 1, seq_len, seq_len, head_dim),
        "backward_flops": flops.attention_backward_flops(batch_size, 1, seq_len, seq_len, head_dim),
    }


def _device_memory(device: torch.device) -> dict:
    """The card's size and free memory at the cell's start; on other devices the CUDA fields are None, with why."""
    if device.type != "cuda":
        return {
            **dict.fromkeys(CUDA_MEMORY_FIELDS),
            "memory_unsupported_reason": (
                f"{device.type}: torch.cuda memory statistics need a CUDA device; saved tensors are still listed"
            ),
        }
    free_bytes, _ = torch.cuda.mem_get_info(device)
    return {
        "device_total_memory_mib": torch.cuda.get_device_properties(device).total_memory / MIB,
        "device_free_memory_at_start_mib": free_bytes / MIB,
    }


def _oom_facts(oom: OutOfMemory, phase: str) -> dict:
    """What an out-of-memory error says: the phase, its first line, the allocator's numbers."""
    facts = {"oom_phase": phase, "oom_message": oom.first_line, **parse_oom_message(oom.message)}
    if oom.allocated_when_caught_bytes is not None:
        facts["oom_allocated_when_caught_mib"] = oom.allocated_when_caught_bytes / MIB
    return facts


class CellPasses:
    """The passes of one (head dim, length) cell, in the order the module docstring gives.

    ``run`` adds to ``metrics`` as it goes; ``phase`` names the step running, so an
    out-of-memory record says where it happened, and ``timer`` keeps the samples taken before.
    """

    def __init__(self, fn, args, head_dim: int, seq_len: int, device: torch.device, first_cell: bool):
        self.fn, self.args, self.head_dim, self.seq_len, self.device = fn, args, head_dim, seq_len, device
        self.timer = PhaseTimer(device)
        self.warm = PhaseTimer(device, record=False)
        # The course's lengths run every measured pass; only longer ones (the OOM search) are capped.
        capped = seq_len > args.full_passes_up_to
        self.budget = {
            "min_passes": args.min_measured_passes,
            "max_seconds": args.max_phase_seconds if capped else math.inf,
        }
        # The process's first cell pays for lazy initialisation (and compilation): two warm-up passes at least.
        self.warm_budget = {"min_passes": 2 if first_cell else 1, "max_seconds": args.max_warmup_seconds}
        self.phase = "allocating inputs"
        self.q = self.k = self.v = self.grad_out = None
        self.baseline_bytes = 0

    def run(self, metrics: dict) -> None:
        args = self.args
        self.phase = "allocating inputs"
        self._allocate_inputs()

        self.phase = "forward warm-up"
        # first_forward_ms includes compilation where there is one
        metrics["first_forward_ms"], metrics["forward_warmup_passes"] = warm_up(
            lambda: self._forward(self.warm), args.warmup_passes, **self.warm_budget
        )

        self.phase = "forward"
        run_passes(lambda: self._forward(self.timer), args.measured_passes, **self.budget)
        metrics.update(flatten_summary("forward", summarize(self.timer.samples_ms["forward"])))

        self.phase = "memory pass (forward kept for backward)"
        out = self._memory_pass(metrics)

        self.phase = "backward warm-up"
        # the memory pass's backward is the first warm-up backward
        first_backward_s = seconds(functools.partial(self._gradients, out, self.warm, "first backward"))
        del out
        # first_backward_ms includes a lazy compilation where there is one
        metrics["first_backward_ms"], metrics["backward_warmup_passes"] = warm_up(
            lambda: self._backward(self.warm), args.warmup_passes, first_s=first_backward_s, **self.warm_budget
        )

        self.phase = "backward"
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        run_passes(lambda: self._backward(self.timer), args.measured_passes, **self.budget)
        metrics.update(flatten_summary("backward", summarize(self.timer.samples_ms["backward"])))
        if self.device.type == "cuda":
            metrics["forward_backward_peak_extra_mib"] = (
                torch.cuda.max_memory_allocated(self.device) - self.baseline_bytes
            ) / MIB
        for name, samples in self.timer.event_samples_ms().items():
            metrics[f"{name}_event_ms_samples"] = samples

        if self.seq_len <= CHECK_MAX_SEQ_LEN:
            self.phase = "float64 check"
            metrics.update(_check_against_float64(self.fn, self.q, self.k, self.v, self.grad_out))

    def release(self) -> None:
        self.q = self.k = self.v = self.grad_out = None

    def timings(self) -> dict:
        """Summaries of the passes timed before an out-of-memory error ended the cell."""
        out = {}
        for name, samples in self.timer.samples_ms.items():
            if samples:
                out.update(flatten_summary(name, summarize(samples)))
        return out

    def _allocate_inputs(self) -> None:
        args, device = self.args, self.device
        dtype = torch_dtype(args.precision)
        gen = torch.Generator(device=device).manual_seed(args.seed + self.seq_len * 1000 + self.head_dim)
        shape = (args.batch_size, self.seq_len, self.head_dim)  # (B, N, d)
        self.q, self.k, self.v = (
            torch.randn(shape, device=device, dtype=dtype, generator=gen, requires_grad=True) for _ in range(3)
        )
        self.grad_out = torch.randn(shape, device=device, dtype=dtype, generator=gen)

    def _forward(self, timer: PhaseTimer) -> None:
        with timer.phase("forward"):
            out = self.fn(self.q, self.k, self.v)
        del out

    def _gradients(self, out: torch.Tensor, timer: PhaseTimer, phase: str) -> None:
        with timer.phase(phase):
            grads = torch.autograd.grad(out, (self.q, self.k, self.v), self.grad_out)
        del grads

    def _backward(self, timer: PhaseTimer) -> None:
        """Re-run the forward outside the timed region, then time the backward of its output."""
        out = self.fn(self.q, self.k, self.v)
        self._gradients(out, timer, "backward")
        del out

    def _memory_pass(self, metrics: dict) -> torch.Tensor:
        """One forward whose output is kept: what autograd saves for backward, and on CUDA what that takes."""
        cuda, device = self.device.type == "cuda", self.device
        if cuda:
            torch.cuda.synchronize(device)
            self.baseline_bytes = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        saved = SavedTensors(exclude=(self.q, self.k, self.v))
        with saved.hooks():
            out = self.fn(self.q, self.k, self.v)
        if cuda:
            torch.cuda.synchronize(device)
            before_backward = torch.cuda.memory_allocated(device)
            metrics["baseline_allocated_mib"] = self.baseline_bytes / MIB
            metrics["memory_before_backward_mib"] = before_backward / MIB
            metrics["retained_by_forward_mib"] = (before_backward - self.baseline_bytes) / MIB
            metrics["forward_peak_extra_mib"] = (torch.cuda.max_memory_allocated(device) - self.baseline_bytes) / MIB
        metrics["saved_tensors_mib"] = saved.nbytes() / MIB
        metrics["retained_tensors_mib"] = saved.nbytes(also=out) / MIB  # saved ∪ output: device-independent
        metrics["saved_tensors"] = [list(s) for s in saved.storages.values()]
        metrics["output_node"] = work_node(out)
        return out


@unavailable_as_unsupported()
def measure(
    fn, args, head_dim: int, seq_len: int, device: torch.device, first_cell: bool = False, extra: dict | None = None
) -> dict:
    """Time and memory of one (head_dim, seq_len) cell; OOM raises PartialOutOfMemory with what was measured.
    `extra`: metrics of the process the record keeps as they are (the kernels' warm-up)."""
    cell_start = timeit.default_timer()
    shape = memory.Shape(args.batch_size, seq_len, head_dim, BYTES_PER_ELEMENT[args.precision])
    metrics: dict = {"batch_size": args.batch_size, "head_dim": head_dim, "sequence_length": seq_len, **(extra or {})}
    metrics.update(predictions(args.implementation, shape))
    metrics.update(_flop_counts(args.batch_size, seq_len, head_dim))
    metrics.update(_device_memory(device))
    passes = CellPasses(fn, args, head_dim, seq_len, device, first_cell)
    oom = capture_oom(lambda: passes.run(metrics), device)
    passes.release()  # after capture_oom returned: the failing frames (and their tensors) are gone
    free_memory(device)
    if oom is not None:
        metrics.update({k: v for k, v in passes.timings().items() if k not in metrics})
    for name in ("forward", "backward"):
        mean_ms = metrics.get(f"{name}_ms_mean")
        if mean_ms:
            metrics[f"{name}_tflops"] = flops.tflops_per_s(metrics[f"{name}_flops"], mean_ms)
    metrics["cell_wall_s"] = timeit.default_timer() - cell_start
    if oom is not None:
        facts = _oom_facts(oom, passes.phase)
        metrics.update(facts)
        raise PartialOutOfMemory(f"out of memory in {facts['oom_phase']}: {facts['oom_message']}", metrics)
    return metrics


# how the passes are timed (in every record's metrics)
TIMING = (
    "default_timer per pass, synchronize before and after; backward re-runs the "
    "forward outside the timed region (no retain_graph)"
)


def warm_flash(args, grid: list[tuple[int, int]], device: torch.device) -> dict:
    """Compile our Triton kernels for every (head dim, length) of `grid` side by side, before the
    first cell (lmperf.kernels.flash.warm), for ``flash`` and ``compiled_flash`` (torch.compile leaves our
    kernels eager) on CUDA; elsewhere nothing. The cells run them non-causal, forward and backward
    (both timed), in TF32 where the process allows it. Returns the records' warm-up metrics."""
    if base_implementation(args.implementation)[0] != "flash" or device.type != "cuda":
        return {}
    from lmperf.kernels.flash.warm import warm_kernels, warm_specs

    shapes = [(args.batch_size, seq_len, head_dim) for head_dim, seq_len in grid]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    return warm_kernels(warm_specs(shapes, args.precision, causal=False, tf32=tf32))


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
    new_argv = [sys.executable, "-m", "lmperf.kinds.attention.cell", *argv, "--skip-cells", str(cells_done)]
    print(f"restarting in a fresh process for the cells after the first {cells_done}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execv(sys.executable, new_argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    skip_cells = 0
    if "--skip-cells" in argv:  # internal: this process restarted itself after a leak (restart_without_leak)
        at = argv.index("--skip-cells")
        skip_cells, argv = int(argv[at + 1]), argv[:at] + argv[at + 2 :]
    job = parse_job("attention", argv, __doc__.splitlines()[0])
    args = job.args
    args.skip_cells = skip_cells
    device = devices.check_device(args.device)
    start_allocated = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    compiled = base_implementation(args.implementation)[1]
    labels = {"timing": TIMING}
    if base_implementation(args.implementation)[0] == "sdpa":
        labels["sdpa_backends"] = list(SDPA_FUSED_BACKENDS)
    if base_implementation(args.implementation)[0] == "flash" and args.precision == "fp32" and device.type == "cuda":
        # what our kernels' tl.dot multiplies float32 inputs in (the report labels the rows by it)
        from lmperf.kernels.flash.products import dot_precision_for

        labels["dot_precision"] = dot_precision_for("fp32", torch.backends.cuda.matmul.allow_tf32)
    grid = [(head_dim, seq_len) for head_dim in args.head_dims for seq_len in sorted(args.sequence_lengths)]
    warmed = warm_flash(args, grid[args.skip_cells :], device)
    fn, first_cell = None, True
    with backend_context(args.implementation):
        for index, (head_dim, seq_len) in enumerate(grid):
            if index < args.skip_cells:
                continue
            if fn is None or (compiled and not args.compile_dynamic):
                torch._dynamo.reset()  # static shapes: a fresh compilation per cell
                fn = build(args.implementation, args.compile_dynamic)
                first_cell = True
            cell = {
                "implementation": args.implementation,
                "head_dim": head_dim,
                "sequence_length": seq_len,
                "batch_size": args.batch_size,
                "precision": args.precision,
            }
            output = args.output.format(head_dim=head_dim, seq_len=seq_len)
            measure_cell = functools.partial(measure, fn, args, head_dim, seq_len, device, first_cell, warmed)
            job.write(KIND, cell, lambda m=measure_cell: {**m(), **labels}, output)
            first_cell = False
            free_memory(device)
            leaked = leaked_mib(device, start_allocated)
            if leaked > LEAK_TOLERANCE_MIB and index + 1 < len(grid):
                print(f"{leaked:.0f} MiB still allocated after d={head_dim}, N={seq_len}", file=sys.stderr)
                restart_without_leak(argv, index + 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
