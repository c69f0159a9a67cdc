"""Phase attribution by launch time, per-phase summaries and CPU self times, on synthetic traces."""

from __future__ import annotations

import random

import pytest

from lmperf.profiling.phases import (
    Kernel,
    Range,
    RangeIndex,
    Trace,
    attribute,
    cell_range_name,
    model_range_name,
    model_slice,
    parse_cell_range,
    parse_model_range,
    summarize_cell,
    summarize_kernels,
)
from lmperf.profiling.torch_fallback import cpu_self_times

GEMM = "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(T1::Params)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char *, 3>>(int, T2, T3)"
ADAM = "void at::native::multi_tensor_apply_kernel<at::native::TensorListMetadata<4>, at::native::FusedAdamMathFunctor<float, 4>>(T1, T2)"
MAIN = 1  # ranges are pushed on the main thread; kernels carry no thread, only launch times


def k(name, launch, start, end):
    return Kernel(name=name, start_ns=start, end_ns=end, launch_ns=launch)


def test_cell_range_names_round_trip():
    assert parse_cell_range(cell_range_name(512, "training")) == (512, "training")
    assert parse_cell_range("forward") is None
    with pytest.raises(ValueError):
        cell_range_name(128, "eval")


def test_innermost_range_contains_the_time():
    outer, inner, later = Range("a", 0, 100), Range("a", 10, 20), Range("a", 200, 300)
    index = RangeIndex([later, inner, outer])
    assert index.find(15) is inner
    assert index.find(50) is outer  # after the nested one closed: walks back to the enclosing one
    assert index.find(150) is None
    assert index.find(200) is later and index.find(300) is later
    assert index.find(-1) is None


def test_backward_kernels_from_the_autograd_thread_belong_to_backward():
    ranges = [Range("forward", 0, 100, MAIN), Range("backward", 100, 300, MAIN)]
    kernels = [
        k(GEMM, launch=10, start=12, end=150),  # launched in forward, still running after it: forward
        k(GEMM, launch=120, start=150, end=200),  # launched by the autograd thread inside backward's window
        k(ADD, launch=99, start=210, end=220),  # queued behind others: GPU start in backward, launch in forward
        k(ADD, launch=350, start=351, end=352),  # after every range
    ]
    owners = attribute(kernels, ranges, {"forward", "backward"})
    assert [o.name if o else None for o in owners] == ["forward", "backward", "forward", None]


def _training_trace():
    """Two training steps; times in microseconds written as ns × 1000 for readable numbers."""
    us = 1000
    ranges = [Range(cell_range_name(64, "training"), 0, 1000 * us, MAIN)]
    kernels = []
    for t0 in (0, 500):
        t = t0 * us
        ranges += [
            Range("training_step", t, t + 400 * us, MAIN),
            Range("forward", t, t + 100 * us, MAIN),
            Range("computing attention scores", t + 10 * us, t + 20 * us, MAIN),
            Range("computing softmax", t + 20 * us, t + 30 * us, MAIN),
            Range("backward", t + 100 * us, t + 300 * us, MAIN),
            Range("optimizer_step", t + 300 * us, t + 400 * us, MAIN),
        ]
        kernels += [
            k(GEMM, t + 12 * us, t + 13 * us, t + 23 * us),  # forward, attention scores: 10 us
            k(ADD, t + 22 * us, t + 24 * us, t + 28 * us),  # forward, softmax: 4 us
            k(GEMM, t + 40 * us, t + 41 * us, t + 61 * us),  # forward, outside attention: 20 us
            k(GEMM, t + 150 * us, t + 151 * us, t + 191 * us),  # backward: 40 us
            k(ADD, t + 160 * us, t + 191 * us, t + 197 * us),  # backward: 6 us
            k(ADAM, t + 310 * us, t + 311 * us, t + 341 * us),  # optimizer: 30 us
        ]
    kernels.append(k(ADD, 450 * us, 450 * us, 452 * us))  # between steps: unattributed, 2 us
    kernels.append(k(GEMM, 2000 * us, 2000 * us, 2100 * us))  # outside the block: ignored
    return Trace(kernels=kernels, ranges=ranges)


def test_summarize_cell_hand_computed():
    s = summarize_cell(_training_trace(), 64, "training", top_n=5)
    fwd, bwd, opt = (s["phases"][p] for p in ("forward", "backward", "optimizer_step"))
    assert fwd["steps"] == bwd["steps"] == opt["steps"] == 2
    assert fwd["launches_per_step"] == 3 and bwd["launches_per_step"] == 2 and opt["launches_per_step"] == 1
    assert fwd["kernel_ms_per_step"] == pytest.approx(0.034)  # 10 + 4 + 20 us
    assert fwd["matmul_share"] == pytest.approx(30 / 34)
    assert fwd["range_ms_samples"] == pytest.approx([0.1, 0.1])
    assert fwd["gpu_span_ms_samples"] == pytest.approx([0.048, 0.048])  # 13 us .. 61 us
    assert bwd["class_ms_per_step"]["matmul"] == pytest.approx(0.040)
    assert bwd["class_ms_per_step"]["elementwise"] == pytest.approx(0.006)
    assert opt["class_share"]["optimizer"] == pytest.approx(1.0)
    top = fwd["top_kernels"]
    assert [t["name"] for t in top] == [GEMM, ADD]
    assert top[0]["launches"] == 4 and top[0]["launches_per_step"] == 2
    assert top[0]["mean_us"] == pytest.approx(15.0)
    assert top[0]["label"] == "Kernel2[cutlass_80_simt_sgemm_128x64_8x5_nn_align1]"
    step = s["phases"]["training_step"]
    assert step["kernel_ms_per_step"] == pytest.approx(0.110)  # 34 + 46 + 30 us
    assert step["matmul_share"] == pytest.approx(70 / 110)
    assert s["phases"]["forward_backward"]["launches_per_step"] == 5
    assert s["unattributed_kernels"] == 1 and s["unattributed_kernel_ms"] == pytest.approx(0.002)
    att = s["attention"]["ranges"]
    assert s["attention"]["phase"] == "forward"
    assert att["computing attention scores"]["kernel_ms_per_step"] == pytest.approx(0.010)
    assert att["computing attention scores"]["matmul_ms_per_step"] == pytest.approx(0.010)
    assert att["computing softmax"]["kernel_ms_per_step"] == pytest.approx(0.004)
    assert att["computing softmax"]["range_ms_per_step"] == pytest.approx(0.010)
    assert att["final matmul"]["launches_per_step"] == 0


def test_summarize_cell_requires_its_block():
    with pytest.raises(ValueError, match="expected one range"):
        summarize_cell(_training_trace(), 128, "training")


def test_summarize_kernels_shares_sum_to_one_on_random_kernels():
    rng = random.Random(7)
    names = [GEMM, ADD, ADAM, "void some_other_kernel<float>(float*)"]
    kernels = []
    for _ in range(200):
        start = rng.randrange(10**6)
        kernels.append(k(rng.choice(names), start, start, start + rng.randrange(1, 5000)))
    s = summarize_kernels(kernels, steps=4, top_n=10)
    total = sum(kk.end_ns - kk.start_ns for kk in kernels)
    assert sum(t["share"] for t in s["top_kernels"]) == pytest.approx(1.0)
    assert sum(s["class_share"].values()) == pytest.approx(1.0)
    assert s["kernel_ms_per_step"] == pytest.approx(total / 1e6 / 4)
    assert sum(t["launches"] for t in s["top_kernels"]) == 200


def test_cpu_self_times_subtract_direct_children():
    # a [0, 100) holds b [10, 40) which holds c [15, 25); d [50, 60) in a; e [0, 30) on another thread.
    ops = [(0, 100, 1), (10, 40, 1), (15, 25, 1), (50, 60, 1), (0, 30, 2)]
    assert cpu_self_times(ops) == [100 - 30 - 10, 30 - 10, 10, 10, 30]


class _FakeKinetoEvent:
    """A torch 2.11-style KinetoEvent: no activity_type(), no is_user_annotation()."""

    def __init__(self, name, device, start, dur, thread=1, corr=0, linked=0):
        self._v = dict(name=name, device=device, start=start, dur=dur, thread=thread, corr=corr, linked=linked)

    def name(self):
        return self._v["name"]

    def device_type(self):
        return f"DeviceType.{self._v['device']}"

    def start_ns(self):
        return self._v["start"]

    def duration_ns(self):
        return self._v["dur"]

    def start_thread_id(self):
        return self._v["thread"]

    def correlation_id(self):
        return self._v["corr"]

    def linked_correlation_id(self):
        return self._v["linked"]


def test_gpu_fallback_events_without_activity_type():
    from lmperf.profiling.torch_fallback import events_to_trace

    E = _FakeKinetoEvent
    events = [
        E(cell_range_name(8, "training"), "CPU", 0, 1000),
        E("backward", "CPU", 100, 500),
        E("backward", "CUDA", 120, 600),  # record_function's GPU-side copy: not a kernel
        E("aten::mm", "CPU", 110, 50, corr=7),
        E("cudaLaunchKernel", "CPU", 120, 5, thread=2, corr=9001),
        E(GEMM, "CUDA", 700, 40, corr=9001, linked=7),  # runtime launch at 120 → backward
        E(ADD, "CUDA", 900, 10, corr=9002, linked=7),  # no runtime event: the linked op's start (110)
        E("Memcpy HtoD (Pageable -> Device)", "CUDA", 50, 5, corr=9003),
    ]
    t = events_to_trace(events)
    assert [(r.name, r.start_ns, r.end_ns) for r in t.ranges] == [
        (cell_range_name(8, "training"), 0, 1000),
        ("backward", 100, 600),
    ]
    assert [(kk.name, kk.launch_ns, kk.start_ns, kk.end_ns) for kk in t.kernels] == [
        (GEMM, 120, 700, 740),
        (ADD, 110, 900, 910),
    ]
    assert t.notes["kernel_kind"] == "cuda kernels"


def test_cpu_fallback_events_without_activity_type():
    from lmperf.profiling.torch_fallback import events_to_trace

    E = _FakeKinetoEvent
    events = [
        E("forward", "CPU", 0, 100),
        E("aten::linear", "CPU", 10, 50),
        E("aten::addmm", "CPU", 15, 40),
        E("aten::copy_", "CPU", 20, 5),
    ]
    t = events_to_trace(events)
    assert [r.name for r in t.ranges] == ["forward"]
    assert [(kk.name, kk.time_ns) for kk in t.kernels] == [
        ("aten::linear", 10),
        ("aten::addmm", 35),
        ("aten::copy_", 5),
    ]


def test_model_range_names_round_trip():
    assert parse_model_range(model_range_name("2.7B")) == "2.7B"
    assert parse_model_range(cell_range_name(64, "training")) is None
    assert parse_cell_range(model_range_name("small")) is None
    with pytest.raises(ValueError):
        model_range_name("two words")


def _shifted(trace: Trace, by_ns: int, kernel_name: str) -> tuple[list[Kernel], list[Range]]:
    kernels = [
        Kernel(name=kernel_name, start_ns=x.start_ns + by_ns, end_ns=x.end_ns + by_ns, launch_ns=x.launch_ns + by_ns)
        for x in trace.kernels
    ]
    ranges = [Range(r.name, r.start_ns + by_ns, r.end_ns + by_ns, r.thread) for r in trace.ranges]
    return kernels, ranges


def test_model_slice_keeps_one_models_blocks_of_the_same_name():
    """Two sizes profiled in one capture push the same block names; each size's slice holds only the
    kernels launched and the ranges opened inside its own range, and summarises as that size alone."""
    alone = _training_trace()
    gap = 2_000_000_000  # the second size 2 s after the first
    first_kernels, first_ranges = _shifted(alone, 0, GEMM)
    second_kernels, second_ranges = _shifted(alone, gap, ADD)
    # a kernel of the second size's warm-up: inside the capture, between the two model ranges
    warm_up = k(ADAM, launch=gap // 2, start=gap // 2 + 1, end=gap // 2 + 2)
    end = alone.ranges[0].end_ns
    trace = Trace(
        kernels=first_kernels + [warm_up] + second_kernels,
        ranges=[Range(model_range_name("large"), -1, end + 1, MAIN), *first_ranges]
        + [Range(model_range_name("small"), gap - 1, gap + end + 1, MAIN), *second_ranges],
    )
    expected = summarize_cell(alone, 64, "training", top_n=5)
    for model, kernel_name in (("large", GEMM), ("small", ADD)):
        part = model_slice(trace, model)
        assert {x.name for x in part.kernels} == {kernel_name}
        # all but the kernel launched after the block (outside the model's range too)
        assert len(part.kernels) == len(alone.kernels) - 1 and len(part.ranges) == len(alone.ranges)
        got = summarize_cell(part, 64, "training", top_n=5)
        for phase in ("forward", "backward", "optimizer_step"):
            assert got["phases"][phase]["kernel_ms_per_step"] == expected["phases"][phase]["kernel_ms_per_step"]
            assert got["phases"][phase]["launches_per_step"] == expected["phases"][phase]["launches_per_step"]
    with pytest.raises(ValueError, match="one range"):
        summarize_cell(trace, 64, "training")  # the whole trace holds the block twice
    with pytest.raises(ValueError, match="lmperf model=xl"):
        model_slice(trace, "xl")
