"""Memory cell: PyTorch's CUDA memory history of one inference forward and one training step.

Answers memory_profiling (a)-(e). One process per (model, context length, precision) writes
two records, ``inference`` then ``training``; ``--output`` is a pattern with ``{mode}``.

Per mode: warm-up (``--warmup-steps``), then the allocator's history is recorded for exactly
one step (``torch.cuda.memory._record_memory_history(enabled="all", context="alloc",
stacks="python", max_entries=…)``): Python stacks only, and tracebacks on allocations only,
keep the snapshot small and quick to dump. Before that, from the model's construction on,
history runs in ``"state"`` mode, so blocks allocated earlier (parameters, AdamW's moments)
still carry the stack that allocated them. Phase boundaries (forward, backward, optimizer
step, zero_grad) are marker allocations in the trace (see ``lmperf.kinds.memory.snapshot``); the storages of
parameters, gradients and optimizer state are noted at the marks so the analysis can name them.

The snapshot is pickled beside the record (``<record>.pickle``, git-ignored; PyTorch's memory
viewer opens it) and analysed at once (``lmperf.kinds.memory.snapshot.analyse``): the record holds the peaks,
the downsampled timeline, the phases, the largest allocations at the peak with their frames,
the analytic account and the residual-stream allocation match, so the report never needs the
pickle. Out of memory keeps the history up to the failure (status ``oom`` with metrics).

On a machine without CUDA the same steps run on the given (tiny) model so the path is
exercised, and each record says ``unsupported``: there is no CUDA memory history on a CPU.

    python -m lmperf.kinds.memory.cell --output 'results/h100/memory/2.7B_ctx128_fp32_{mode}.json' \
        --device h100 --model 2.7B --context-length 128 --precision fp32
"""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import sys
import tempfile
from pathlib import Path

import torch

from lmperf.core import device as devices
from lmperf.core.cell import free_memory, parse_job
from lmperf.core.dtypes import autocast
from lmperf.core.oom import capture_oom
from lmperf.core.record import PartialOutOfMemory, Unsupported
from lmperf.core.units import MIB
from lmperf.kinds.memory import snapshot as memory
from lmperf.model import TransformerLM, config_from_name

MODES = ("inference", "training")
PHASES = {"inference": ["forward", "end"], "training": ["forward", "backward", "optimizer_step", "zero_grad", "end"]}


def _memory_phase_marker(index: int, device: torch.device) -> None:
    """A marker allocation of 512·(index+1) bytes, freed at once (see lmperf.kinds.memory.snapshot)."""
    torch.empty(memory.MARKER_UNIT_BYTES * (index + 1), dtype=torch.uint8, device=device)


def _storage_addr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class History:
    """Switches the CUDA allocator's history on for one recorded step, with phase marks."""

    def __init__(self, device: torch.device, max_entries: int):
        self.device, self.max_entries = device, max_entries
        self.phases: list[str] = []
        self.labels: list[dict] = []
        self.label_fns: dict = {}
        self.recording = False

    @staticmethod
    def keep_state() -> None:
        """Stacks for live blocks only (no event history): cheap, and it names old blocks."""
        torch.cuda.memory._record_memory_history(enabled="state", context="state", stacks="python")

    def start(self, phases: list[str], label_fns: dict) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.memory._record_memory_history(enabled=None)  # clears the ring buffer
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=self.max_entries
        )
        torch.cuda.reset_peak_memory_stats(self.device)
        self.phases, self.labels, self.label_fns, self.recording = list(phases), [], label_fns, True
        self._next = 0

    def mark(self, phase: str) -> None:
        if not self.recording:
            return
        if self.phases[self._next] != phase:
            raise RuntimeError(f"phase {phase!r} marked where {self.phases[self._next]!r} was expected")
        for category, name, tensor in self.label_fns.get(phase, lambda: [])():
            if tensor is not None and tensor.is_cuda:
                self.labels.append({"mark": phase, "addr": _storage_addr(tensor), "category": category, "name": name})
        _memory_phase_marker(self._next, self.device)
        self._next += 1

    def stop(self) -> tuple[dict, dict]:
        torch.cuda.synchronize(self.device)
        stats = {
            "peak_allocated_mib": torch.cuda.max_memory_allocated(self.device) / MIB,
            "peak_reserved_mib": torch.cuda.max_memory_reserved(self.device) / MIB,
        }
        snapshot = torch.cuda.memory._snapshot()
        self.recording = False
        self.keep_state()
        return snapshot, stats


class NoHistory(History):
    """The CPU stand-in: marks are no-ops."""

    def __init__(self):
        super().__init__(torch.device("cpu"), 0)

    @staticmethod
    def keep_state() -> None:
        pass

    def start(self, phases, label_fns) -> None:
        pass

    def mark(self, phase: str) -> None:
        pass


def _parameter_labels(model) -> list:
    return [("parameters", name, p) for name, p in model.named_parameters()]


def _optimizer_labels(model, optimizer) -> list:
    names = {id(p): name for name, p in model.named_parameters()}
    out = []
    for p, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                out.append(("optimizer_state", f"{key} of {names.get(id(p), '?')}", value))
    return out


def _gradient_labels(model) -> list:
    return [("gradients", f"grad of {name}", p.grad) for name, p in model.named_parameters() if p.grad is not None]


class SavedBytes:
    """Bytes of distinct storages autograd saves for backward (parameters and inputs excluded)."""

    def __init__(self, exclude: set[int]):
        self.exclude, self.seen = exclude, {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.exclude:
            self.seen[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.seen.values())


def inference_step(model, tokens, args, device, history: History) -> None:
    with torch.no_grad():
        history.mark("forward")
        with autocast(device, args.precision):
            logits = model(tokens)
        history.mark("end")
        del logits


def training_step(
    model, optimizer, tokens, targets, args, device, history: History, saved: SavedBytes | None = None
) -> None:
    history.mark("forward")
    hooks = (
        torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t)
        if saved is not None
        else contextlib.nullcontext()
    )
    with hooks, autocast(device, args.precision):
        loss = torch.nn.functional.cross_entropy(model(tokens).view(-1, args.vocab_size), targets.view(-1))
    history.mark("backward")
    loss.backward()
    history.mark("optimizer_step")
    optimizer.step()
    history.mark("zero_grad")
    optimizer.zero_grad(set_to_none=True)
    history.mark("end")
    del loss


class Session:
    """One model shared by the modes of this process (inference first, then training)."""

    def __init__(self, args, device: torch.device, history: History | None = None):
        self.args, self.device = args, device
        if history is None:
            history = History(device, args.max_entries) if device.type == "cuda" else NoHistory()
        self.history = history
        self.model = None
        self.config = config_from_name(args.model, context_length=args.context_length, vocab_size=args.vocab_size)

    def build(self):
        if self.model is None:
            torch.manual_seed(self.args.seed)
            self.history.keep_state()
            with self.device:  # initialise on the device: CPU init of billions of parameters takes minutes
                self.model = TransformerLM(self.config)
            shape = (self.args.batch_size, self.args.context_length)
            self.tokens = torch.randint(0, self.args.vocab_size, shape, device=self.device)
            self.targets = torch.randint(0, self.args.vocab_size, shape, device=self.device)
        return self.model

    def _match_sizes(self) -> dict:
        args = self.args
        return {"residual_stream": memory.residual_stream_bytes(self.config, args.batch_size, args.context_length)}

    def _analyse(self, mode: str, snapshot: dict, stats: dict, output: str) -> dict:
        args = self.args
        snapshot_path = _dump(snapshot, Path(output).with_suffix(".pickle"))
        metrics = dict(stats)
        metrics.update(
            memory.analyse(
                snapshot,
                PHASES[mode],
                self.history.labels,
                top_k=args.top_allocations,
                max_points=args.timeline_points,
                match_sizes=self._match_sizes(),
            )
        )
        metrics["snapshot_path"] = str(snapshot_path)
        metrics["snapshot_bytes"] = snapshot_path.stat().st_size
        metrics["analytic"] = memory.analytic_account(
            self.config, args.batch_size, args.context_length, args.precision, mode
        )
        metrics["residual_stream"] = _residual_stream(self.config, args)
        return metrics

    def measure(self, mode: str, output: str) -> dict:
        model = self.build()
        if isinstance(self.history, NoHistory):
            self._run_on_cpu(mode)
            raise Unsupported(
                "CUDA memory history (torch.cuda.memory._record_memory_history) needs a CUDA "
                f"device; ran the {mode} step of {self.args.model} on the CPU without it"
            )
        if mode == "inference":
            return self._inference(model, output)
        return self._training(model, output)

    def _run_on_cpu(self, mode: str) -> None:
        args, model = self.args, self.model
        if mode == "inference":
            inference_step(model, self.tokens, args, self.device, self.history)
        else:
            optimizer = torch.optim.AdamW(model.parameters())
            training_step(model, optimizer, self.tokens, self.targets, args, self.device, self.history)

    def _inference(self, model, output: str) -> dict:
        args, history = self.args, self.history
        for _ in range(args.warmup_steps):
            inference_step(model, self.tokens, args, self.device, history)
        history.start(PHASES["inference"], {"forward": lambda: _parameter_labels(model)})
        oom = capture_oom(lambda: inference_step(model, self.tokens, args, self.device, history))
        snapshot, stats = history.stop()
        metrics = self._analyse("inference", snapshot, stats, output)
        del snapshot
        if oom:
            raise PartialOutOfMemory(f"inference forward: {oom.reason}", metrics)
        return metrics

    def _training(self, model, output: str) -> dict:
        args, history, device = self.args, self.history, self.device
        optimizer = torch.optim.AdamW(model.parameters())

        def warm_up():
            for _ in range(args.warmup_steps):
                training_step(model, optimizer, self.tokens, self.targets, args, device, history)

        warmup_oom = capture_oom(warm_up)
        if warmup_oom:
            # Record the failing step anyway: the history shows what filled the memory.
            optimizer.zero_grad(set_to_none=True)
            free_memory(device)
        label_fns = {
            "forward": lambda: _parameter_labels(model) + _optimizer_labels(model, optimizer),
            "optimizer_step": lambda: _gradient_labels(model),
        }
        exclude = {_storage_addr(p) for p in model.parameters()} | {
            _storage_addr(self.tokens),
            _storage_addr(self.targets),
        }
        saved = SavedBytes(exclude)
        history.start(PHASES["training"], label_fns)
        oom = capture_oom(
            lambda: training_step(model, optimizer, self.tokens, self.targets, args, device, history, saved)
        )
        optimizer.zero_grad(set_to_none=True)
        snapshot, stats = history.stop()
        metrics = self._analyse("training", snapshot, stats, output)
        del snapshot
        metrics["saved_for_backward_mib"] = saved.total / MIB
        metrics["warmup_completed"] = warmup_oom is None
        if oom or warmup_oom:
            parts = [f"warm-up: {warmup_oom.reason}"] if warmup_oom else []
            parts += [f"recorded step: {oom.reason}"] if oom else []
            raise PartialOutOfMemory("training step: " + "; ".join(parts), metrics)
        return metrics


def _residual_stream(config, args) -> dict:
    """(d): one fp32 residual-stream activation, at this cell's context and at the reference one."""
    out = {"batch_size": args.batch_size, "d_model": config.d_model, "bytes_per_element": 4}
    for key, ctx in (("cell", args.context_length), ("reference", args.reference_context_length)):
        nbytes = memory.residual_stream_bytes(config, args.batch_size, ctx)
        out[key] = {"context_length": ctx, "bytes": nbytes, "mib": nbytes / MIB}
    return out


def _dump(snapshot: dict, path: Path) -> Path:
    """Pickle the snapshot exactly as torch.cuda.memory._dump_snapshot does, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(snapshot, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def main(argv=None) -> int:
    job = parse_job("memory", argv, __doc__.splitlines()[0])
    args = job.args
    device = devices.check_device(args.device)
    session = Session(args, device)
    for mode in args.modes:
        output = args.output.format(mode=mode)
        cell = {
            "model": args.model,
            "context_length": args.context_length,
            "precision": args.precision,
            "mode": mode,
            "batch_size": args.batch_size,
        }
        job.write("memory", cell, functools.partial(session.measure, mode, output), output)
        free_memory(device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
