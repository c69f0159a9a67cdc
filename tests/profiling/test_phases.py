"""Phase attribution by launch time, per-phase summaries, one size's slice of a shared trace, and the
torch.profiler fallback's events and self times, on synthetic traces."""

from __future__ import annotations

import random
import types

import pytest

from lmperf.profiling.phases import (
    Kernel,
    Range,
    Trace,
    attribute,
    cell_range_name,
    model_range_name,
    model_slice,
    summarize_cell,
    summarize_kernels,
)
from lmperf.profiling.torch_fallback import cpu_self_times, events_to_trace

GEMM = "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(T1::Params)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int, T2, T3)"
ADAM = "void at::native::multi_tensor_apply_kernel<at::native::FusedAdamMathFunctor<float, 4>>(T1, T2)"
US = 1000  # times in microseconds, as ns


def k(name, launch, start, end):
    return Kernel(name=name, start_ns=start, end_ns=end, launch_ns=launch)


def test_a_kernel_belongs_to_the_innermost_range_open_at_its_launch():
    ranges = [Range("forward", 0, 100), Range("backward", 100, 300), Range("forward", 10, 20)]
    kernels = [
        k(GEMM, launch=15, start=16, end=150),  # in the nested range, still running after it: that range
        k(GEMM, launch=50, start=150, end=200),  # after the nested one closed: the enclosing one
        k(GEMM, launch=120, start=150, end=200),  # from the autograd thread inside backward's window
        k(ADD, launch=350, start=351, end=352),  # after every range
    ]
    owners = attribute(kernels, ranges, {"forward", "backward"})
    assert [(o.name, o.start_ns) if o else None for o in owners] == [
        ("forward", 10),
        ("forward", 0),
        ("backward", 100),
        None,
    ]


def training_trace(kernel_names=(GEMM, ADD, ADAM), shift=0) -> Trace:
    """Two training steps of one block, 500 us apart; a kernel between them and one after the block."""
    gemm, add, adam = kernel_names
    ranges, kernels = [Range(cell_range_name(64, "training"), shift, shift + 1000 * US)], []
    for t in (shift, shift + 500 * US):
        ranges += [Range("training_step", t, t + 400 * US), Range("forward", t, t + 100 * US)]
        ranges += [Range("computing attention scores", t + 10 * US, t + 20 * US)]
        ranges += [Range("computing softmax", t + 20 * US, t + 30 * US), Range("backward", t + 100 * US, t + 300 * US)]
        ranges += [Range("optimizer_step", t + 300 * US, t + 400 * US)]
        for name, launch, start, ms in ((gemm, 12, 13, 10), (add, 22, 24, 4), (gemm, 40, 41, 20), (gemm, 150, 151, 40),
                                        (add, 160, 191, 6), (adam, 310, 311, 30)):  # fmt: skip
            kernels.append(k(name, t + launch * US, t + start * US, t + (start + ms) * US))
    kernels += [k(add, shift + 450 * US, shift + 450 * US, shift + 452 * US), k(gemm, shift + 2 * 10**6, 0, 100 * US)]
    return Trace(kernels=kernels, ranges=ranges)


def test_summarize_cell_by_hand():
    s = summarize_cell(training_trace(), 64, "training", top_n=5)
    fwd, bwd, opt, step = (s["phases"][p] for p in ("forward", "backward", "optimizer_step", "training_step"))
    assert (fwd["steps"], fwd["launches_per_step"], bwd["launches_per_step"], opt["launches_per_step"]) == (2, 3, 2, 1)
    assert fwd["kernel_ms_per_step"] == pytest.approx(0.034) and fwd["matmul_share"] == pytest.approx(30 / 34)
    assert fwd["range_ms_samples"] == pytest.approx([0.1, 0.1]) and opt["class_share"]["optimizer"] == 1.0
    assert bwd["class_ms_per_step"]["matmul"] == pytest.approx(0.040) and fwd["class_share"]["attention"] == 0
    assert [t["name"] for t in fwd["top_kernels"]] == [GEMM, ADD] and fwd["top_kernels"][0]["launches"] == 4
    assert step["kernel_ms_per_step"] == pytest.approx(0.110)
    assert s["phases"]["forward_backward"]["launches_per_step"] == 5
    assert s["unattributed_kernels"] == 1 and s["unattributed_kernel_ms"] == pytest.approx(0.002)
    att = s["attention"]["ranges"]
    assert att["computing attention scores"]["matmul_ms_per_step"] == pytest.approx(0.010)
    assert att["computing softmax"]["kernel_ms_per_step"] == pytest.approx(0.004)
    assert att["computing softmax"]["range_ms_per_step"] == pytest.approx(0.010)
    assert att["final matmul"]["launches_per_step"] == 0
    with pytest.raises(ValueError, match="expected one range"):
        summarize_cell(training_trace(), 128, "training")


def test_each_size_reads_its_own_slice_of_a_shared_trace():
    alone, second = training_trace(), training_trace((ADD, ADD, ADD), shift=2 * 10**9)
    trace = Trace(
        alone.kernels + second.kernels,
        [Range(model_range_name("large"), -1, 1000 * US + 1), *alone.ranges]
        + [Range(model_range_name("small"), 2 * 10**9 - 1, 2 * 10**9 + 1000 * US + 1), *second.ranges],
    )
    expected = summarize_cell(alone, 64, "training", top_n=5)
    large = summarize_cell(model_slice(trace, "large"), 64, "training", top_n=5)
    assert large["phases"] == expected["phases"]
    assert {x.name for x in model_slice(trace, "small").kernels} == {ADD}
    with pytest.raises(ValueError, match="one range"):
        summarize_cell(trace, 64, "training")  # the whole trace holds the block twice


def test_kernel_shares_sum_to_one_on_random_kernels(fresh_seed):
    rng = random.Random(fresh_seed)
    kernels = [k(rng.choice([GEMM, ADD, ADAM, "other"]), s, s, s + rng.randrange(1, 5000)) for s in range(200)]
    s = summarize_kernels(kernels, steps=4, top_n=10)
    assert sum(t["share"] for t in s["top_kernels"]) == pytest.approx(1.0) == sum(s["class_share"].values())
    assert s["kernel_ms_per_step"] == pytest.approx(sum(x.end_ns - x.start_ns for x in kernels) / 1e6 / 4)


def test_cpu_self_times_subtract_direct_children():
    # a [0, 100) holds b [10, 40) which holds c [15, 25); d [50, 60) in a; e [0, 30) on another thread
    assert cpu_self_times([(0, 100, 1), (10, 40, 1), (15, 25, 1), (50, 60, 1), (0, 30, 2)]) == [60, 20, 10, 10, 30]


def Event(name, device, start, dur, thread=1, corr=0, linked=0):  # noqa: N802 - stands for a class
    """A Kineto event of torch 2.11: no activity_type(), no is_user_annotation()."""
    values = {"name": name, "device_type": f"DeviceType.{device}", "start_ns": start, "duration_ns": dur}
    values |= {"start_thread_id": thread, "correlation_id": corr, "linked_correlation_id": linked}
    return types.SimpleNamespace(**{key: (lambda v=v: v) for key, v in values.items()})


def test_gpu_and_cpu_events_become_kernels_launched_where_they_were_called():
    gpu = events_to_trace([
        Event(cell_range_name(8, "training"), "CPU", 0, 1000), Event("backward", "CPU", 100, 500),
        Event("backward", "CUDA", 120, 600),  # record_function's GPU-side copy: not a kernel
        Event("aten::mm", "CPU", 110, 50, corr=7), Event("cudaLaunchKernel", "CPU", 120, 5, thread=2, corr=9001),
        Event(GEMM, "CUDA", 700, 40, corr=9001, linked=7),  # launched by the runtime call at 120
        Event(ADD, "CUDA", 900, 10, corr=9002, linked=7),  # no runtime call: the linked operator's start
        Event("Memcpy HtoD (Pageable -> Device)", "CUDA", 50, 5, corr=9003),
    ])  # fmt: skip
    assert [r.name for r in gpu.ranges] == [cell_range_name(8, "training"), "backward"]
    assert [(x.name, x.launch_ns, x.start_ns) for x in gpu.kernels] == [(GEMM, 120, 700), (ADD, 110, 900)]
    cpu = events_to_trace([Event("forward", "CPU", 0, 100), Event("aten::linear", "CPU", 10, 50),
                           Event("aten::addmm", "CPU", 15, 40), Event("aten::copy_", "CPU", 20, 5)])  # fmt: skip
    assert [(x.name, x.time_ns) for x in cpu.kernels] == [("aten::linear", 10), ("aten::addmm", 35), ("aten::copy_", 5)]
    assert cpu.notes["kernel_kind"] == "cpu operators (self time)"
