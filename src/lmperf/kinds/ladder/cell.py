"""Speed-ladder cell: one model size at one context length, from the course's step to our best one.

Each rung changes one thing of the training step and writes one record
(``results/<device>/ladder/<model>_ctx<N>_<rung>.json``). The rungs, in order:

- ``baseline``: the course's step: fp32, the course's unfused attention, eager, ``AdamW``
- ``tf32``: TF32 tensor cores for fp32 matmuls (``torch.backends.cuda.matmul.allow_tf32``)
- ``bf16``: bf16 autocast (fp32 parameters, gradients and optimizer state)
- ``fused_adamw``: ``AdamW(fused=True)``: one fused kernel per parameter group, not foreach
- ``sdpa_flash``, ``sdpa_cudnn``, ``flash``: a fused attention: SDPA pinned to its flash or cuDNN
  backend, or our FlashAttention-2 Triton kernels (siblings: each replaces the attention)
- ``compile``: ``torch.compile`` of every Transformer block (regional compilation: identical
  blocks share one compiled graph, so compiling costs one block, not the whole model)
- ``max_batch``: the same step at doubled batch sizes up to ``--max-batch-size`` until one runs
  out of memory; the rung is the batch with the most tokens/s (every probe is kept)
- ``grad_accum``: ``--accumulation-steps`` micro-batches per optimizer step: the optimizer's
  memory-bound update of fp32 state is paid once per that many tokens (the micro-batch halves,
  down to ``--batch-size``, where the parent's runs out of memory: gradients now stay resident
  through the forwards)

A rung builds on the fastest rung (tokens/s) measured so far in this process, or on the rung
before it when none so far ran (e.g. the 2.7B model's fp32 rungs run out of memory); the record
names its parent. Timing is the course's method: ``timeit.default_timer`` with a synchronize
around each whole step (forward, loss, backward, optimizer step), ``--warmup-steps`` then
``--measured-steps``, raw samples kept. A rung's time is the **median** measured step
(``STEP_STATISTIC``; tokens/s, MFU, the fastest-rung choice and max_batch's pick follow it): with a
few steps, one slow step moved the mean by half (an H100 record of ``0827909``: 49.6, 46.5 and
138.9 ms, mean 78 ms) and with it which rung the next ones build on. The first warm-up step (which
compiles, on ``compile`` rungs) is recorded apart: ``compile_s`` = first step − median measured step.

FLOPs: ``lmperf.core.flops.lm_training_step_flops`` (matmuls only; causal attention counted in full,
as the unfused attention computes every score); the half-attention count is recorded too.
MFU against two ceilings: the datasheet's dense peak for the rung's matmul precision
(``lmperf.core.peaks.PEAKS``: fp32, tf32 or bf16) and the measured one (``--gemm-peak``, the record of
``lmperf.kinds.ladder.gemm_peak``); both also against bf16, the common yardstick of the ladder.

An out-of-memory rung is a record with status ``oom``; a rung that needs CUDA on the CPU, or
whose attention backend cannot run this shape (e.g. cuDNN or our kernels at an unsupported head
dim), is ``unsupported`` with the reason. Any other error fails the job.

    python -m lmperf ladder --output 'results/cpu/ladder/tiny_ctx64_{rung}.json' --device cpu \
        --model tiny --context-length 64
"""

from __future__ import annotations

import contextlib
import gc
import json
import sys
import time
import timeit
import traceback
import types
from pathlib import Path

import torch

from lmperf.core import device as devices
from lmperf.core import flops
from lmperf.core.cell import parse_job, process_age_s
from lmperf.core.dtypes import autocast
from lmperf.core.peaks import PEAKS
from lmperf.core.record import is_out_of_memory, make_record, write_record
from lmperf.core.timing import PhaseTimer, flatten_summary, summarize
from lmperf.core.units import MIB
from lmperf.model import TransformerLM, config_from_name, count_parameters

# rung -> (what it changes, description for the record)
CHANGES: dict[str, tuple[dict, str]] = {
    "baseline": ({}, "the course's step: fp32, unfused attention, eager, AdamW"),
    "tf32": ({"tf32": True}, "TF32 tensor cores for fp32 matmuls"),
    "bf16": ({"precision": "bf16"}, "bf16 autocast"),
    "fused_adamw": ({"fused_adamw": True}, "fused AdamW"),
    "sdpa_flash": ({"attention": "sdpa_flash"}, "SDPA, flash backend"),
    "sdpa_cudnn": ({"attention": "sdpa_cudnn"}, "SDPA, cuDNN backend"),
    "flash": ({"attention": "flash"}, "our FlashAttention-2 (Triton)"),
    "compile": ({"compile": True}, "torch.compile of each block"),
    "max_batch": ({}, "largest batch that fits (best tokens/s)"),
    "grad_accum": ({}, "gradient accumulation: several micro-batches per optimizer step"),
}
RUNGS = list(CHANGES)
BASE = {
    "precision": "fp32",
    "tf32": False,
    "attention": "plain",
    "fused_adamw": False,
    "compile": False,
    "batch_size": None,
    "accumulation_steps": 1,
}
# SDPA pinned to one backend; the model's attention then is `sdpa`
SDPA_BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION"}
# attention backends that refuse some shapes (head dims, dtypes): their errors become `unsupported`
FRAGILE_ATTENTIONS = {"sdpa_flash", "sdpa_cudnn", "flash"}
CUDA_ONLY = {
    "tf32": "TF32 is a mode of CUDA tensor cores",
    "sdpa_flash": "SDPA's flash backend runs on CUDA only",
    "sdpa_cudnn": "SDPA's cuDNN backend runs on CUDA only",
    "flash": "our FlashAttention-2 Triton kernels run on CUDA (the CPU has only Triton's interpreter)",
}


class RungUnsupported(Exception):
    pass


def ceiling_key(config: dict) -> str:
    """Which matmul rate bounds a rung: bf16 tensor cores, TF32 tensor cores or fp32 CUDA cores."""
    if config["precision"] == "bf16":
        return "bf16"
    return "tf32" if config["tf32"] else "fp32"


def step_flops(model_config, batch: int, context_length: int, accumulation_steps: int = 1) -> dict:
    """Matmul FLOPs of one optimizer step: causal attention in full (lmperf.core.flops) and halved."""
    full = flops.lm_training_step_flops(model_config, batch, context_length) * accumulation_steps
    attention_fwd = flops.attention_forward_flops(
        batch, model_config.num_heads, context_length, context_length, model_config.d_head
    )
    # forward + backward (2x) = 3x forward; causal halves the attention part
    half = full - 3 * model_config.num_layers * attention_fwd / 2 * accumulation_steps
    return {"step_flops": full, "step_flops_causal_half": half}


def utilisation(step_ms: float, flop_counts: dict, ceilings: dict) -> dict:
    """Achieved TFLOP/s and MFU against each named ceiling (TFLOP/s; None where unknown)."""
    out = {
        "achieved_tflops": flops.tflops_per_s(flop_counts["step_flops"], step_ms),
        "achieved_tflops_causal_half": flops.tflops_per_s(flop_counts["step_flops_causal_half"], step_ms),
    }
    for name, ceiling in ceilings.items():
        out[f"mfu_{name}"] = out["achieved_tflops"] / ceiling if ceiling else None
        out[f"mfu_{name}_causal_half"] = out["achieved_tflops_causal_half"] / ceiling if ceiling else None
    return out


def ceilings_for(config: dict, slug: str, gemm: dict | None) -> dict:
    key = ceiling_key(config)
    sheet = PEAKS.get(slug, {})
    gemm = gemm or {}
    return {
        "ceiling_precision": key,
        "datasheet": sheet.get(key),
        "measured": gemm.get(f"{key}_tflops"),
        "datasheet_bf16": sheet.get("bf16"),
        "measured_bf16": gemm.get("bf16_tflops"),
    }


# -- one configuration ----------------------------------------------------------------------------


def _sdpa_context(attention: str):
    if attention not in SDPA_BACKENDS:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[attention]))


def _model_attention(attention: str) -> str:
    return "sdpa" if attention in SDPA_BACKENDS else attention


def build_step(config: dict, args, device: torch.device):
    """The model, optimizer and a one-step function of ``config`` (the step is not timed here)."""
    torch.manual_seed(args.seed)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = config["tf32"]
        torch.cuda.reset_peak_memory_stats(device)
    model_config = config_from_name(
        args.model,
        context_length=args.context_length,
        vocab_size=args.vocab_size,
        attention=_model_attention(config["attention"]),
    )
    with device:
        model = TransformerLM(model_config)
    optimizer = (
        torch.optim.AdamW(model.parameters(), fused=True)
        if config["fused_adamw"]
        else torch.optim.AdamW(model.parameters())
    )
    if config["compile"]:
        # dynamic=None: a second batch size recompiles once with a symbolic batch (max_batch's probes)
        for layer in model.layers:
            layer.compile()
    batch, accum, vocab = config["batch_size"], config["accumulation_steps"], args.vocab_size
    tokens = torch.randint(0, vocab, (accum, batch, args.context_length), device=device)
    targets = torch.randint(0, vocab, (accum, batch, args.context_length), device=device)

    def step():
        with _sdpa_context(config["attention"]):
            for micro in range(accum):
                with autocast(device, config["precision"]):
                    logits = model(tokens[micro])
                    loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), targets[micro].view(-1))
                (loss / accum).backward() if accum > 1 else loss.backward()
                del logits, loss
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return model, optimizer, step


def measure_config(config: dict, args, device: torch.device) -> dict:
    """Build the model and optimizer of ``config`` and time its training steps."""
    model, optimizer, step = build_step(config, args, device)
    timer = PhaseTimer(device)
    warmup_ms = []
    for i in range(args.warmup_steps + args.measured_steps):
        timer.record = i >= args.warmup_steps
        start = timeit.default_timer()
        with timer.phase("step"):
            step()
        if i < args.warmup_steps:
            warmup_ms.append((timeit.default_timer() - start) * 1e3)
    summary = summarize(timer.samples_ms["step"])
    metrics = {
        "parameter_count": count_parameters(model),
        **flatten_summary("step", summary),
        "warmup_step_ms_samples": warmup_ms,
        "first_step_s": warmup_ms[0] / 1e3,
        "compile_s": max(0.0, (warmup_ms[0] - summary["median"]) / 1e3) if config["compile"] else None,
    }
    for name, samples in timer.event_samples_ms().items():
        metrics[f"{name}_event_ms_samples"] = samples
    if device.type == "cuda":
        metrics["peak_allocated_mib"] = torch.cuda.max_memory_allocated(device) / MIB
        metrics["peak_reserved_mib"] = torch.cuda.max_memory_reserved(device) / MIB
    del model, optimizer, step
    return metrics


PROFILE_RANGE = "ladder step"


def profile_config(config: dict, args, device: torch.device, steps: int) -> dict:
    """Inside ``nsys profile -c cudaProfilerApi``: warm up, then capture ``steps`` steps, each in an
    NVTX range ``ladder step`` with a synchronize after it."""
    _, _, step = build_step(config, args, device)
    for _ in range(args.warmup_steps):
        step()
    torch.cuda.synchronize(device)
    torch.cuda.profiler.start()
    samples = []
    for _ in range(steps):
        start = timeit.default_timer()
        with torch.cuda.nvtx.range(PROFILE_RANGE):
            step()
            torch.cuda.synchronize(device)
        samples.append((timeit.default_timer() - start) * 1e3)
    torch.cuda.profiler.stop()
    return {"profiled_step_ms_samples": samples}


def _release(device: torch.device, compiled: bool) -> None:
    if compiled:
        torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def try_config(config: dict, args, device: torch.device, reset_compiler: bool = True) -> tuple[str, str | None, dict]:
    """(status, reason, metrics): ok; oom; unsupported where a fragile attention backend refuses.

    Compiled code is dropped afterwards unless ``reset_compiler`` is false (max_batch's probes
    keep it, so later batch sizes reuse one graph with a symbolic batch instead of compiling each).
    """
    try:
        return "ok", None, measure_config(config, args, device)
    except Exception as exc:  # OOM and refusals of fragile backends only; the rest re-raises
        if is_out_of_memory(exc):
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            status = "oom"
        elif config["attention"] in FRAGILE_ATTENTIONS:
            traceback.print_exc(file=sys.stderr)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            reason = f"{config['attention']} failed here: {type(exc).__name__}: {first}"[:500]
            status = "unsupported"
        else:
            raise
    finally:
        _release(device, config["compile"] and reset_compiler)
    return status, reason, {}


# -- the ladder ----------------------------------------------------------------------------------


def load_gemm_peak(path: str | None) -> dict | None:
    if not path:
        return None
    record = json.loads(Path(path).read_text())
    return record["metrics"] if record["status"] == "ok" else None


# The statistic of the measured steps that is a rung's step time (the record says which)
STEP_STATISTIC = "median"
STEP_MS = f"step_ms_{STEP_STATISTIC}"


def derive(metrics: dict, config: dict, args, slug: str, gemm: dict | None) -> dict:
    """Tokens/s, FLOPs and MFU from a measured configuration."""
    model_config = config_from_name(args.model, context_length=args.context_length, vocab_size=args.vocab_size)
    tokens = config["batch_size"] * args.context_length * config["accumulation_steps"]
    counts = step_flops(model_config, config["batch_size"], args.context_length, config["accumulation_steps"])
    ceilings = ceilings_for(config, slug, gemm)
    out = {
        "tokens_per_step": tokens,
        "step_statistic": STEP_STATISTIC,
        "datasheet_hbm_gbps": PEAKS.get(slug, {}).get("hbm_gbps"),
        **counts,
        **{f"ceiling_{k}" if k != "ceiling_precision" else k: v for k, v in ceilings.items()},
    }
    if metrics.get(STEP_MS):
        out["tokens_per_s"] = tokens / (metrics[STEP_MS] / 1e3)
        out.update(
            utilisation(metrics[STEP_MS], counts, {k: v for k, v in ceilings.items() if k != "ceiling_precision"})
        )
    return out


def _candidates(results: dict, order: list[str]) -> list[str]:
    """Rungs measured ok so far, fastest (tokens/s) first."""
    ok = [n for n in order if results[n]["status"] == "ok"]
    return sorted(ok, key=lambda n: -results[n]["metrics"]["tokens_per_s"])


def apply_change(rung: str, parent: dict, args) -> dict:
    config = {**parent, **CHANGES[rung][0]}
    if rung == "grad_accum":
        config["accumulation_steps"] = args.accumulation_steps
    return config


def run_max_batch(parent_config: dict, args, device) -> tuple[str, str | None, dict, dict]:
    """Doubled batches until one runs out of memory (or the cap); the best tokens/s wins."""
    probes, best = [], None
    batch = parent_config["batch_size"] * 2
    while batch <= args.max_batch_size:
        config = {**parent_config, "batch_size": batch}
        status, reason, metrics = try_config(config, args, device, reset_compiler=False)
        probe = {"batch_size": batch, "status": status, "reason": reason}
        if status == "ok":
            probe[STEP_MS] = metrics[STEP_MS]
            probe["tokens_per_s"] = (
                batch * args.context_length * config["accumulation_steps"] / (metrics[STEP_MS] / 1e3)
            )
            if best is None or probe["tokens_per_s"] > best[2]:
                best = (config, metrics, probe["tokens_per_s"])
        probes.append(probe)
        if status != "ok":
            break
        batch *= 2
    _release(device, parent_config["compile"])
    if best is None:
        first = probes[0] if probes else None
        reason = (
            f"no batch above {parent_config['batch_size']} fits: batch {first['batch_size']}: {first['reason']}"
            if first
            else f"--max-batch-size {args.max_batch_size} allows no larger batch"
        )
        return (
            ("oom" if first and first["status"] == "oom" else "unsupported"),
            reason,
            {"probes": probes},
            {**parent_config, "batch_size": probes[0]["batch_size"] if probes else parent_config["batch_size"]},
        )
    config, metrics, _ = best
    return "ok", None, {**metrics, "probes": probes}, config


def run_grad_accum(parent_config: dict, args, device) -> tuple[str, str | None, dict, dict]:
    """The parent's micro-batch, accumulated; where that runs out of memory (the gradients now live
    through every micro-batch's forward), half the micro-batch, down to --batch-size."""
    config = apply_change("grad_accum", parent_config, args)
    tried = []
    while True:
        status, reason, metrics = try_config(config, args, device)
        if status != "oom" or config["batch_size"] // 2 < args.batch_size:
            break
        tried.append({"batch_size": config["batch_size"], "status": status, "reason": reason})
        config = {**config, "batch_size": config["batch_size"] // 2}
    return status, reason, {**metrics, "micro_batch_fallbacks": tried}, config


def run_ladder(args, device: torch.device, slug: str, write) -> dict:
    gemm = load_gemm_peak(args.gemm_peak)
    results: dict[str, dict] = {}
    configs: dict[str, dict] = {}
    done: list[str] = []
    base = {**BASE, "batch_size": args.batch_size}
    for index, rung in enumerate(args.rungs):
        wall_start = time.monotonic()
        candidates = _candidates(results, done)
        # declared parent: the rung listed before (its configuration, measured or not)
        declared = done[-1] if done else None
        parent = candidates[0] if candidates else declared
        parent_config = configs[parent] if parent else base
        fallbacks = []
        if rung == "baseline":
            parent, parent_config = None, base
        if device.type != "cuda" and rung in CUDA_ONLY:
            config = apply_change(rung, parent_config, args)
            status, reason, metrics = "unsupported", f"{CUDA_ONLY[rung]}; this cell runs on the CPU", {}
        elif rung == "max_batch":
            status, reason, metrics, config = run_max_batch(parent_config, args, device)
        elif rung == "grad_accum":
            status, reason, metrics, config = run_grad_accum(parent_config, args, device)
        else:
            config = apply_change(rung, parent_config, args)
            status, reason, metrics = try_config(config, args, device)
            # a fragile attention inherited from the parent (not this rung's change) that fails: the next-fastest parent
            while (
                status == "unsupported" and "attention" not in CHANGES[rung][0] and len(candidates) > 1 + len(fallbacks)
            ):
                fallbacks.append({"parent": parent, "reason": reason})
                parent = candidates[len(fallbacks)]
                parent_config = configs[parent]
                config = apply_change(rung, parent_config, args)
                status, reason, metrics = try_config(config, args, device)
        metrics = (
            {**metrics, **derive(metrics, config, args, slug, gemm)}
            if status == "ok"
            else {
                **metrics,
                **{
                    k: v
                    for k, v in derive(metrics, config, args, slug, gemm).items()
                    if not k.startswith(("tokens_per_s", "achieved", "mfu"))
                },
            }
        )
        metrics.update(
            {
                "rung_index": index,
                "parent": parent,
                "change": CHANGES[rung][1],
                "config": config,
                "parent_fallbacks": fallbacks,
                "rung_wall_s": time.monotonic() - wall_start,
                "process_age_s": process_age_s(),
            }
        )
        results[rung] = {"status": status, "reason": reason, "metrics": metrics}
        configs[rung] = config
        done.append(rung)
        write(rung, status, reason, metrics)
        print(
            f"[ladder] {args.model} ctx{args.context_length} {rung}: {status}"
            + (
                f" {metrics[STEP_MS]:.1f} ms/step ({STEP_STATISTIC}), {metrics['tokens_per_s']:.0f} tok/s"
                if status == "ok"
                else f" ({reason})"
            ),
            file=sys.stderr,
            flush=True,
        )
    return results


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--replay"]:  # internal: one rung again under nsys (lmperf.kinds.ladder.profile)
        replay = json.loads(argv[1])
        args = types.SimpleNamespace(**replay["settings"])
        device = devices.check_device(replay["device"])
        result = profile_config(replay["config"], args, device, replay["profile_steps"])
        Path(replay["output"]).write_text(json.dumps(result))
        return 0
    job = parse_job("ladder", argv, __doc__.splitlines()[0])
    args = job.args
    device = devices.check_device(args.device)
    provenance = job.provenance()

    def write(rung, status, reason, metrics):
        cell = {"model": args.model, "context_length": args.context_length, "rung": rung}
        record = make_record(
            "ladder",
            cell,
            status,
            metrics,
            # the process clock at writing (provenance's is the start's): the grid's wall time reads it
            {**provenance, **devices.process_clock(), "matmul_allow_tf32": bool(metrics["config"]["tf32"])},
            reason,
        )
        write_record(args.output.format(rung=rung), record)

    run_ladder(args, device, args.device, write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
