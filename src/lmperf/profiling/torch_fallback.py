"""The torch.profiler fallback, for machines without nsys (the CPU grid, a GPU host lacking it).

It captures the same things an nsys run gives the analysis: named ranges (the model's
``lmperf.nvtx`` ranges become ``record_function`` ranges while ``route_ranges`` is active) and
kernels with their launch time. On CUDA the kernels are the profiler's GPU kernel events, the
launch time that of the CUDA runtime call with the same correlation id. On a CPU there are no
kernels: the ATen operators stand in for them, each with its *self* time (its duration less
that of the operators it called), so nested operators are not counted twice.
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict

import torch

from lmperf import nvtx
from lmperf.profiling.phases import (
    ATTENTION_RANGES,
    PHASE_NAMES,
    Kernel,
    Range,
    Trace,
    parse_cell_range,
    parse_model_range,
)


@contextlib.contextmanager
def route_ranges():
    """While active, ``lmperf.nvtx.range(name)`` opens a ``torch.profiler.record_function``."""
    original = nvtx.range
    nvtx.range = torch.profiler.record_function
    try:
        yield
    finally:
        nvtx.range = original


class TorchCapture:
    """start()/stop() around the measured steps, like cudaProfilerStart/Stop under nsys."""

    def __init__(self, device: torch.device):
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.device = device
        self.profiler = torch.profiler.profile(activities=activities)

    def start(self) -> None:
        self.profiler.start()

    def stop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.profiler.stop()

    def trace(self) -> Trace:
        return events_to_trace(self.profiler.profiler.kineto_results.events())


_RUNTIME_CALL = re.compile(r"^cu(da)?[A-Z]")  # cudaLaunchKernel, cuLaunchKernelEx, cudaMemcpyAsync, …
_KNOWN_RANGES = PHASE_NAMES | set(ATTENTION_RANGES) | {"training_step"}


def _is_range_name(name: str) -> bool:
    return name in _KNOWN_RANGES or parse_cell_range(name) is not None or parse_model_range(name) is not None


def _is_cuda(event) -> bool:
    return "cuda" in str(event.device_type()).lower()


def _kind(event) -> str:
    """Kineto's activity type (kernel, cuda_runtime, cpu_op, user_annotation, …). Older torch
    (2.11) has no ``activity_type()`` on its events: then it is inferred from the device, the
    ``is_user_annotation()`` flag where present, and the names (the ranges this package pushes,
    the CUDA API's ``cu…`` names, ``Memcpy``/``Memset``)."""
    activity_type = getattr(event, "activity_type", None)
    if callable(activity_type):
        return str(activity_type()).rsplit(".", 1)[-1].lower()
    name = event.name()
    flag = getattr(event, "is_user_annotation", None)
    annotation = bool(flag()) if callable(flag) else _is_range_name(name)
    if _is_cuda(event):
        if annotation or _is_range_name(name):
            return "gpu_user_annotation"
        if name.startswith("Memcpy"):
            return "gpu_memcpy"
        if name.startswith("Memset"):
            return "gpu_memset"
        return "kernel"
    if annotation:
        return "user_annotation"
    return "cuda_runtime" if _RUNTIME_CALL.match(name) else "cpu_op"


def cpu_self_times(ops: list[tuple[int, int, int]]) -> list[int]:
    """Self time of each (start_ns, end_ns, thread) interval: its duration less its direct
    children's on the same thread (intervals on a thread nest, as operator calls do)."""
    self_ns = [end - start for start, end, _ in ops]
    by_thread: dict[int, list[int]] = defaultdict(list)
    for i, (_, _, thread) in enumerate(ops):
        by_thread[thread].append(i)
    for indices in by_thread.values():
        indices.sort(key=lambda i: (ops[i][0], -ops[i][1]))
        stack: list[int] = []
        for i in indices:
            start, end, _ = ops[i]
            while stack and ops[stack[-1]][1] <= start:
                stack.pop()
            if stack:
                parent = stack[-1]
                self_ns[parent] -= min(end, ops[parent][1]) - start
            stack.append(i)
    return [max(0, s) for s in self_ns]


def events_to_trace(events) -> Trace:
    """Ranges and kernels from the profiler's Kineto events."""
    ranges, gpu, ops = [], [], []
    runtime_start: dict[int, int] = {}
    op_start: dict[int, int] = {}
    for e in events:
        kind = _kind(e)
        start, end = e.start_ns(), e.start_ns() + e.duration_ns()
        if kind == "user_annotation" and not _is_cuda(e):
            ranges.append(Range(name=e.name(), start_ns=start, end_ns=end, thread=e.start_thread_id()))
        elif kind == "kernel" or (_is_cuda(e) and kind not in ("gpu_user_annotation", "gpu_memcpy", "gpu_memset")):
            gpu.append(e)
        elif kind == "cuda_runtime":
            runtime_start[e.correlation_id()] = start
        elif kind == "cpu_op":
            ops.append(e)
            op_start[e.correlation_id()] = start
    kernels = []
    if gpu:
        for e in gpu:
            launch = runtime_start.get(e.correlation_id())
            linked = getattr(e, "linked_correlation_id", None)
            if launch is None and callable(linked):
                launch = op_start.get(linked())
            kernels.append(
                Kernel(
                    name=e.name(),
                    start_ns=e.start_ns(),
                    end_ns=e.start_ns() + e.duration_ns(),
                    launch_ns=launch if launch is not None else e.start_ns(),
                    launch_known=launch is not None,
                )
            )
        kind = "cuda kernels"
    else:
        spans = [(e.start_ns(), e.start_ns() + e.duration_ns(), e.start_thread_id()) for e in ops]
        for e, (start, end, _), self_ns in zip(ops, spans, cpu_self_times(spans)):
            kernels.append(Kernel(name=e.name(), start_ns=start, end_ns=end, launch_ns=start, duration_ns=self_ns))
        kind = "cpu operators (self time)"
    kernels.sort(key=lambda k: k.start_ns)
    return Trace(
        kernels=kernels,
        ranges=ranges,
        source="torch.profiler",
        notes={
            "kernels": len(kernels),
            "kernel_kind": kind,
            "nvtx_ranges": len(ranges),
            "kernels_without_runtime_launch": sum(1 for k in kernels if not k.launch_known),
        },
    )
