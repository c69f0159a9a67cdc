"""End-to-end cell: forward, backward and the AdamW step of one LM configuration timed the course's
way (a synchronize after each phase, ``warmup_steps`` then ``measured_steps``), then no-grad forwards.
On CUDA, events bracket the same phases (the timer check) and one more step runs under
``torch.profiler`` (``gpu_busy``: is the step host-bound?). A compiled cell loads its graphs from
``compile_cache``, filled by the compile job (``compile_only``), so no measured step compiles.
"""

from __future__ import annotations

import os
import sys
import timeit
import types
from functools import partial

import torch

from lmperf import attention
from lmperf.core import device as devices
from lmperf.core import flops
from lmperf.core.cell import CellJob, free_memory, parse_job, process_age_s
from lmperf.core.dtypes import autocast
from lmperf.core.oom import capture_oom
from lmperf.core.record import PartialOutOfMemory
from lmperf.core.timing import PhaseTimer, flatten_summary, summarize
from lmperf.core.units import MIB
from lmperf.model import TransformerLM, config_from_name, count_parameters

TRAINING_PHASES = ("forward", "backward", "optimizer_step")
# the first call's wall time: under torch.compile, compiling is most of it
FIRST_CALL = {"training": "training_first_step_ms", "inference": "inference_first_forward_ms"}


def configure_compile(args) -> None:
    """torch.compile's set-up for both processes: the cache, and the backward compiled with the forward
    (a compile process that runs out of memory running the forward has compiled it too)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    cache = os.path.abspath(args.compile_cache)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    if hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        functorch_config.force_non_lazy_backward_lowering = True
    inductor_config.compile_threads = args.compile_threads


def compile_blocks(model: TransformerLM) -> TransformerLM:
    """Each block and the final norm, in place: the blocks share one graph, so a cold compile costs one
    block however deep the model (docs/decisions/compile-scope.md)."""
    for layer in model.layers:
        layer.compile()
    model.ln_final.compile()
    return model


def build(args, device: torch.device):
    torch.manual_seed(args.seed)
    config = config_from_name(
        args.model, context_length=args.context_length, vocab_size=args.vocab_size, attention=args.attention
    )
    with device:  # initialise on the device: CPU init of billions of parameters takes minutes
        model = TransformerLM(config)
    if args.compile == "compiled":
        configure_compile(args)
    step_model = compile_blocks(model) if args.compile == "compiled" else model
    tokens, targets = torch.randint(0, args.vocab_size, (2, args.batch_size, args.context_length), device=device)
    return config, model, step_model, tokens, targets


def forward_backward(step_model, tokens, targets, args, device, timer: PhaseTimer) -> None:
    with timer.phase("forward"), autocast(device, args.precision):
        logits = step_model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, args.vocab_size), targets.view(-1))
    with timer.phase("backward"):
        loss.backward()


def inference_forward(step_model, tokens, args, device, timer: PhaseTimer) -> None:
    with torch.no_grad(), timer.phase("inference_forward"), autocast(device, args.precision):
        step_model(tokens)


def summaries(timer: PhaseTimer, phases: tuple[str, ...]) -> dict:
    samples = dict(timer.samples_ms)
    if len(phases) > 1:
        samples["training_step"] = [sum(step) for step in zip(*(samples[p] for p in phases))]
    metrics = {k: v for name, s in samples.items() for k, v in flatten_summary(name, summarize(s)).items()}
    metrics.update({f"{phase}_event_ms_samples": ms for phase, ms in timer.event_samples_ms().items()})
    return metrics


def gpu_busy(step, device: torch.device) -> dict:
    """``step`` once under torch.profiler: its wall time and the union of its GPU activities' spans."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize(device)
        start = timeit.default_timer()
        step()
        torch.cuda.synchronize(device)
        wall_ms = (timeit.default_timer() - start) * 1e3
    spans = [
        (e.start_ns(), e.end_ns()) for e in prof.profiler.kineto_results.events() if e.device_type() == DeviceType.CUDA
    ]
    return {"gpu_kernel_ms": covered(spans) / 1e6, "profiled_step_ms": wall_ms}


def covered(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, 0
    for begin, end in sorted(spans):
        total += max(0, end - max(begin, reach))
        reach = max(reach, end)
    return total


def measure_training(step_model, optimizer, tokens, targets, args, device, clock: dict) -> dict:
    def step(timer: PhaseTimer) -> None:
        forward_backward(step_model, tokens, targets, args, device, timer)
        with timer.phase("optimizer_step"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    timer = PhaseTimer(device)
    for i in range(args.warmup_steps + args.measured_steps):
        timer.record = i >= args.warmup_steps
        if i == 0:  # start-up without warm-up: imports, CUDA context, model init
            clock["process_start_to_first_step_s"] = process_age_s()
            first_step_start = timeit.default_timer()
        if i == args.warmup_steps:
            clock["process_start_to_first_measured_step_s"] = process_age_s()
        step(timer)
        if i == 0:
            clock[FIRST_CALL["training"]] = (timeit.default_timer() - first_step_start) * 1e3
    metrics = summaries(timer, TRAINING_PHASES)
    if device.type == "cuda":  # one more step, profiled, outside the timed ones
        metrics.update(gpu_busy(lambda: step(PhaseTimer(device, record=False)), device))
        # the GPU's busy share of a measured step: profiling slows the host, not the kernels (on an H100
        # it doubled a host-bound step's wall time, its kernel time moved under 1%)
        metrics["gpu_busy_fraction"] = metrics["gpu_kernel_ms"] / metrics["training_step_ms_median"]
    return metrics


def measure_inference(step_model, tokens, args, device) -> dict:
    timer, first = PhaseTimer(device), PhaseTimer(device, cuda_events=False)
    for i in range(args.warmup_steps + args.measured_steps):
        timer.record = i >= args.warmup_steps
        inference_forward(step_model, tokens, args, device, first if i == 0 else timer)
    return {
        **summaries(timer, ("inference_forward",)),
        FIRST_CALL["inference"]: first.samples_ms["inference_forward"][0],
    }


def measure_part(name: str, metrics: dict, failures: list[str], device: torch.device, part) -> None:
    """A part of the cell into ``metrics``, with its status and peak memory; out of memory ends it alone."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    oom = capture_oom(lambda: metrics.update(part()))
    metrics[f"{name}_status"] = "oom" if oom else "ok"
    if oom:
        failures.append(f"{name}: {oom.first_line}")
    if device.type == "cuda":
        metrics[f"{name}_peak_allocated_mib"] = torch.cuda.max_memory_allocated(device) / MIB


@attention.as_unsupported()
def measure(args, device: torch.device) -> dict:
    config, model, step_model, tokens, targets = build(args, device)
    optimizer = torch.optim.AdamW(model.parameters())
    metrics, clock, failures = {"parameter_count": count_parameters(model)}, {}, []
    training = partial(measure_training, step_model, optimizer, tokens, targets, args, device, clock)
    measure_part("training", metrics, failures, device, training)
    optimizer.state.clear()
    model.zero_grad(set_to_none=True)
    free_memory(device)
    measure_part("inference", metrics, failures, device, partial(measure_inference, step_model, tokens, args, device))
    metrics.update(clock)
    if args.compile == "compiled":
        metrics.update(compile_cache_counts(), compile_s=compile_seconds())  # warm cache: tracing, loading
    metrics.update(derived(metrics, config, args, devices.device_slug() if device.type == "cuda" else "cpu"))
    if failures:
        raise PartialOutOfMemory("; ".join(failures), metrics)
    return metrics


def derived(metrics: dict, config, args, slug: str) -> dict:
    peak = devices.peak_tflops(slug, args.precision)
    out = {"peak_tflops": peak}
    for name, flop in (
        ("training_step", flops.lm_training_step_flops(config, args.batch_size, args.context_length)),
        ("inference_forward", flops.lm_forward_flops(config, args.batch_size, args.context_length)),
    ):
        out[f"{name}_flops"] = flop
        mean_ms = metrics.get(f"{name}_ms_mean")
        if mean_ms:
            out[f"{name}_tokens_per_s"] = args.batch_size * args.context_length / (mean_ms / 1e3)
            out[f"{name}_tflops"] = flops.tflops_per_s(flop, mean_ms)
            out[f"{name}_mfu"] = out[f"{name}_tflops"] / peak if peak else None
    return out


@attention.as_unsupported()
def compile_only(args, device: torch.device) -> dict:
    """Compile the cell's training and no-grad graphs as ``measure`` would; their wall and compile times."""
    if device.type == "cuda" and args.memory_fraction:
        # its share only, so a neighbour's model still fits; running out of memory after compiling loses nothing
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction)
    _, model, step_model, tokens, targets = build(args, device)
    metrics = {"parameter_count": count_parameters(model), "concurrent_compiles": args.concurrent_compiles}
    metrics["compile_threads"] = args.compile_threads
    failures: list[str] = []
    timer = PhaseTimer(device, cuda_events=False)

    def first_call(name: str, grad: bool, run) -> dict:
        start = timeit.default_timer()
        compile_final_norm(model, tokens, args.precision, device, grad)
        run()
        return {FIRST_CALL[name]: (timeit.default_timer() - start) * 1e3}

    train = partial(forward_backward, step_model, tokens, targets, args, device, timer)
    infer = partial(inference_forward, step_model, tokens, args, device, timer)
    for name, grad, run in (("training", True, train), ("inference", False, infer)):
        before = compile_seconds()
        measure_part(name, metrics, failures, device, partial(first_call, name, grad, run))
        metrics[f"{name}_compile_s"] = compile_seconds() - before
        model.zero_grad(set_to_none=True)
        free_memory(device)
    metrics.update(compile_cache_counts())
    if failures:
        raise PartialOutOfMemory("; ".join(failures), metrics)
    return metrics


def compile_final_norm(model: TransformerLM, tokens: torch.Tensor, precision: str, device, grad: bool) -> None:
    """The final norm's graph, on a stand-in residual stream: a compile process out of memory in the
    blocks never reaches it."""
    batch, context = tokens.shape
    weight = model.ln_final.weight
    x = torch.randn(batch, context, weight.shape[0], device=device, dtype=weight.dtype)
    with torch.set_grad_enabled(grad), autocast(device, precision):
        model.ln_final(x.requires_grad_(grad))


def compile_seconds() -> float:
    """Seconds torch.compile has compiled in this process (Dynamo's timer)."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(compilation_time_metrics.get("_compile.compile_inner", []))


def compile_cache_counts() -> dict:
    """Hits and misses of Inductor's FX-graph and AOTAutograd caches in this process."""
    from torch._dynamo.utils import counters

    inductor, aot = counters["inductor"], counters["aot_autograd"]
    return {
        "compile_cache_hits": inductor["fxgraph_cache_hit"] + aot["autograd_cache_hit"],
        "compile_cache_misses": inductor["fxgraph_cache_miss"] + aot["autograd_cache_miss"],
    }


def main(argv=None) -> int:
    job = parse_job("e2e", argv, __doc__.splitlines()[0])
    device = devices.check_device(job.device)
    if "compile_only" not in job.settings:
        cell = {k: job.settings[k] for k in ("model", "context_length", "precision", "compile", "warmup_steps")}
        job.write("e2e", cell, lambda: measure(job.args, device))
        return 0
    # a process of the compile job (compile_job): its part, and the job's settings for the record
    part, settings = job.settings["compile_only"], job.settings["job"]
    shared = {k: settings[k] for k in ("batch_size", "vocab_size", "seed")}
    args = types.SimpleNamespace(**shared, **part, compile="compiled", attention="plain")
    cell = {k: part[k] for k in ("model", "context_length", "precision")}
    compile_job = CellJob("e2e_compile", job.device, settings, job.output)
    compile_job.write("e2e_compile", cell, lambda: compile_only(args, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
