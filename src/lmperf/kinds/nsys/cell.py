"""Nsight Systems cell: the kernels of each phase of model sizes at one precision, per context length,
``inference`` and ``training`` records each. Under nsys the cell re-runs itself as a worker inside ``nsys
profile`` with a capture range and report per size (docs/decisions/nsys-one-process.md); the parent
gives kernels to phases by launch time and writes the records. Without nsys the same steps run under
torch.profiler. Out of memory ends that block alone, as its record.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from functools import partial
from pathlib import Path

import torch

from lmperf import nvtx
from lmperf.core import device as devices
from lmperf.core.cell import free_memory, parse_job
from lmperf.core.dtypes import autocast
from lmperf.core.oom import capture_oom
from lmperf.core.record import PartialOutOfMemory
from lmperf.core.timing import PhaseTimer, flatten_summary, summarize, synchronize
from lmperf.model import TransformerLM, config_from_name
from lmperf.profiling import nsys as nsys_tool
from lmperf.profiling import phases

KIND = "nsys"


@contextlib.contextmanager
def phase(timer: PhaseTimer, name: str, device: torch.device):
    """One timed phase inside its NVTX range, which closes when the GPU is done."""
    with timer.phase(name), nvtx.range(name):
        yield
        synchronize(device)


def step(model, optimizer, batch, mode: str, args, device, timer: PhaseTimer) -> None:
    tokens, targets = batch
    if mode == "inference":
        with torch.no_grad(), phase(timer, "inference_forward", device), autocast(device, args.precision):
            model(tokens)
        return
    with nvtx.range("training_step"):
        with phase(timer, "forward", device), autocast(device, args.precision):
            loss = torch.nn.functional.cross_entropy(model(tokens).view(-1, args.vocab_size), targets.view(-1))
        with phase(timer, "backward", device):
            loss.backward()
        with phase(timer, "optimizer_step", device):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def run_models(args, device: torch.device, per_size_capture: bool) -> dict:
    """Each size in turn (`measure_model`), all of one freed, cuBLAS's workspaces too, before the next."""
    results = {}
    for name in args.models:
        results[name] = measure_model(args, name, device, per_size_capture)
        free_memory(device)
        if device.type == "cuda":
            torch._C._cuda_clearCublasWorkspaces()
    return results


def measure_model(args, name: str, device: torch.device, capture: bool) -> dict:
    """Warm every (length, mode) of one size up, then measure the training blocks and (AdamW's state freed)
    the inference ones inside ``capture``; per block ``"<ctx>/<mode>"`` its status, reason and samples."""
    ctxs = args.context_lengths
    blocks = {f"{c}/{m}": {"status": "ok", "reason": None} for c in ctxs for m in phases.MODES}
    out = {"captured": False, "blocks": blocks}
    emptied = False  # an out-of-memory emptied the allocator's cache since the warm-up

    def attempt(keys, stage, fn) -> None:
        nonlocal emptied
        oom = capture_oom(fn)  # returned: the failed frames are gone, so their memory can be freed
        if oom:
            for key in keys:
                if blocks[key]["status"] == "ok":
                    blocks[key].update(status="oom", reason=f"{stage}: {oom.reason}")
            print(f"[nsys] {name}: out of memory in {stage}", file=sys.stderr, flush=True)
            free_memory(device)
            emptied = True

    torch.manual_seed(args.seed)
    # RoPE tables sized for the longest length serve the shorter ones
    config = config_from_name(name, context_length=max(ctxs), vocab_size=args.vocab_size, attention=args.attention)
    built = []
    attempt(list(blocks), "building the model", lambda: built.append(build(config, device)))
    if not built:
        return out
    model = built.pop()
    optimizer = torch.optim.AdamW(model.parameters())
    data = {c: torch.randint(0, args.vocab_size, (2, args.batch_size, c), device=device).unbind() for c in ctxs}
    quiet = PhaseTimer(device, record=False)

    def steps(c: int, mode: str, n: int, timer: PhaseTimer) -> None:
        try:
            for _ in range(n):
                step(model, optimizer, data[c], mode, args, device, timer)
        finally:  # gradients of a step that ran out of memory go too
            model.zero_grad(set_to_none=True)

    def measured(c: int, mode: str) -> None:
        # one untimed step outside the block's range where memory went back since the warm-up (AdamW's
        # state before every inference block, the cache after an out-of-memory): no cudaMalloc is timed
        if mode == "inference" or emptied:
            with nvtx.range("lmperf re-warm"):
                steps(c, mode, 1, quiet)
        timer = PhaseTimer(device)
        with nvtx.range(phases.cell_range_name(c, mode)):
            steps(c, mode, args.measured_steps, timer)
        blocks[f"{c}/{mode}"]["timer_ms_samples"] = timer.samples_ms

    for mode in ("inference", "training"):
        for c in ctxs:
            attempt([f"{c}/{mode}"], f"{mode} warm-up, ctx {c}", partial(steps, c, mode, args.warmup_steps, quiet))
    if all(b["status"] != "ok" for b in blocks.values()):
        return out  # nothing left to capture (under nsys: no empty report)
    if capture:
        synchronize(device)
        torch.cuda.profiler.start()
    out["captured"] = True
    with nvtx.range(phases.model_range_name(name)):
        for mode in ("training", "inference"):
            if mode == "inference":
                optimizer.state.clear()  # inference measured as it was warmed up: with no AdamW state
            for c in ctxs:
                if blocks[f"{c}/{mode}"]["status"] == "ok":
                    attempt([f"{c}/{mode}"], f"measured {mode} steps, ctx {c}", partial(measured, c, mode))
    if capture:
        synchronize(device)
        torch.cuda.profiler.stop()
    return out


def build(config, device: torch.device) -> TransformerLM:
    with device:  # initialise on the device
        return TransformerLM(config)


def choose_profiler(args, device: torch.device) -> tuple[str | None, str | None]:
    """(the nsys executable, or None for torch.profiler; why torch.profiler, where it is)."""
    exe = nsys_tool.find_nsys(args.nsys_path) if args.profiler != "torch" else None
    if exe and device.type == "cuda":
        return exe, None
    why = "profiler: torch" if args.profiler == "torch" else "no CUDA" if device.type != "cuda" else "no nsys found"
    if args.profiler == "nsys":
        raise nsys_tool.NsysError(f"profiler: nsys, but {why}")
    return None, why


def run_nsys(args, argv: list[str], exe: str) -> tuple[dict, dict, dict]:
    """The worker under nsys; its results and, per captured size, its trace and where its report is."""
    base = Path(args.output).parent / f"nsys_{args.precision}"
    with tempfile.TemporaryDirectory(prefix="lmperf-nsys-") as tmp:
        worker = Path(tmp) / "worker.json"
        app = [sys.executable, "-m", "lmperf.kinds.nsys.cell", *argv, "--worker", str(worker)]
        reports = nsys_tool.profile_ranges(exe, base, app, len(args.models))
        if not worker.is_file():
            raise nsys_tool.NsysError("the profiled cell wrote no results; its output is in the log above")
        results = json.loads(worker.read_text())
    captured = [m for m in args.models if results[m]["captured"]]
    if len(reports) != len(captured):
        raise nsys_tool.NsysError(f"{len(captured)} sizes were captured ({captured}), but nsys wrote {reports}")
    common = {"profiler_version": nsys_tool.version(exe)}
    common["nsys_options"] = " ".join(nsys_tool.profile_options(len(args.models)))
    traces, artifacts = {}, {}
    for model, report in zip(captured, reports):
        sqlite = nsys_tool.export_sqlite(exe, report, report.with_suffix(".sqlite"))
        traces[model] = nsys_tool.read_sqlite(sqlite)
        artifacts[model] = {"report_path": str(report), "sqlite_path": str(sqlite), **common}
    return results, traces, artifacts


def run_torch_profiler(args, device: torch.device) -> tuple[dict, dict, dict]:
    """The steps under torch.profiler in this process, one capture for every size (each reads its slice)."""
    from lmperf.profiling.torch_fallback import events_to_trace, profiler, route_ranges

    with route_ranges(), profiler(device) as capture:
        results = run_models(args, device, per_size_capture=False)
    trace = events_to_trace(capture.profiler.kineto_results.events())
    captured = [m for m in args.models if results[m]["captured"]]
    return results, dict.fromkeys(captured, trace), dict.fromkeys(captured, {"profiler_version": torch.__version__})


def block_metrics(args, model_name: str, ctx: int, mode: str, block: dict, trace, common: dict) -> dict:
    """One block's record: ``common``, its timings, and from its size's part of the profile its kernels per
    phase (with each range's mean: the forward as the profiler saw it) and per attention range."""
    if block["status"] == "oom":
        raise PartialOutOfMemory(block["reason"], common)
    samples, names = block["timer_ms_samples"], phases.MODE_PHASES[mode]
    metrics = dict(common)
    for name in names:
        metrics |= flatten_summary(name, summarize(samples[name]))
    if mode == "training":
        metrics |= flatten_summary("training_step", summarize([sum(s) for s in zip(*(samples[p] for p in names))]))
    metrics |= phases.summarize_cell(trace, ctx, mode, top_n=args.top_kernels)
    config = config_from_name(model_name, context_length=ctx, vocab_size=args.vocab_size, attention=args.attention)
    for name, count in phases.attention_flops(config, args.batch_size, ctx).items():
        metrics["attention"]["ranges"][name]["flops_per_step"] = count
    return metrics


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    worker = argv[argv.index("--worker") + 1] if "--worker" in argv else None  # internal: inside nsys
    argv = argv[: argv.index("--worker")] if worker else argv
    job = parse_job(KIND, argv, __doc__.splitlines()[0])
    args = job.args
    device = devices.check_device(args.device)
    if worker:
        nvtx.enable()
        if not nvtx.is_enabled():
            raise RuntimeError("NVTX ranges could not be enabled (no CUDA?): nothing for nsys to attribute")
        Path(worker).write_text(json.dumps(run_models(args, device, per_size_capture=True)))
        return 0
    exe, note = choose_profiler(args, device)
    profiler = "nsys" if exe else "torch.profiler"
    print(f"[nsys] profiler: {profiler} ({note or exe})", file=sys.stderr, flush=True)
    results, traces, artifacts = run_nsys(args, argv, exe) if exe else run_torch_profiler(args, device)
    for model_name in args.models:
        measured = results[model_name]
        common = {"profiler": profiler, "profiler_note": note, **artifacts.get(model_name, {})}
        common |= {"warmup_steps": args.warmup_steps, "measured_steps": args.measured_steps}
        trace = phases.model_slice(traces[model_name], model_name) if measured["captured"] else None
        for ctx in args.context_lengths:
            for mode in phases.MODES:
                block = measured["blocks"][f"{ctx}/{mode}"]
                measure = partial(block_metrics, args, model_name, ctx, mode, block, trace, common)
                cell = {"model": model_name, "context_length": ctx, "precision": args.precision, "mode": mode}
                job.write(KIND, cell, measure, output=job.output.format(model=model_name, ctx=ctx, mode=mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
