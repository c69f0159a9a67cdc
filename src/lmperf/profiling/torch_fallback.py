"""The torch.profiler fallback where nsys is missing: the same named ranges (``lmperf.nvtx`` ranges become
``record_function`` ones under ``route_ranges``) and kernels with their launch time; on a CPU the ATen
operators stand in for kernels, each with its self time (nested operators counted once).
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict

import torch

from lmperf import nvtx
from lmperf.profiling.phases import Kernel, Range, Trace, is_range_name

_RUNTIME_CALL = re.compile(r"^cu(da)?[A-Z]")  # cudaLaunchKernel, cuLaunchKernelEx, cudaMemcpyAsync, …


@contextlib.contextmanager
def route_ranges():
    """While active, ``lmperf.nvtx.range(name)`` opens a ``torch.profiler.record_function``."""
    original = nvtx.range
    nvtx.range = torch.profiler.record_function
    try:
        yield
    finally:
        nvtx.range = original


def profiler(device: torch.device) -> torch.profiler.profile:
    """A torch.profiler of the CPU and, on CUDA, its kernels (a context manager)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities)


def _kind(event) -> str:
    """Kineto's activity type (kernel, cuda_runtime, cpu_op, …); where an event has no ``activity_type()``
    (torch 2.11) from its device and name."""
    activity_type = getattr(event, "activity_type", None)
    if callable(activity_type):
        return str(activity_type()).rsplit(".", 1)[-1].lower()
    name = event.name()
    flag = getattr(event, "is_user_annotation", None)
    annotation = bool(flag()) if callable(flag) else is_range_name(name)
    if "cuda" in str(event.device_type()).lower():
        if annotation or is_range_name(name):
            return "gpu_user_annotation"
        return "gpu_memcpy" if name.startswith(("Memcpy", "Memset")) else "kernel"
    if annotation:
        return "user_annotation"
    return "cuda_runtime" if _RUNTIME_CALL.match(name) else "cpu_op"


def cpu_self_times(ops: list[tuple[int, int, int]]) -> list[int]:
    """Self time of each (start_ns, end_ns, thread) interval: its duration less its direct children's on
    the same thread (intervals on a thread nest, as operator calls do)."""
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
                self_ns[stack[-1]] -= min(end, ops[stack[-1]][1]) - start
            stack.append(i)
    return [max(0, s) for s in self_ns]


def events_to_trace(events) -> Trace:
    """Ranges and kernels (or, with no GPU kernel, CPU operators) from the profiler's Kineto events."""
    ranges, gpu, ops, launched = [], [], [], {}
    for e in events:
        kind = _kind(e)
        if kind == "user_annotation":
            ranges.append(Range(e.name(), e.start_ns(), e.start_ns() + e.duration_ns(), e.start_thread_id()))
        elif kind in ("kernel", "concurrent_kernel"):
            gpu.append(e)
        elif kind in ("cuda_runtime", "cuda_driver", "cpu_op"):
            launched[(kind == "cpu_op", e.correlation_id())] = e.start_ns()
            if kind == "cpu_op":
                ops.append(e)
    kernels = []
    for e in gpu:  # launched at its runtime call, else at the operator it is linked to
        linked = getattr(e, "linked_correlation_id", None)
        launch = launched.get((False, e.correlation_id()))
        if launch is None and callable(linked):
            launch = launched.get((True, linked()))
        start, end = e.start_ns(), e.start_ns() + e.duration_ns()
        kernels.append(
            Kernel(e.name(), start, end, start if launch is None else launch, launch_known=launch is not None)
        )
    if not gpu:
        spans = [(e.start_ns(), e.start_ns() + e.duration_ns(), e.start_thread_id()) for e in ops]
        for e, (start, end, _), self_ns in zip(ops, spans, cpu_self_times(spans)):
            kernels.append(Kernel(e.name(), start, end, start, duration_ns=self_ns))
    kernels.sort(key=lambda k: k.start_ns)
    notes = {"kernels": len(kernels), "kernel_kind": "cuda kernels" if gpu else "cpu operators (self time)"}
    notes |= {"nvtx_ranges": len(ranges), "kernels_without_runtime_launch": sum(not k.launch_known for k in kernels)}
    return Trace(kernels, ranges, "torch.profiler", notes)
