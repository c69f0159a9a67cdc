"""Whole-model against per-block ("regional") torch.compile of one e2e cell: compile time and step times.

A probe for issue 16 (where the grid's time goes), not a measurement of the pipeline: the course
asks for the whole model compiled (`torch.compile(model)`, what `lmperf.cells.e2e` does); per-block
compilation compiles one TransformerBlock and reuses it for every layer. Run each mode in its own
process with an empty Inductor cache, so neither reuses the other's work:

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python bench/compile_ab.py --mode whole --model large
    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python bench/compile_ab.py --mode regional --model large
    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python bench/compile_ab.py --mode nested --model large

``--mode nested`` compiles the whole model (`torch.compile(model)`) with every TransformerBlock
marked as a nested compile region (``torch.compiler.nested_compile_region``, PyTorch >= 2.8):
Dynamo traces and Inductor compiles one block and stamps it out for every layer, instead of
inlining all of them into one graph. (Linear's ``x @ weight.T`` is run as ``x @ weight.t()``, the
same view: PyTorch 2.11-2.13 cannot lift the ``.T`` attribute of a parameter into such a region.)

Prints one JSON line per context length: the first training step's wall time (compilation,
mostly), the median training step and inference forward after warm-up (ms), as the e2e cell times
them. ``--mode dynamic`` compiles the whole model once with the sequence dimension dynamic
(``torch._dynamo.mark_dynamic``) and measures every ``--context-lengths`` in the same process,
for torch_compile (b) at all the course's lengths without one compilation per length:

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python bench/compile_ab.py --mode dynamic --model small \
        --context-lengths 128 256 512 1024
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit

import torch
import torch.nn.functional as F

from lmperf.model import TransformerLM
from lmperf.sizes import config_from_name


def timed(fn) -> float:
    torch.cuda.synchronize()
    start = timeit.default_timer()
    fn()
    torch.cuda.synchronize()
    return (timeit.default_timer() - start) * 1e3


def measure(args, step_model, optimizer, context_length: int) -> None:
    tokens = torch.randint(0, args.vocab_size, (args.batch_size, context_length), device="cuda")
    targets = torch.randint(0, args.vocab_size, (args.batch_size, context_length), device="cuda")
    if args.mode == "dynamic":
        torch._dynamo.mark_dynamic(tokens, 1)

    def train_step():
        logits = step_model(tokens)
        F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    first_ms = timed(train_step)
    train = [timed(train_step) for _ in range(args.warmup_steps - 1 + args.measured_steps)][-args.measured_steps :]
    optimizer.state.clear()
    with torch.no_grad():
        first_fwd_ms = timed(lambda: step_model(tokens))
        fwd = [timed(lambda: step_model(tokens)) for _ in range(args.warmup_steps - 1 + args.measured_steps)]
    fwd = fwd[-args.measured_steps :]
    print(
        json.dumps(
            {
                "mode": args.mode,
                "model": args.model,
                "context_length": context_length,
                "training_first_step_ms": first_ms,
                "training_step_ms_median": statistics.median(train),
                "inference_first_forward_ms": first_fwd_ms,
                "inference_forward_ms_median": statistics.median(fwd),
                "device": torch.cuda.get_device_name(),
                "torch": torch.__version__,
            }
        ),
        flush=True,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["whole", "nested", "regional", "eager", "dynamic"], required=True)
    p.add_argument("--model", default="large")
    p.add_argument("--context-lengths", type=int, nargs="+", default=[512])
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=10_000)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--measured-steps", type=int, default=10)
    args = p.parse_args(argv)

    if args.mode == "nested":
        from lmperf import model as model_module

        model_module.Linear.forward = lambda self, x: x @ self.weight.t()
        block = model_module.TransformerBlock
        block.forward = torch.compiler.nested_compile_region(block.forward)
    torch.manual_seed(0)
    config = config_from_name(args.model, context_length=max(args.context_lengths), vocab_size=args.vocab_size)
    with torch.device("cuda"):
        model = TransformerLM(config)
    optimizer = torch.optim.AdamW(model.parameters())
    if args.mode in ("whole", "nested", "dynamic"):
        step_model = torch.compile(model)
    else:
        if args.mode == "regional":
            for layer in model.layers:
                layer.compile()
        step_model = model
    for n in args.context_lengths:
        measure(args, step_model, optimizer, n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
