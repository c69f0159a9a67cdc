"""Nsight Systems cell: the kernels of each phase of model sizes at one precision, per context length.

Answers nsys_profile (a)–(e). One process profiles one precision for every model size and context
length it is given and writes two records per (size, length): ``inference`` (forward under
``torch.no_grad``) and ``training`` (forward incl. loss, backward, AdamW step). Under nsys the cell
re-runs itself as ``nsys profile … -c cudaProfilerApi python -m lmperf.kinds.nsys.cell --worker …``. The
worker takes the sizes one after another, in the order given (the workflow gives the largest first,
so the size nearest the memory limit runs in a fresh process); for each it builds the model, warms
every configuration up (inference, then training, so the inference warm-up holds no AdamW state),
runs the measured steps (the training blocks, then, with the AdamW state freed and one untimed
re-warm step each, the inference blocks) inside an NVTX range ``lmperf model=<size>`` — each block
inside a range ``lmperf ctx=<n> <mode>``, each phase inside ``forward``/``backward``/
``optimizer_step`` or ``inference_forward``, attention inside the course's three ranges — and
frees all of it before the next size (the record keeps what was still allocated when each size
began: 0 in a fresh process). Each size's measured steps are a capture range of their own
(``cudaProfilerStart``/``Stop``, nsys's ``--capture-range-end=repeat``: a report per size), so builds
and warm-ups stay outside every capture. One process for all sizes pays the imports of torch and
torch._dynamo (about 7.5 s) and CUDA's start once instead of once per size (bench/grid_time_notes.md).
Out of memory ends that block alone and becomes its record (status oom). The parent exports each
report to SQLite, attributes kernels to phases by their launch time (lmperf.profiling.phases) and
writes the records. Under torch.profiler one capture holds every size, and each size's records read
the part inside its range (``lmperf.profiling.phases.model_slice``). It also times the same steps with
``timeit.default_timer`` (cross-check (a)) and, with no profiler attached, the forward with the
NVTX ranges switched off and on (their cost when not profiling).

Without nsys (CPU grid, or no nsys on PATH/config) the same steps run under ``torch.profiler``
and the records say ``profiler: "torch.profiler"``. A failing nsys exits non-zero with its
stderr in the log.

    python -m lmperf.kinds.nsys.cell --output 'results/cpu/nsys/{model}_ctx{ctx}_fp32_{mode}.json' \
        --device cpu --models mini tiny --context-lengths 32 64 --precision fp32
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import tempfile
import timeit
import types
from pathlib import Path

import torch

from lmperf import nvtx
from lmperf.core import device as devices
from lmperf.core import flops
from lmperf.core.cell import free_memory, parse_job
from lmperf.core.dtypes import autocast
from lmperf.core.oom import OutOfMemory, capture_oom
from lmperf.core.record import PartialOutOfMemory, run_cell
from lmperf.core.timing import PhaseTimer, flatten_summary, summarize, synchronize
from lmperf.core.units import MIB
from lmperf.model import TransformerLM, config_from_name, count_parameters
from lmperf.profiling import nsys as nsys_tool
from lmperf.profiling.phases import MODE_PHASES, MODES, cell_range_name, model_range_name, model_slice, summarize_cell

KIND = "nsys"
# Softmax as the course writes it, per score element: max, subtract, exp, sum, divide.
SOFTMAX_FLOPS_PER_ELEMENT = 5
# Forwards of each NVTX state before the on/off timing starts.
NVTX_OVERHEAD_WARMUP = 3


# what every record says of the profile it came from (None where it does not apply, or nothing was captured)
ARTIFACT_KEYS = ("report_path", "sqlite_path", "profiler_version", "profiler_path", "nsys_options")


def artifacts_of(**known) -> dict:
    """A record's artifact fields: ``known`` ones, every other key of ARTIFACT_KEYS None."""
    unknown = set(known) - set(ARTIFACT_KEYS)
    if unknown:
        raise ValueError(f"not artifact keys: {sorted(unknown)}")
    return {key: known.get(key) for key in ARTIFACT_KEYS}


def training_step(model, optimizer, tokens, targets, args, device, timer: PhaseTimer) -> None:
    vocab = args.vocab_size
    with nvtx.range("training_step"):
        with timer.phase("forward"), nvtx.range("forward"):
            with autocast(device, args.precision):
                logits = model(tokens)
                loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), targets.view(-1))
            synchronize(device)  # inside the range: it closes when the GPU is done
        with timer.phase("backward"), nvtx.range("backward"):
            loss.backward()
            synchronize(device)
        with timer.phase("optimizer_step"), nvtx.range("optimizer_step"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            synchronize(device)
    del logits, loss


@torch.no_grad()
def inference_step(model, tokens, args, device, timer: PhaseTimer) -> None:
    with timer.phase("inference_forward"), nvtx.range("inference_forward"):
        with autocast(device, args.precision):
            model(tokens)
        synchronize(device)


class CudaProfilerCapture:
    """cudaProfilerStart/Stop: the capture range of ``nsys profile -c cudaProfilerApi``."""

    def __init__(self, device):
        self.device = device

    def start(self):
        synchronize(self.device)
        torch.cuda.profiler.start()

    def stop(self):
        synchronize(self.device)
        torch.cuda.profiler.stop()


class Capture:
    """The capture around several models' measured steps. ``per_model`` (nsys with
    ``--capture-range-end=repeat``: a report each): a range per model, so each model's build and
    warm-up stay outside every capture. Otherwise (the torch.profiler fallback, which profiles once
    per process) one range from the first model's measured steps to the last one's: ``start`` starts
    it only once and only ``stop`` ends it."""

    def __init__(self, capture, per_model: bool):
        self.capture = capture
        self.per_model = per_model
        self.open = False

    def start(self):
        if not self.open:
            self.capture.start()
            self.open = True

    def end_model(self):
        if self.per_model:
            self.stop()

    def stop(self):
        if self.open:
            self.capture.stop()
            self.open = False


def run_models(args, device: torch.device, capture: Capture) -> dict:
    """Each size of ``--models`` in turn (`run_measurements`), ``capture`` started before a size's
    measured steps. Between sizes everything of the last one is freed, cuBLAS's workspaces included,
    so the next starts from what a fresh process has."""
    results = {}
    try:
        for model in args.models:
            results[model] = run_measurements(args, model, device, capture)
            capture.end_model()
            free_memory(device)
            if device.type == "cuda":
                torch._C._cuda_clearCublasWorkspaces()
    finally:
        capture.stop()
    return {"models": results}


def run_measurements(args, model_name: str, device: torch.device, capture) -> dict:
    """Warm every (context length, mode) of one size up, then capture the measured steps of each,
    all inside the range ``model_range_name(model_name)``. ``capture.start()`` is called before the
    measured steps; ending it is the caller's (`run_models`).

    Returns per block ``"<ctx>/<mode>"``: status (ok/oom), reason, timer samples, CUDA-event
    samples and peak memory. Only out-of-memory is caught; it ends that block alone.
    """
    ctxs = args.context_lengths
    torch.manual_seed(args.seed)
    # RoPE tables sized for the longest length serve the shorter ones (positions 0..T-1).
    config = config_from_name(
        model_name, context_length=max(ctxs), vocab_size=args.vocab_size, attention=args.attention
    )
    blocks = {(c, m): {"status": "ok", "reason": None} for c in ctxs for m in MODES}
    result = {
        "parameter_count": None,
        "blocks": blocks,
        # what an earlier size of the same process left allocated (0 in a fresh process)
        "allocated_mib_at_start": torch.cuda.memory_allocated(device) / MIB if device.type == "cuda" else None,
        "captured": False,
    }

    def note_oom(keys, stage, oom: OutOfMemory):
        for key in keys:
            if blocks[key]["status"] == "ok":
                blocks[key].update(status="oom", reason=f"{stage}: {oom.reason}")
        print(f"[nsys] out of memory in {stage}", file=sys.stderr, flush=True)

    built = []
    oom = capture_oom(lambda: built.append(_build_model(config, device)))
    if oom:
        note_oom(list(blocks), "building the model", oom)
        return _serialisable(result)
    model = built.pop()
    result["parameter_count"] = count_parameters(model)
    optimizer = torch.optim.AdamW(model.parameters())
    data = {
        c: (
            torch.randint(0, args.vocab_size, (args.batch_size, c), device=device),
            torch.randint(0, args.vocab_size, (args.batch_size, c), device=device),
        )
        for c in ctxs
    }
    quiet = PhaseTimer(device, record=False)
    cache_emptied = [False]  # an OOM emptied the allocator's cache after the warm-up

    def attempt(key, stage, fn) -> bool:
        oom = capture_oom(fn)
        if oom:  # capture_oom has returned: the traceback's frames are gone, so this frees their memory
            note_oom([key], stage, oom)
            model.zero_grad(set_to_none=True)
            free_memory(device)
            cache_emptied[0] = True
        return oom is None

    # 1. Warm-up, outside the capture: inference first, before AdamW state exists.
    def one_step(c, mode, timer):
        tokens, targets = data[c]
        if mode == "training":
            training_step(model, optimizer, tokens, targets, args, device, timer)
        else:
            inference_step(model, tokens, args, device, timer)

    def warm_up(c, mode):
        for _ in range(args.warmup_steps):
            one_step(c, mode, quiet)

    for mode in ("inference", "training"):
        for c in ctxs:
            attempt((c, mode), f"{mode} warm-up, ctx {c}", functools.partial(warm_up, c, mode))

    # 2. The measured steps, inside the capture. A block is re-warmed by one untimed step outside
    #    its range where memory was handed back since its warm-up (so no cudaMalloc lands in the
    #    measured steps): every inference block (AdamW state freed in between), and every block
    #    after an out-of-memory emptied the allocator's cache.
    def measured(c, mode):
        if mode == "inference" or cache_emptied[0]:
            with nvtx.range("lmperf re-warm"):
                one_step(c, mode, quiet)
        timer = PhaseTimer(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with nvtx.range(cell_range_name(c, mode)):
            for _ in range(args.measured_steps):
                one_step(c, mode, timer)
        blocks[(c, mode)].update(
            timer_ms_samples=timer.samples_ms,
            event_ms_samples=timer.event_samples_ms(),
            peak_allocated_mib=torch.cuda.max_memory_allocated(device) / MIB if device.type == "cuda" else None,
        )

    # the process's age when this size's measured steps begin: start-up (and earlier sizes), its
    # model build and warm-up; for the first size, the capture's start
    result["capture_start_process_age_s"] = devices.process_age_s()
    if not any(block["status"] == "ok" for block in blocks.values()):
        return _serialisable(result)  # every block ran out of memory warming up: nothing to capture
    capture.start()
    result["captured"] = True  # its measured steps are in the capture (under nsys, its own report)
    with nvtx.range(model_range_name(model_name)):
        for c in ctxs:
            if blocks[(c, "training")]["status"] == "ok":
                attempt(
                    (c, "training"), f"measured training steps, ctx {c}", functools.partial(measured, c, "training")
                )
        optimizer.state.clear()  # inference measured as it was warmed up: without AdamW state
        model.zero_grad(set_to_none=True)
        for c in ctxs:
            if blocks[(c, "inference")]["status"] == "ok":
                attempt(
                    (c, "inference"), f"measured inference steps, ctx {c}", functools.partial(measured, c, "inference")
                )
    return _serialisable(result)


def _build_model(config, device: torch.device) -> TransformerLM:
    with device:  # initialise on the device
        return TransformerLM(config)


def _serialisable(result: dict) -> dict:
    return {**result, "blocks": {f"{c}/{m}": v for (c, m), v in result["blocks"].items()}}


def worker_main(args) -> int:
    """Inside ``nsys profile``: measure with cudaProfilerStart/Stop and NVTX on, write JSON."""
    device = devices.check_device(args.device)
    nvtx.enable()
    if not nvtx.is_enabled():
        raise RuntimeError("NVTX ranges could not be enabled (no CUDA?): nothing for nsys to attribute")
    result = run_models(args, device, Capture(CudaProfilerCapture(device), per_model=True))
    Path(args.worker).write_text(json.dumps(result))
    return 0


# -- the parent: choose the profiler, run it, analyse, write records -----------------------------


def choose_profiler(args, device: torch.device) -> tuple[str, str | None, str | None]:
    """(profiler, nsys executable, note): nsys where possible, else torch.profiler with the reason."""
    if args.profiler == "torch":
        return "torch.profiler", None, "torch.profiler requested (profiler: torch)"
    nsys_exe = nsys_tool.find_nsys(args.nsys_path)
    if args.profiler == "nsys":
        if nsys_exe is None:
            raise nsys_tool.NsysError("profiler: nsys, but nsys is not on PATH; set nsys_path in the nsys grid")
        if device.type != "cuda":
            raise nsys_tool.NsysError("profiler: nsys needs a CUDA device; this cell runs on the CPU")
        return "nsys", nsys_exe, None
    if device.type != "cuda":
        return (
            "torch.profiler",
            None,
            (
                "no CUDA device, so no kernels for nsys to trace: torch.profiler "
                "records the CPU operators instead (self time)"
            ),
        )
    if nsys_exe is None:
        return "torch.profiler", None, "nsys not found (not on PATH, no nsys_path configured): torch.profiler fallback"
    return "nsys", nsys_exe, None


def artifact_base(args) -> Path:
    if args.artifact_base:
        return Path(args.artifact_base)
    name = args.models[0] if len(args.models) == 1 else "nsys"
    return Path(args.output).parent / f"{name}_{args.precision}"


def run_nsys(args, argv: list[str], nsys_exe: str) -> tuple[dict, dict, dict]:
    """The worker under ``nsys profile``, a capture range (and report) per size; then each report
    exported to SQLite and read. Returns the worker's result and, per size whose steps were captured,
    its trace and artifacts."""
    base = artifact_base(args)
    with tempfile.TemporaryDirectory(prefix="lmperf-nsys-") as tmp:
        worker_json = Path(tmp) / "worker.json"
        app = [sys.executable, "-m", "lmperf.kinds.nsys.cell", *argv, "--worker", str(worker_json)]
        started = timeit.default_timer()
        reports = nsys_tool.profile_ranges(nsys_exe, base, app, len(args.models))
        profiled = timeit.default_timer()
        if not worker_json.is_file():
            raise nsys_tool.NsysError("the profiled cell wrote no results; its output is in the log above")
        result = json.loads(worker_json.read_text())
    captured = [m for m in args.models if result["models"][m]["captured"]]
    if len(reports) != len(captured):
        raise nsys_tool.NsysError(
            f"{len(captured)} sizes were captured ({captured}) but nsys wrote {len(reports)} reports: {reports}"
        )
    common = dict(
        profiler_version=nsys_tool.version(nsys_exe),
        profiler_path=nsys_exe,
        nsys_options=" ".join(nsys_tool.profile_options(len(args.models))),
    )
    traces, artifacts, export_s, read_s = {}, {}, 0.0, 0.0
    for model, report in zip(captured, reports):
        t0 = timeit.default_timer()
        sqlite_path = nsys_tool.export_sqlite(nsys_exe, report, report.with_suffix(".sqlite"))
        t1 = timeit.default_timer()
        traces[model] = nsys_tool.read_sqlite(sqlite_path)
        export_s, read_s = export_s + t1 - t0, read_s + timeit.default_timer() - t1
        artifacts[model] = artifacts_of(report_path=str(report), sqlite_path=str(sqlite_path), **common)
    # seconds for the whole process (every size): nsys and the worker, the exports, the reads
    result["stage_s"] = {"profile": profiled - started, "export": export_s, "read": read_s}
    return result, traces, artifacts


def run_torch_profiler(args, device: torch.device) -> tuple[dict, dict, dict]:
    """The steps under torch.profiler, in this process, one capture for every size: returns the result
    and, per size, the (shared) trace and artifacts."""
    from lmperf.profiling.torch_fallback import TorchCapture, route_ranges

    capture = TorchCapture(device)
    started = timeit.default_timer()
    with route_ranges():
        result = run_models(args, device, Capture(capture, per_model=False))
    profiled = timeit.default_timer()
    trace = capture.trace()
    result["stage_s"] = {"profile": profiled - started, "read": timeit.default_timer() - profiled}
    artifacts = artifacts_of(profiler_version=torch.__version__)
    captured = [m for m in args.models if result["models"][m]["captured"]]
    return result, dict.fromkeys(captured, trace), dict.fromkeys(captured, artifacts)


def measure_nvtx_overhead(args, model_name: str, device: torch.device) -> dict | None:
    """Inference forward at the shortest length with lmperf.nvtx ranges off and on, no profiler
    attached: after NVTX_OVERHEAD_WARMUP forwards of each, pairs in ABBA order (off-on, on-off, …)
    so that drift cancels; default_timer with synchronize."""
    if device.type != "cuda" or args.nvtx_overhead_steps <= 0:
        return None
    ctx = args.context_lengths[0]
    timer = PhaseTimer(device, cuda_events=False)

    def alternate():
        torch.manual_seed(args.seed)
        config = config_from_name(model_name, context_length=ctx, vocab_size=args.vocab_size, attention=args.attention)
        model = _build_model(config, device)
        tokens = torch.randint(0, args.vocab_size, (args.batch_size, ctx), device=device)
        with torch.no_grad():
            for rep in range(NVTX_OVERHEAD_WARMUP + args.nvtx_overhead_steps):
                timer.record = rep >= NVTX_OVERHEAD_WARMUP
                for state in ("disabled", "enabled") if rep % 2 == 0 else ("enabled", "disabled"):
                    nvtx.enable(state == "enabled")
                    with timer.phase(state), autocast(device, args.precision):
                        model(tokens)

    try:
        oom = capture_oom(alternate)
    finally:
        nvtx.enable(False)
    free_memory(device)
    if oom:
        return {"status": "oom", "reason": oom.reason, "context_length": ctx}
    samples = timer.samples_ms
    off, on = statistics.median(samples["disabled"]), statistics.median(samples["enabled"])
    return {
        "status": "ok",
        "context_length": ctx,
        "steps": args.nvtx_overhead_steps,
        "what": "inference forward, lmperf.nvtx ranges disabled vs enabled, no profiler attached",
        "nvtx_disabled_forward_ms_samples": samples["disabled"],
        "nvtx_enabled_forward_ms_samples": samples["enabled"],
        "nvtx_disabled_forward_ms_median": off,
        "nvtx_enabled_forward_ms_median": on,
        "enabled_over_disabled": on / off,
    }


def attention_flops(config, batch: int, ctx: int) -> dict:
    """Per forward, all layers: each attention matmul (full scores: the plain implementation
    computes every score, causal or not) and the softmax's elementwise FLOPs."""
    one_matmul = flops.attention_forward_flops(batch, config.num_heads, ctx, ctx, config.d_head) / 2
    softmax = SOFTMAX_FLOPS_PER_ELEMENT * batch * config.num_heads * ctx * ctx
    return {
        "computing attention scores": config.num_layers * one_matmul,
        "computing softmax": config.num_layers * softmax,
        "final matmul": config.num_layers * one_matmul,
    }


def block_metrics(args, model_name: str, ctx: int, mode: str, block: dict, trace, common: dict) -> dict:
    """One record's metrics: the block's timings and, from ``trace`` (this size's part of the
    profile), its kernels per phase and the attention ranges."""
    metrics = dict(common)
    if block["status"] != "ok":
        return metrics
    samples = block["timer_ms_samples"]
    phases = MODE_PHASES[mode]
    for phase in phases:
        metrics.update(flatten_summary(phase, summarize(samples[phase])))
    if mode == "training":
        metrics.update(
            flatten_summary("training_step", summarize([sum(s) for s in zip(*(samples[p] for p in phases))]))
        )
    for phase, event_ms in block["event_ms_samples"].items():
        metrics[f"{phase}_event_ms_samples"] = event_ms
    metrics["peak_allocated_mib"] = block["peak_allocated_mib"]
    summary = summarize_cell(trace, ctx, mode, top_n=args.top_kernels)
    metrics["phases"] = summary["phases"]
    config = config_from_name(model_name, context_length=ctx, vocab_size=args.vocab_size, attention=args.attention)
    flop = attention_flops(config, args.batch_size, ctx)
    for name, entry in summary["attention"]["ranges"].items():
        entry["flops_per_step"] = flop[name]
    metrics["attention"] = summary["attention"]
    for key in ("unattributed_kernels", "unattributed_kernel_ms", "kernels_in_block", "kernels_without_launch_time"):
        metrics[key] = summary[key]
    fwd = "inference_forward" if mode == "inference" else "forward"
    timer_ms = metrics[f"{fwd}_ms_mean"]
    range_ms = summary["phases"][fwd]["range_ms_mean"]
    metrics["forward_cross_check"] = {
        "phase": fwd,
        "timer_ms_mean": timer_ms,
        "nvtx_range_ms_mean": range_ms,
        "kernel_ms_per_step": summary["phases"][fwd]["kernel_ms_per_step"],
        "gpu_span_ms_mean": summary["phases"][fwd]["gpu_span_ms_mean"],
        "nvtx_range_over_timer": range_ms / timer_ms if timer_ms else None,
    }
    return metrics


def write_model_records(args, model_name, result, trace, profiler, note, artifacts, device) -> None:
    """The records of one size: a record per (context length, mode), from its part of the trace."""
    measured = result["models"][model_name]
    started = timeit.default_timer()
    overhead = measure_nvtx_overhead(args, model_name, device)
    if trace is None:  # nothing of this size was captured (out of memory before its measured steps)
        artifacts = artifacts_of()
    common = {
        "profiler": profiler,
        "profiler_note": note,
        **artifacts,
        "trace_notes": trace.notes if trace is not None else None,
        "parameter_count": measured["parameter_count"],
        "warmup_steps": args.warmup_steps,
        "measured_steps": args.measured_steps,
        "nvtx_overhead": overhead,
        # the sizes this process profiled, in order (under nsys a capture range and a report each)
        "profiled_models": list(args.models),
        "allocated_mib_at_start": measured["allocated_mib_at_start"],
        # where the process's time went (seconds): `profile` runs the steps of every size under the
        # profiler (for nsys its own start and the profiled process's, whose start-up, earlier sizes,
        # this size's model build and warm-up end at `capture_start_process_age_s`), `export` writes
        # the SQLites and `read` loads the traces (all sizes); `nvtx_overhead` is this size's
        "stage_s": {**result["stage_s"], "nvtx_overhead": timeit.default_timer() - started},
        "capture_start_process_age_s": measured.get("capture_start_process_age_s"),
    }
    provenance = args.job.provenance()  # after this size's NVTX timing: its age
    model_trace = None
    for ctx in args.context_lengths:
        for mode in MODES:
            block = measured["blocks"][f"{ctx}/{mode}"]
            cell = {"model": model_name, "context_length": ctx, "precision": args.precision, "mode": mode}
            if block["status"] == "ok" and model_trace is None:
                model_trace = model_slice(trace, model_name)

            def measure(block=block, ctx=ctx, mode=mode, part=model_trace):
                metrics = block_metrics(args, model_name, ctx, mode, block, part, common)
                if block["status"] == "oom":
                    raise PartialOutOfMemory(block["reason"], metrics)
                return metrics

            path = args.output.format(model=model_name, ctx=ctx, mode=mode)
            run_cell(KIND, cell, path, lambda: provenance, measure)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    worker = None
    if "--worker" in argv:  # internal: this cell inside nsys (run_nsys)
        at = argv.index("--worker")
        worker, argv = argv[at + 1], argv[:at] + argv[at + 2 :]
    job = parse_job("nsys", argv, __doc__.splitlines()[0])
    args = types.SimpleNamespace(**job.settings, device=job.device, output=job.output, worker=worker, job=job)
    args.artifact_base = None
    if args.worker:
        return worker_main(args)
    device = devices.check_device(args.device)
    profiler, nsys_exe, note = choose_profiler(args, device)
    print(f"[nsys] profiler: {profiler}" + (f" ({note})" if note else ""), file=sys.stderr, flush=True)
    if profiler == "nsys":
        result, traces, artifacts = run_nsys(args, argv, nsys_exe)
    else:
        result, traces, artifacts = run_torch_profiler(args, device)
    for model_name in args.models:
        write_model_records(
            args, model_name, result, traces.get(model_name), profiler, note, artifacts.get(model_name), device
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
