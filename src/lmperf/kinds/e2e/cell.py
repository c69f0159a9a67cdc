"""End-to-end cell: time forward, backward and the AdamW step of one LM configuration.

Answers benchmarking_script, benchmarking_mixed_precision (c) and torch_compile (b). The
course's method: ``timeit.default_timer``, synchronize after each phase, ``w`` warm-up then
``n`` measured steps. A training step is timed phase by phase (forward incl. loss, backward,
optimizer step); then an inference forward under ``torch.no_grad`` is timed the same way.
On CUDA, events bracket the same phases so the timer can be cross-checked against them.

A compiled cell (``--compile compiled``) compiles the model region by region (``compile_blocks``):
``torch.compile`` of every Transformer block and of the final norm, so the identical blocks share
one compiled graph and compiling costs one block, not ``num_layers`` of them; the embedding lookup,
the output projection (one matmul either way) and the loss stay eager. It takes
``--compile-cache DIR``: torch.compile's on-disk caches (Inductor's FX graphs and kernels,
AOTAutograd's results) live there. The grid fills each
cell's directory beforehand, cold and in parallel (``lmperf.kinds.e2e.compile_job``, which runs this
module in compile-only mode: the same model, inputs and calls, up to the first training step's
backward and the first no-grad forward, nothing timed but those), so the measured cell finds its
graphs on disk (``compile_cache_hits`` > 0) and the cold compile times are that job's records.

    python -m lmperf e2e --device cpu --job '{"output": "results/cpu/e2e/tiny_ctx64_fp32_eager_w5.json",
        "settings": {"model": "tiny", "context_length": 64, "precision": "fp32", "compile": "eager",
        "warmup_steps": 5, "measured_steps": 10, "batch_size": 4, "vocab_size": 10000, "attention": "plain", "seed": 0}}'
"""

from __future__ import annotations

import sys
import timeit
import types

import torch

from lmperf.core import device as devices
from lmperf.core import flops
from lmperf.core.cell import CellJob, free_memory, parse_job, process_age_s, unavailable_as_unsupported
from lmperf.core.dtypes import autocast
from lmperf.core.oom import capture_oom
from lmperf.core.record import PartialOutOfMemory
from lmperf.core.timing import PhaseTimer, flatten_summary, summarize
from lmperf.core.units import MIB
from lmperf.model import TransformerLM, config_from_name, count_parameters

TRAINING_PHASES = ("forward", "backward", "optimizer_step")
# what a compiled cell compiles (recorded in its settings): each Transformer block and the final norm
# (compile_blocks). Records without the setting compiled the whole model as one graph.
COMPILE_SCOPE = "blocks"


def configure_compile(args) -> None:
    """Set up torch.compile identically in the compile-only and the measured process, so the measured
    one finds exactly the graphs the other compiled: the cache directory (Inductor's, and the Triton
    kernels' under it), and AOTAutograd compiling the backward graph with the forward instead of at
    the first backward call (``force_non_lazy_backward_lowering``): a compile-only process that runs
    out of memory executing the forward has then compiled the backward all the same. Both only move
    compile work: what runs in the measured steps is the same."""
    import os

    import torch._functorch.config as functorch_config

    if args.compile_cache:
        cache = os.path.abspath(args.compile_cache)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    if hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        functorch_config.force_non_lazy_backward_lowering = True
    if args.compile_threads:
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = args.compile_threads


def _summaries(timer: PhaseTimer, phases: tuple[str, ...], total_name: str | None) -> dict:
    metrics = {}
    samples = timer.samples_ms
    for phase in phases:
        metrics.update(flatten_summary(phase, summarize(samples[phase])))
    if total_name:
        totals = [sum(step) for step in zip(*(samples[p] for p in phases))]
        metrics.update(flatten_summary(total_name, summarize(totals)))
        fwd_bwd = [f + b for f, b in zip(samples["forward"], samples["backward"])]
        metrics.update(flatten_summary("forward_backward", summarize(fwd_bwd)))
    for phase, event_ms in timer.event_samples_ms().items():
        metrics[f"{phase}_event_ms_samples"] = event_ms
    return metrics


def forward_backward(step_model, tokens, targets, vocab_size: int, precision: str, device, timer: PhaseTimer) -> None:
    """The training step's forward (loss included) and backward, each a phase of ``timer``."""
    with timer.phase("forward"):
        with autocast(device, precision):
            logits = step_model(tokens)
            loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab_size), targets.view(-1))
    with timer.phase("backward"):
        loss.backward()


def measure_training(step_model, optimizer, tokens, targets, args, device, clock: dict) -> dict:
    timer = PhaseTimer(device)
    for step in range(args.warmup_steps + args.measured_steps):
        timer.record = step >= args.warmup_steps
        if step == 0:  # start-up without warm-up: imports, CUDA context, model init
            clock["process_start_to_first_step_s"] = process_age_s()
            first_step_start = timeit.default_timer()
        if step == args.warmup_steps:
            clock["process_start_to_first_measured_step_s"] = process_age_s()
        forward_backward(step_model, tokens, targets, args.vocab_size, args.precision, device, timer)
        with timer.phase("optimizer_step"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if step == 0:  # the first step's wall time: under torch.compile, compilation is most of it
            clock["training_first_step_ms"] = (timeit.default_timer() - first_step_start) * 1e3
    return _summaries(timer, TRAINING_PHASES, "training_step")


def inference_forward(step_model, tokens, precision: str, device, timer: PhaseTimer) -> None:
    """One no-grad forward, a phase of ``timer``."""
    with torch.no_grad(), timer.phase("inference_forward"), autocast(device, precision):
        step_model(tokens)


def measure_inference(step_model, tokens, args, device) -> dict:
    timer = PhaseTimer(device)
    first = PhaseTimer(device, cuda_events=False)
    for step in range(args.warmup_steps + args.measured_steps):
        timer.record = step >= args.warmup_steps
        inference_forward(step_model, tokens, args.precision, device, first if step == 0 else timer)
    metrics = _summaries(timer, ("inference_forward",), None)
    # the first forward's wall time: under torch.compile, compiling the no-grad graph is most of it
    metrics["inference_first_forward_ms"] = first.samples_ms["inference_forward"][0]
    return metrics


def build(args, device: torch.device):
    """The cell's model config, model, the model it steps (compiled or not), tokens and targets."""
    torch.manual_seed(args.seed)
    config = config_from_name(
        args.model, context_length=args.context_length, vocab_size=args.vocab_size, attention=args.attention
    )
    with device:  # initialise on the device: CPU init of billions of parameters takes minutes
        model = TransformerLM(config)
    if args.compile == "compiled":
        configure_compile(args)
    step_model = compile_blocks(model) if args.compile == "compiled" else model
    tokens = torch.randint(0, args.vocab_size, (args.batch_size, args.context_length), device=device)
    targets = torch.randint(0, args.vocab_size, (args.batch_size, args.context_length), device=device)
    return config, model, step_model, tokens, targets


def compile_blocks(model: TransformerLM) -> TransformerLM:
    """Regional compilation, in place: ``torch.compile`` of each Transformer block and of the final
    RMSNorm. Dynamo treats a block's parameters as inputs, so every block reuses the first one's
    graphs (one for training, one under ``no_grad``) and cold compiling costs one block however deep
    the model; what is lost against compiling the model as one graph is fusion across a block's
    boundary (its residual add with the next block's norm). The speed ladder compiles the same way."""
    for layer in model.layers:
        layer.compile()
    model.ln_final.compile()
    return model


@unavailable_as_unsupported()
def measure(args, device: torch.device) -> dict:
    config, model, step_model, tokens, targets = build(args, device)
    optimizer = torch.optim.AdamW(model.parameters())
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    metrics: dict = {"parameter_count": count_parameters(model)}
    clock: dict = {}
    failures: list[str] = []
    _measure_part(
        "training",
        "training step",
        metrics,
        failures,
        device,
        lambda: measure_training(step_model, optimizer, tokens, targets, args, device, clock),
    )
    optimizer.state.clear()
    model.zero_grad(set_to_none=True)
    free_memory(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _measure_part(
        "inference",
        "inference forward",
        metrics,
        failures,
        device,
        lambda: measure_inference(step_model, tokens, args, device),
    )
    metrics.update(clock)
    if args.compile == "compiled":
        metrics.update(compile_cache_counts())
        metrics["compile_s"] = compile_seconds()  # with a warm cache: tracing and loading the graphs
        metrics["compile_scope"] = COMPILE_SCOPE
    metrics.update(_derived(metrics, config, args, devices.device_slug() if device.type == "cuda" else "cpu"))
    if failures:
        raise PartialOutOfMemory("; ".join(failures), metrics)
    return metrics


@unavailable_as_unsupported()
def compile_only(args, device: torch.device) -> dict:
    """Compile the cell's training and no-grad graphs as ``measure`` would, timing only the first
    training forward+backward and the first no-grad forward (compilation is nearly all of each).
    The optimizer step is left out: it runs eagerly, nothing of it is compiled, and its state would
    only take memory from the cells compiling beside this one."""
    if device.type == "cuda" and args.memory_fraction:
        # its share only, so a neighbour's model still fits beside it; running out of memory while
        # executing, after compiling, loses nothing
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction)
    _, model, step_model, tokens, targets = build(args, device)
    metrics: dict = {"parameter_count": count_parameters(model)}
    failures: list[str] = []
    timer = PhaseTimer(device, cuda_events=False)

    def first_training() -> dict:
        start = timeit.default_timer()
        compile_final_norm(model, tokens, args.precision, device, grad=True)
        forward_backward(step_model, tokens, targets, args.vocab_size, args.precision, device, timer)
        return {"training_first_step_ms": (timeit.default_timer() - start) * 1e3}

    def first_inference() -> dict:
        start = timeit.default_timer()
        compile_final_norm(model, tokens, args.precision, device, grad=False)
        inference_forward(step_model, tokens, args.precision, device, timer)
        return {"inference_first_forward_ms": (timeit.default_timer() - start) * 1e3}

    before = compile_seconds()
    _measure_part("training", "training forward and backward", metrics, failures, device, first_training)
    metrics["training_compile_s"] = compile_seconds() - before
    model.zero_grad(set_to_none=True)
    free_memory(device)
    before = compile_seconds()
    _measure_part("inference", "inference forward", metrics, failures, device, first_inference)
    metrics["inference_compile_s"] = compile_seconds() - before
    metrics.update(compile_cache_counts())
    metrics["compile_scope"] = COMPILE_SCOPE
    if failures:
        raise PartialOutOfMemory("; ".join(failures), metrics)
    return metrics


def compile_final_norm(model: TransformerLM, tokens: torch.Tensor, precision: str, device, grad: bool) -> None:
    """Compile the final norm's graph of one grad mode on a stand-in for its input, the residual
    stream (batch, context, d_model) in the parameters' dtype, needing a gradient in training as the
    last block's output does, so Dynamo's guards pass when the model reaches it. The compile job
    runs this first: executing the model in its memory share runs out of memory in the blocks (every
    process of the H100's job of 2591fa8 did, in training), before the final norm, whose graphs each
    measured cell then compiled itself (2 FX-graph misses in the cells that found the job's graphs)."""
    batch, context = tokens.shape
    x = torch.randn(batch, context, model.ln_final.weight.shape[0], device=device, dtype=model.ln_final.weight.dtype)
    with torch.set_grad_enabled(grad), autocast(device, precision):
        model.ln_final(x.requires_grad_(grad))


def compile_seconds() -> float:
    """Seconds torch.compile has spent compiling in this process: Dynamo's own timer of each frame's
    compilation (tracing, AOTAutograd with the backward, Inductor), whatever happens when the compiled
    code then runs (out of memory included)."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(compilation_time_metrics.get("_compile.compile_inner", []))


def compile_cache_counts() -> dict:
    """How often torch.compile found its work already done in its on-disk caches, in this process:
    hits of Inductor's FX-graph cache and of the AOTAutograd cache. ``compile_cache_hits`` > 0 means
    the first step's wall time is not a cold compile (a warm cache, e.g. a rerun on the same machine)."""
    from torch._dynamo.utils import counters

    counts = {
        "inductor_fxgraph_cache_hits": counters["inductor"]["fxgraph_cache_hit"],
        "inductor_fxgraph_cache_misses": counters["inductor"]["fxgraph_cache_miss"],
        "aot_autograd_cache_hits": counters["aot_autograd"]["autograd_cache_hit"],
        "aot_autograd_cache_misses": counters["aot_autograd"]["autograd_cache_miss"],
    }
    counts["compile_cache_hits"] = counts["inductor_fxgraph_cache_hits"] + counts["aot_autograd_cache_hits"]
    return counts


def _measure_part(name: str, what: str, metrics: dict, failures: list[str], device: torch.device, part) -> None:
    """Run one part of the cell into ``metrics`` with its ``<name>_status`` and, on CUDA, its peak
    memory; out of memory ends the part alone and is noted in ``failures``."""
    oom = capture_oom(lambda: metrics.update(part()))
    metrics[f"{name}_status"] = "oom" if oom else "ok"
    if oom:
        failures.append(f"{what}: {oom.first_line}")
    if device.type == "cuda":
        metrics[f"{name}_peak_allocated_mib"] = torch.cuda.max_memory_allocated(device) / MIB


def _derived(metrics: dict, config, args, slug: str) -> dict:
    """Throughput and model FLOP utilisation from the measured means."""
    out = {}
    tokens = args.batch_size * args.context_length
    train_flops = flops.lm_training_step_flops(config, args.batch_size, args.context_length)
    infer_flops = flops.lm_forward_flops(config, args.batch_size, args.context_length)
    out["training_step_flops"] = train_flops
    out["inference_forward_flops"] = infer_flops
    peak = devices.peak_tflops(slug, args.precision)
    out["peak_tflops"] = peak
    for name, flop in (("training_step", train_flops), ("inference_forward", infer_flops)):
        mean_ms = metrics.get(f"{name}_ms_mean")
        if mean_ms:
            out[f"{name}_tokens_per_s"] = tokens / (mean_ms / 1e3)
            out[f"{name}_tflops"] = flops.tflops_per_s(flop, mean_ms)
            out[f"{name}_mfu"] = out[f"{name}_tflops"] / peak if peak else None
    return out


def main(argv=None) -> int:
    job = parse_job("e2e", argv, __doc__.splitlines()[0])
    device = devices.check_device(job.device)
    if "compile_only" in job.settings:  # a process of the compile job (lmperf.kinds.e2e.compile_job)
        part, settings = job.settings["compile_only"], job.settings["job"]
        args = types.SimpleNamespace(
            **{k: settings[k] for k in ("batch_size", "vocab_size", "seed")},
            **part,
            compile="compiled",
            attention="plain",
            compile_only=True,
            warmup_steps=0,
            measured_steps=1,
        )
        cell = {k: part[k] for k in ("model", "context_length", "precision")}
        CellJob("e2e_compile", job.device, settings, job.output).write(
            "e2e_compile", cell, lambda: compile_only(args, device)
        )
        return 0
    args = types.SimpleNamespace(
        **{"compile_cache": None, "compile_threads": None, **job.settings},
        compile_only=False,
        concurrent_compiles=1,
        memory_fraction=None,
    )
    cell = {k: job.settings[k] for k in ("model", "context_length", "precision", "compile", "warmup_steps")}
    job.write("e2e", cell, lambda: measure(args, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
