"""Memory cell: the CUDA allocator's history of one no-grad forward and one training step (memory_profiling
(a)-(e)), one record per mode. After warm-up one step is recorded (history in "state" mode from the
model's construction, so parameters keep their stacks), phases marked by marker allocations
(``snapshot``); the snapshot is pickled beside the record and analysed at once. Out of memory keeps
the history up to the failure; without CUDA each record says ``unsupported``.
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import sys
from pathlib import Path

import torch

from lmperf.core import device as devices
from lmperf.core.cell import free_memory, parse_job
from lmperf.core.dtypes import autocast
from lmperf.core.oom import capture_oom
from lmperf.core.record import PartialOutOfMemory, Unsupported
from lmperf.core.units import MIB
from lmperf.kinds.memory import snapshot
from lmperf.model import TransformerLM, config_from_name

PHASES = {"inference": ["forward", "end"], "training": ["forward", "backward", "optimizer_step", "zero_grad", "end"]}


def _memory_phase_marker(index: int, device: torch.device) -> None:
    """A marker allocation of 512·(index+1) bytes, freed at once (see lmperf.kinds.memory.snapshot)."""
    torch.empty(snapshot.MARKER_UNIT_BYTES * (index + 1), dtype=torch.uint8, device=device)


def _addr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class History:
    """The allocator's history of one recorded step (CUDA only)."""

    def __init__(self, device: torch.device, max_entries: int):
        self.device, self.max_entries = device, max_entries

    def keep_state(self) -> None:
        """Stacks of live blocks only (no event history): cheap, and it names blocks allocated earlier."""
        torch.cuda.memory._record_memory_history(enabled="state", context="state", stacks="python")

    def start(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.memory._record_memory_history(enabled=None)  # clears the ring buffer
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=self.max_entries
        )
        torch.cuda.reset_peak_memory_stats(self.device)

    def stop(self) -> tuple[dict, dict]:
        """The snapshot and the allocator's own peaks; history goes back to ``"state"`` mode."""
        torch.cuda.synchronize(self.device)
        peaks = {
            "peak_allocated_mib": torch.cuda.max_memory_allocated(self.device) / MIB,
            "peak_reserved_mib": torch.cuda.max_memory_reserved(self.device) / MIB,
        }
        taken = torch.cuda.memory._snapshot()
        self.keep_state()
        return taken, peaks

    def mark(self, index: int) -> None:  # a method, so that tests can stand in for the allocator
        _memory_phase_marker(index, self.device)


class SavedBytes:
    """Bytes of distinct storages autograd saves for backward (``exclude``: parameters and inputs)."""

    def __init__(self, exclude: set[int]):
        self.exclude, self.seen = exclude, {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if _addr(t) not in self.exclude:
            self.seen[_addr(t)] = t.untyped_storage().nbytes()
        return t


class Session:
    """The model shared by the modes of this process (inference first, then training)."""

    def __init__(self, args, device: torch.device, history: History | None = None):
        self.args, self.device = args, device
        self.history = history or (History(device, args.max_entries) if device.type == "cuda" else None)
        self.config = config_from_name(args.model, context_length=args.context_length, vocab_size=args.vocab_size)
        self.model = self.optimizer = None

    def build(self) -> None:
        """The model and its inputs, built in the first mode's measurement (so out of memory is its record)."""
        args = self.args
        torch.manual_seed(args.seed)
        if self.history:
            self.history.keep_state()
        with self.device:  # initialise on the device: CPU init of billions of parameters takes minutes
            self.model = TransformerLM(self.config)
        shape = (args.batch_size, args.context_length)
        self.tokens = torch.randint(0, args.vocab_size, shape, device=self.device)
        self.targets = torch.randint(0, args.vocab_size, shape, device=self.device)

    def step(self, mode: str, mark, saved: SavedBytes | None = None) -> None:
        """One forward without gradients, or one training step, marking its phases."""
        with torch.no_grad() if mode == "inference" else contextlib.nullcontext():
            mark("forward")
            hooks = torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t) if saved else None
            with hooks or contextlib.nullcontext(), autocast(self.device, self.args.precision):
                logits = self.model(self.tokens)
                if mode == "inference":
                    mark("end")  # with the logits live, as a caller holds them
                    return
                loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), self.targets.view(-1))
                del logits
        mark("backward")
        loss.backward()
        mark("optimizer_step")
        self.optimizer.step()
        mark("zero_grad")
        self.optimizer.zero_grad(set_to_none=True)
        mark("end")

    def labels(self) -> dict[int, dict]:
        """Storage address -> name, for the parameters and AdamW's state (live through the recorded step)."""
        named = list(self.model.named_parameters())
        out = {_addr(p): {"category": "parameters", "name": n} for n, p in named}
        for p, values in (self.optimizer.state if self.optimizer else {}).items():
            name = next(n for n, q in named if q is p)
            for key, v in values.items():
                if torch.is_tensor(v) and v.dim() > 0:
                    out[_addr(v)] = {"category": "optimizer_state", "name": f"{key} of {name}"}
        return out

    def measure(self, mode: str, output: str) -> dict:
        """Warm up, record one step, analyse its snapshot; out of memory keeps what was recorded."""
        if self.model is None:
            self.build()
        if mode == "training":
            self.optimizer = torch.optim.AdamW(self.model.parameters())
        if self.history is None:
            self.step(mode, lambda phase: None)
            raise Unsupported(
                "CUDA memory history (torch.cuda.memory._record_memory_history) needs a CUDA "
                f"device; ran the {mode} step of {self.args.model} on the CPU without it"
            )
        args, history = self.args, self.history
        warmup_oom = capture_oom(lambda: [self.step(mode, lambda phase: None) for _ in range(args.warmup_steps)])
        if warmup_oom:  # drop what the failed warm-up left: the recorded step shows what fills memory
            self.model.zero_grad(set_to_none=True)
            free_memory(self.device)
        exclude = {_addr(p) for p in self.model.parameters()} | {_addr(self.tokens), _addr(self.targets)}
        saved = SavedBytes(exclude) if mode == "training" else None
        history.start()
        oom = capture_oom(lambda: self.step(mode, lambda phase: history.mark(PHASES[mode].index(phase)), saved))
        taken, metrics = history.stop()
        path = Path(output).with_suffix(".pickle")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(pickle.dumps(taken))
        top, points = args.top_allocations, args.timeline_points
        metrics.update(snapshot.analyse(taken, PHASES[mode], self.labels(), top, points))
        metrics["snapshot_path"] = str(path)
        if saved is not None:
            metrics.update(saved_for_backward_mib=sum(saved.seen.values()) / MIB, warmup_completed=warmup_oom is None)
        failures = [f"{what}: {o.reason}" for what, o in (("warm-up", warmup_oom), ("recorded step", oom)) if o]
        if failures:
            raise PartialOutOfMemory(f"{mode} step: " + "; ".join(failures), metrics)
        return metrics


def main(argv=None) -> int:
    job = parse_job("memory", argv, __doc__.splitlines()[0])
    args = job.args
    device = devices.check_device(args.device)
    session = Session(args, device)
    for mode in args.modes:
        output = args.output.format(mode=mode)
        cell = {k: getattr(args, k) for k in ("model", "context_length", "precision", "batch_size")}
        job.write("memory", {**cell, "mode": mode}, functools.partial(session.measure, mode, output), output)
        free_memory(device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
