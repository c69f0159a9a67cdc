"""Speed-ladder cell: one model size at one context length, from the course's step to our best one.

Each rung (``CHANGES``) changes one thing of the step and writes a record; it builds on the fastest kept
rung so far. A rung is kept when its tokens/s beat its parent's by more than ``KEEP_MARGIN``: a smaller
gain is within one trial's noise, and every later rung would pay for it (max-autotune tunes each new
shape again). The batch searches double the batch until one runs out of memory. Timing is the course's (a
synchronize around each step, the median); ``compile_s`` is what the warm-up took beyond it. FLOPs count
attention as its kernel computes it; MFU is against the datasheet and the measured GEMM ceiling.

The first trial decides each rung's configuration (its parent, its batch); a later trial (its output a
trial path ``….t<i>.json``, i ≥ 1) times those configurations again, without searching, so that every
trial of a rung measures the same step. Its compiles find the first trial's in Inductor's cache, so
``compile_s`` and ``first_step_s`` are the first trial's alone.

A job killed midway (its time budget, a lost machine) keeps the rungs it finished under ``.partial/``
beside its outputs; run again with the same code and settings, it takes them and goes on from there.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import timeit
import traceback
import types
from pathlib import Path

import torch
from torch import nn

from lmperf.core import device as devices
from lmperf.core import flops
from lmperf.core.cell import free_memory, parse_job
from lmperf.core.dtypes import autocast
from lmperf.core.peaks import PEAKS
from lmperf.core.record import RecordError, is_out_of_memory, load_record, make_record, write_record
from lmperf.core.stats import SAME_MARGIN
from lmperf.core.timing import flatten_summary, summarize, synchronize
from lmperf.core.trials import first_trial_of
from lmperf.core.units import MIB
from lmperf.kinds.ladder.step import SDPA_BACKENDS, Checkpointed, fp8_unsupported, loss_of, sdpa_context, to_float8
from lmperf.model import TransformerLM, config_from_name, count_parameters

# rung -> (what it changes in its parent's configuration, description for the record)
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
    "cuda_graphs": ({"cuda_graphs": True}, "CUDA graphs: torch.compile mode reduce-overhead"),
    "max_autotune": ({"max_autotune": True}, "torch.compile max-autotune (GEMM and kernel configs autotuned)"),
    "chunked_ce": ({"chunked_ce": True}, "cross-entropy in chunks of tokens: no full fp32 logits"),
    "activation_checkpointing": ({"checkpoint": True}, "each block recomputed in the backward, largest batch"),
    "grad_accum": ({}, "gradient accumulation: several micro-batches per optimizer step"),
    "fp8_tensorwise": ({"fp8": "tensorwise"}, "FP8 linears (torchao float8, tensorwise scales; lm_head bf16)"),
    "fp8_rowwise": ({"fp8": "rowwise"}, "FP8 linears (torchao float8, rowwise scales; lm_head bf16)"),
    "fp8_max_batch": ({}, "largest batch that fits with FP8 (best tokens/s)"),
}
FLAGS = ("tf32", "fused_adamw", "compile", "cuda_graphs", "max_autotune", "chunked_ce", "checkpoint")
BASE = {**dict.fromkeys(FLAGS, False), "precision": "fp32", "attention": "plain", "fp8": None}
BASE |= {"batch_size": None, "accumulation_steps": 1}
BATCH_SEARCH = {"max_batch", "activation_checkpointing", "fp8_max_batch"}
FUSED_ATTENTIONS = {"sdpa_flash", "sdpa_cudnn", "flash"}  # causal kernels that skip the masked half
# changes through library paths that may refuse a shape or a device: their failure is `unsupported`
FRAGILE = ("attention", "fp8", "cuda_graphs", "max_autotune", "checkpoint")
CUDA_ONLY = {
    "tf32": "TF32 is a mode of CUDA tensor cores",
    "sdpa_flash": "SDPA's flash backend runs on CUDA only",
    "sdpa_cudnn": "SDPA's cuDNN backend runs on CUDA only",
    "flash": "our FlashAttention-2 Triton kernels run on CUDA (the CPU has only Triton's interpreter)",
    "cuda_graphs": "CUDA graphs are CUDA's",
    "max_autotune": "max-autotune tunes GPU kernels (Triton templates, cuBLAS); the CPU ladder leaves it out",
    **dict.fromkeys(("fp8_tensorwise", "fp8_rowwise", "fp8_max_batch"), "FP8 training needs FP8 tensor cores"),
}
HALF, FULL = "causal attention counted half", "causal attention counted in full"
KEEP_MARGIN = SAME_MARGIN  # a rung is kept when it beats its parent's tokens/s by more than this share


def fragile(config: dict) -> bool:
    return config["attention"] in FUSED_ATTENTIONS or any(config[k] for k in FRAGILE[1:])


def compile_mode(config: dict) -> str | None:
    """torch.compile's mode for the configuration (None: eager)."""
    if not (config["compile"] or config["cuda_graphs"] or config["max_autotune"]):
        return None
    if config["max_autotune"]:
        return "max-autotune" if config["cuda_graphs"] else "max-autotune-no-cudagraphs"
    return "reduce-overhead" if config["cuda_graphs"] else "default"


def ceiling_key(config: dict) -> str:
    """Which matmul rate bounds a rung: FP8 or bf16 tensor cores, TF32 tensor cores or fp32 CUDA cores."""
    return "fp8" if config["fp8"] else "bf16" if config["precision"] == "bf16" else "tf32" if config["tf32"] else "fp32"


def derive(metrics: dict, config: dict, args, slug: str, gemm: dict | None) -> dict:
    """Tokens/s, FLOPs (as the attention kernel computes them) and MFU of a measured configuration."""
    model = config_from_name(args.model, context_length=args.context_length, vocab_size=args.vocab_size)
    batch, accum, T = config["batch_size"], config["accumulation_steps"], args.context_length
    full = flops.lm_training_step_flops(model, batch, T) * accum  # every attention score (lmperf.core.flops)
    # forward + backward = 3x the forward; a causal kernel skips half the attention scores
    skipped = 3 * model.num_layers * flops.attention_forward_flops(batch, model.num_heads, T, T, model.d_head) / 2
    half = full - skipped * accum
    fused = config["attention"] in FUSED_ATTENTIONS
    key, sheet, gemm = ceiling_key(config), PEAKS.get(slug, {}), gemm or {}
    ceilings = {"datasheet": sheet.get(key), "measured": gemm.get(f"{key}_tflops")}
    for p in ("bf16", "fp8") if key == "fp8" else ("bf16",):
        ceilings |= {f"datasheet_{p}": sheet.get(p), f"measured_{p}": gemm.get(f"{p}_tflops")}
    out = {"tokens_per_step": batch * T * accum, "step_flops": full, "step_flops_causal_half": half}
    out |= {"attention_kernel": config["attention"], "flop_convention": HALF if fused else FULL}
    out |= {"compile_mode": compile_mode(config), "ceiling_precision": key, "datasheet_hbm_gbps": sheet.get("hbm_gbps")}
    out |= {f"ceiling_{k}": v for k, v in ceilings.items()}
    if ms := metrics.get("step_ms_median"):
        out["tokens_per_s"] = out["tokens_per_step"] / (ms / 1e3)
        out["achieved_tflops"] = flops.tflops_per_s(half if fused else full, ms)
        out |= {f"mfu_{k}": out["achieved_tflops"] / v if v else None for k, v in ceilings.items()}
    return out


def build_step(config: dict, args, device: torch.device):
    """The model, optimizer and a one-step function of ``config``."""
    torch.manual_seed(args.seed)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = config["tf32"]
        torch.cuda.reset_peak_memory_stats(device)
    attention = "sdpa" if config["attention"] in SDPA_BACKENDS else config["attention"]
    model_config = config_from_name(
        args.model, context_length=args.context_length, vocab_size=args.vocab_size, attention=attention
    )
    with device:
        model = TransformerLM(model_config)
    if config["fp8"]:
        to_float8(model, config["fp8"])
    if config["checkpoint"]:
        model.layers = nn.ModuleList(Checkpointed(layer) for layer in model.layers)
    # fused=False would also turn off the default foreach implementation: leave it unset
    optimizer = torch.optim.AdamW(model.parameters(), **({"fused": True} if config["fused_adamw"] else {}))
    # regional: identical blocks share one compiled graph; dynamic=None: a second batch size
    # recompiles once with a symbolic batch (the batch searches' probes)
    for layer in model.layers if compile_mode(config) else []:
        layer.compile(mode=compile_mode(config))
    batch, accum = config["batch_size"], config["accumulation_steps"]
    tokens = torch.randint(0, args.vocab_size, (accum, batch, args.context_length), device=device)
    targets = torch.randint(0, args.vocab_size, (accum, batch, args.context_length), device=device)
    chunk = args.loss_chunk_tokens if config["chunked_ce"] else None

    def step():
        if config["cuda_graphs"]:  # the last step's graph outputs are done with (micro-batches: new tree nodes)
            torch.compiler.cudagraph_mark_step_begin()
        with sdpa_context(config["attention"]):
            for micro in range(accum):
                with autocast(device, config["precision"]):
                    loss = loss_of(model, tokens[micro], targets[micro], chunk)
                (loss / accum).backward() if accum > 1 else loss.backward()
                del loss
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return model, optimizer, step


PROFILE_RANGE = "ladder step"


def run_steps(step, device: torch.device, n: int, nvtx: bool = False) -> list[float]:
    """ms of each of ``n`` steps, each between two synchronizes; under nsys each in an NVTX range."""
    samples = []
    for _ in range(n):
        synchronize(device)
        start = timeit.default_timer()
        with torch.cuda.nvtx.range(PROFILE_RANGE) if nvtx else contextlib.nullcontext():
            step()
            synchronize(device)
        samples.append((timeit.default_timer() - start) * 1e3)
    return samples


def measure_config(config: dict, args, device: torch.device) -> dict:
    model, optimizer, step = build_step(config, args, device)
    warmup = run_steps(step, device, args.warmup_steps)
    summary = summarize(run_steps(step, device, args.measured_steps))
    metrics = {"parameter_count": count_parameters(model), **flatten_summary("step", summary)}
    metrics |= {"warmup_step_ms_samples": warmup, "first_step_s": warmup[0] / 1e3}
    metrics["compile_s"] = sum(max(0.0, w - summary["median"]) for w in warmup) / 1e3 if compile_mode(config) else None
    if device.type == "cuda":
        metrics["peak_allocated_mib"] = torch.cuda.max_memory_allocated(device) / MIB
    return metrics


def profile_config(config: dict, args, device: torch.device, steps: int) -> dict:
    """Inside ``nsys profile -c cudaProfilerApi``: warm up, then capture ``steps`` steps."""
    _, _, step = build_step(config, args, device)
    run_steps(step, device, args.warmup_steps)
    torch.cuda.profiler.start()
    samples = run_steps(step, device, steps, nvtx=True)
    torch.cuda.profiler.stop()
    return {"profiled_step_ms_samples": samples}


def release(device: torch.device, compiled: bool) -> None:
    if compiled:
        torch._dynamo.reset()  # its graphs, and the memory pools of its CUDA graphs
    free_memory(device)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:500]


def try_config(config: dict, args, device, keep_compiled: bool = False) -> tuple[str, str | None, dict]:
    """(status, reason, metrics): ok; oom; unsupported where a ``fragile`` configuration fails; else raises.
    ``keep_compiled``: a batch search's probes reuse the compiled graph, unless it holds CUDA graphs."""
    try:
        return "ok", None, measure_config(config, args, device)
    except Exception as exc:
        if is_out_of_memory(exc):
            status, reason = "oom", first_line(exc)
        elif fragile(config):
            traceback.print_exc(file=sys.stderr)
            status, reason = "unsupported", f"failed here: {first_line(exc)}"
        else:
            raise
    finally:
        release(device, bool(compile_mode(config)) and not (keep_compiled and not config["cuda_graphs"]))
    return status, reason, {}


def apply_change(rung: str, parent: dict, args) -> dict:
    config = {**parent, **CHANGES[rung][0]}
    if rung == "grad_accum":
        config["accumulation_steps"] = args.accumulation_steps
    return config


def search_batch(config: dict, args, device, batch: int) -> tuple[str, str | None, dict, dict]:
    """Doubled batches from ``batch`` until one runs out of memory or passes the cap; the most tokens/s wins."""
    probes, best = [], None
    while batch <= args.max_batch_size:
        status, reason, metrics = try_config({**config, "batch_size": batch}, args, device, keep_compiled=True)
        probes.append({"batch_size": batch, "status": status, "reason": reason})
        if status != "ok":
            break
        tokens_per_s = batch * args.context_length * config["accumulation_steps"] / (metrics["step_ms_median"] / 1e3)
        probes[-1] |= {"step_ms_median": metrics["step_ms_median"], "tokens_per_s": tokens_per_s}
        if best is None or tokens_per_s > best[0]["tokens_per_s"]:
            best = (probes[-1], metrics)
        batch *= 2
    release(device, bool(compile_mode(config)))
    if best is None:
        if not probes:
            return "unsupported", f"max_batch_size {args.max_batch_size} allows no larger batch", {}, config
        first = probes[0]
        reason = f"no batch above {config['batch_size']} fits: batch {first['batch_size']}: {first['reason']}"
        return first["status"], reason, {"probes": probes}, {**config, "batch_size": first["batch_size"]}
    return "ok", None, {**best[1], "probes": probes}, {**config, "batch_size": best[0]["batch_size"]}


def run_grad_accum(parent_config: dict, args, device) -> tuple[str, str | None, dict, dict]:
    """The parent's micro-batch, accumulated; out of memory, half the micro-batch, down to ``batch_size``."""
    config = apply_change("grad_accum", parent_config, args)
    tried = []
    while True:
        status, reason, metrics = try_config(config, args, device)
        if status != "oom" or config["batch_size"] // 2 < args.batch_size:
            break
        tried.append({"batch_size": config["batch_size"], "status": status, "reason": reason})
        config = {**config, "batch_size": config["batch_size"] // 2}
    return status, reason, {**metrics, "micro_batch_fallbacks": tried}, config


def fastest(results: dict, among: list[str]) -> list[str]:
    ok = [n for n in among if results[n]["status"] == "ok"]
    return sorted(ok, key=lambda n: -results[n]["metrics"]["tokens_per_s"])


def cannot_run(rung: str, config: dict, device: torch.device) -> str | None:
    if device.type != "cuda" and rung in CUDA_ONLY:
        return f"{CUDA_ONLY[rung]}; this cell runs on the CPU"
    if rung == "fp8_max_batch" and not config["fp8"]:
        return "no FP8 rung ran to build on"
    return fp8_unsupported(device) if config["fp8"] else None


def run_rung(rung: str, parent_config: dict, args, device) -> tuple[str, str | None, dict, dict]:
    config = apply_change(rung, parent_config, args)
    if reason := cannot_run(rung, config, device):
        return "unsupported", reason, {}, config
    if rung in BATCH_SEARCH:  # checkpointing from the parent's batch (its cost there), the others above it
        return search_batch(config, args, device, config["batch_size"] * (1 if config["checkpoint"] else 2))
    if rung == "grad_accum":
        return run_grad_accum(parent_config, args, device)
    return (*try_config(config, args, device), config)


def kept(results: dict, rung: str, parent: str | None) -> bool:
    """Whether later rungs may build on ``rung``: it ran, and beat its parent (if that ran) by more
    than ``KEEP_MARGIN`` in tokens/s."""
    if results[rung]["status"] != "ok":
        return False
    before = results.get(parent)
    if before is None or before["status"] != "ok":
        return True
    return results[rung]["metrics"]["tokens_per_s"] > (1 + KEEP_MARGIN) * before["metrics"]["tokens_per_s"]


def run_ladder(args, device: torch.device, slug: str, write, resume=lambda rung: None) -> None:
    """Every rung in order; ``resume(rung)`` gives the record a killed run left of it (then not measured again)."""
    gemm = load_gemm_peak(args.gemm_peak)
    results: dict[str, dict] = {}
    configs: dict[str, dict] = {None: {**BASE, "batch_size": args.batch_size}}
    for index, rung in enumerate(args.rungs):
        if (record := resume(rung)) is not None:
            results[rung] = {k: record[k] for k in ("status", "reason", "metrics")}
            configs[rung] = record["metrics"]["config"]
            continue
        wall_start = time.monotonic()
        done = list(results)
        # FP8's batch search builds on the fastest FP8 rung, kept or not, whether or not FP8 is the fastest
        fp8 = rung == "fp8_max_batch"
        candidates = fastest(
            results, [n for n in done if (configs[n]["fp8"] if fp8 else results[n]["metrics"]["kept"])]
        )
        parent = None if rung == "baseline" else next(iter(candidates), done[-1] if done else None)
        status, reason, metrics, config = run_rung(rung, configs[parent], args, device)
        fallbacks = []
        # an inherited change that fails here (not this rung's own): build on the next-fastest rung
        while (
            status == "unsupported"
            and set(CHANGES[rung][0]).isdisjoint(FRAGILE)
            and fragile(configs[parent])
            and len(candidates) > 1 + len(fallbacks)
        ):
            fallbacks.append({"parent": parent, "reason": reason})
            parent = candidates[len(fallbacks)]
            status, reason, metrics, config = run_rung(rung, configs[parent], args, device)
        metrics |= derive(metrics, config, args, slug, gemm)
        metrics |= {"rung_index": index, "parent": parent, "change": CHANGES[rung][1], "config": config}
        metrics |= {"parent_fallbacks": fallbacks, "rung_wall_s": time.monotonic() - wall_start}
        results[rung] = {"status": status, "reason": reason, "metrics": metrics}
        metrics["kept"] = kept(results, rung, parent)
        configs[rung] = config
        write(rung, status, reason, metrics)


# what a later trial takes from the first: how the configuration was chosen, and the cold-cache times
CHOSEN = ("rung_index", "parent", "kept", "change", "config", "parent_fallbacks", "probes", "micro_batch_fallbacks")
COLD_ONLY = ("compile_s", "first_step_s")


def retime_ladder(args, device: torch.device, slug: str, write, first_trial: str, resume=lambda rung: None) -> None:
    """Each rung's configuration from the first trial's record (``first_trial``, a template over
    ``{rung}``), timed again as it is; ``resume`` as in ``run_ladder``."""
    gemm = load_gemm_peak(args.gemm_peak)
    for rung in args.rungs:
        if resume(rung) is not None:
            continue
        wall_start = time.monotonic()
        first = json.loads(Path(first_trial.format(rung=rung)).read_text())["metrics"]
        config = first["config"]
        if reason := cannot_run(rung, config, device):
            status, metrics = "unsupported", {}
        else:
            status, reason, metrics = try_config(config, args, device)
        metrics |= derive(metrics, config, args, slug, gemm) | {n: first.get(n) for n in CHOSEN}
        metrics |= dict.fromkeys(COLD_ONLY) | {"rung_wall_s": time.monotonic() - wall_start}
        write(rung, status, reason, metrics)


def partial_path(output: str) -> Path:
    """Where a rung's record is kept until its job ends: Snakemake deletes a failed job's outputs."""
    path = Path(output)
    return path.parent / ".partial" / path.name


def left_by_killed_run(output: str, provenance: dict) -> dict | None:
    """The record a killed run of this job left for ``output``, if the same code measured it on this
    device with the same settings."""
    try:
        record = load_record(partial_path(output))
    except RecordError:
        return None
    same = ("code_version", "settings", "device_slug")
    return record if all(record["provenance"].get(k) == provenance[k] for k in same) else None


def load_gemm_peak(path: str | None) -> dict | None:
    if not path or not Path(path).exists():
        return None
    record = json.loads(Path(path).read_text())
    return record["metrics"] if record["status"] == "ok" else None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--replay"]:  # internal: one rung again under nsys (lmperf.kinds.ladder.profile)
        replay = json.loads(argv[1])
        args = types.SimpleNamespace(**replay["settings"])
        device = devices.check_device(replay["device"])
        result = profile_config({**BASE, **replay["config"]}, args, device, replay["profile_steps"])
        Path(replay["output"]).write_text(json.dumps(result))
        return 0
    job = parse_job("ladder", argv, __doc__.splitlines()[0])
    args = job.args
    device = devices.check_device(args.device)
    provenance = job.provenance()
    first_trial = first_trial_of(args.output)
    again = " again" if first_trial else ""

    def write(rung, status, reason, metrics):
        cell = {"model": args.model, "context_length": args.context_length, "rung": rung}
        # the process clock at writing (provenance's is the start's): the grid's wall time reads it
        prov = {**provenance, **devices.process_clock(), "matmul_allow_tf32": bool(metrics["config"]["tf32"])}
        record = make_record("ladder", cell, status, metrics, prov, reason)
        write_record(partial_path(args.output.format(rung=rung)), record)
        write_record(args.output.format(rung=rung), record)
        took = f"{metrics['step_ms_median']:.1f} ms/step" if status == "ok" else reason
        print(f"[ladder] {args.model} ctx{args.context_length} {rung}{again}: {status}, {took}", file=sys.stderr)

    resuming = True

    def resume(rung):
        """A killed run's record of ``rung``, written out again; from the first rung without one, None."""
        nonlocal resuming
        record = left_by_killed_run(args.output.format(rung=rung), provenance) if resuming else None
        if record is None:
            resuming = False
            return None
        write_record(args.output.format(rung=rung), record)
        took = f"{record['status']}, from a killed run"
        print(f"[ladder] {args.model} ctx{args.context_length} {rung}{again}: {took}", file=sys.stderr)
        return record

    if first_trial:
        retime_ladder(args, device, args.device, write, first_trial, resume)
    else:
        run_ladder(args, device, args.device, write, resume)
    for rung in args.rungs:
        partial_path(args.output.format(rung=rung)).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
