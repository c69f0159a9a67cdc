"""torch_compile (b): the whole model under ``torch.compile``, one compilation for every context length.

One process per (model, precision): the model is built once, compiled whole
(``torch.compile(model)``) with the sequence dimension of its input marked dynamic
(``torch._dynamo.mark_dynamic``), and timed at each context length in turn, shortest first,
exactly as ``lmperf.cells.e2e`` times an eager cell (its ``measure_training`` and
``measure_inference``): ``w`` warm-up then ``n`` measured training steps phase by phase, then
inference forwards under ``torch.no_grad``. One record per context, the same cell keys as e2e's
(``compile: compiled``), so the report pairs each with its eager cell.

Compiling dominates the first length's first training step and first no-grad forward; the later
lengths reuse both graphs. Each record says which: ``graphs_compiled`` (Dynamo graphs compiled
while that length ran; 0 where the compilation was reused) and ``compiled_at_context_length``.
Static compilation would compile anew for every length (1-3 minutes each on an H100).
Out of memory ends that length's part alone (an ``oom`` record) and the next length runs.

    python -m lmperf.cells e2e_compiled --device h100 --model small --context-lengths 128 256 512 1024 \\
        --output 'results/h100/e2e/small_ctx{ctx}_fp32_compiled_w5.json'
"""

from __future__ import annotations

import argparse
import sys

import torch

from lmperf import device as devices
from lmperf.cells.common import base_parser, free_memory, unavailable_as_unsupported
from lmperf.cells.e2e import _derived, _measure_part, measure_inference, measure_training
from lmperf.model import TransformerLM, config_from_name, count_parameters
from lmperf.record import PartialOutOfMemory, run_cell

# process clocks only mean start-up for the first length (later ones ran after other lengths)
FIRST_LENGTH_ONLY = ("process_start_to_first_step_s", "process_start_to_first_measured_step_s")


def parse_args(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--context-lengths", type=int, nargs="+", required=True)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--measured-steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.warmup_steps < 0 or args.measured_steps < 1:
        p.error("--warmup-steps must be >= 0 and --measured-steps >= 1")
    if min(args.context_lengths) < 2:
        p.error("--context-lengths must be at least 2 (Dynamo specialises lengths 0 and 1)")
    if "{ctx}" not in args.output:
        p.error("--output must hold {ctx}: one record per context length")
    return args


def graphs_compiled() -> int:
    """Dynamo graphs compiled so far in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class Compiled:
    """The model, its optimizer and the compiled module, built once for every length."""

    def __init__(self, args, device: torch.device):
        torch.manual_seed(args.seed)
        self.config = config_from_name(
            args.model, context_length=max(args.context_lengths), vocab_size=args.vocab_size, attention="plain"
        )
        with device:  # initialise on the device: CPU init of billions of parameters takes minutes
            self.model = TransformerLM(self.config)
        self.optimizer = torch.optim.AdamW(self.model.parameters())
        self.step_model = torch.compile(self.model)
        self.compiled_at: int | None = None  # the length whose run compiled the graphs


@unavailable_as_unsupported()
def measure_length(state: Compiled, args, context_length: int, device: torch.device, first: bool) -> dict:
    """One length's record metrics, as lmperf.cells.e2e.measure takes them for an eager cell."""
    cell_args = argparse.Namespace(**{**vars(args), "context_length": context_length})
    tokens = torch.randint(0, args.vocab_size, (args.batch_size, context_length), device=device)
    targets = torch.randint(0, args.vocab_size, (args.batch_size, context_length), device=device)
    torch._dynamo.mark_dynamic(tokens, 1)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    graphs_before = graphs_compiled()
    metrics: dict = {"parameter_count": count_parameters(state.model), "compile_dynamic_sequence": True}
    clock: dict = {}
    failures: list[str] = []
    _measure_part(
        "training",
        "training step",
        metrics,
        failures,
        device,
        lambda: measure_training(state.step_model, state.optimizer, tokens, targets, cell_args, device, clock),
    )
    state.optimizer.state.clear()
    state.model.zero_grad(set_to_none=True)
    free_memory(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _measure_part(
        "inference",
        "inference forward",
        metrics,
        failures,
        device,
        lambda: measure_inference(state.step_model, tokens, cell_args, device),
    )
    metrics.update({k: v for k, v in clock.items() if first or k not in FIRST_LENGTH_ONLY})
    metrics["graphs_compiled"] = graphs_compiled() - graphs_before
    if state.compiled_at is None and metrics["graphs_compiled"]:
        state.compiled_at = context_length
    metrics["compiled_at_context_length"] = state.compiled_at
    slug = devices.device_slug() if device.type == "cuda" else "cpu"
    metrics.update(_derived(metrics, state.config, cell_args, slug))
    if failures:
        raise PartialOutOfMemory("; ".join(failures), metrics)
    return metrics


def main(argv=None) -> int:
    args = parse_args(argv)
    device = devices.check_device(args.device)
    state = Compiled(args, device)
    for i, n in enumerate(sorted(set(args.context_lengths))):
        cell = {
            "model": args.model,
            "context_length": n,
            "precision": args.precision,
            "compile": "compiled",
            "warmup_steps": args.warmup_steps,
        }
        settings = {k: v for k, v in vars(args).items() if k not in ("output", "context_lengths")}
        settings.update(context_length=n, compile="compiled", attention="plain", dynamic_sequence=True)
        run_cell(
            "e2e",
            cell,
            args.output.format(ctx=n),
            lambda settings=settings: devices.provenance(args.device, settings),
            lambda n=n, first=(i == 0): measure_length(state, args, n, device, first),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
