"""e2e across devices: the training step's ratio, and host- or GPU-bound from the measured busy share."""

from __future__ import annotations

from lmperf.core.record import make_record
from lmperf.kinds.e2e.compare import compare
from tests.kinds.e2e.report_records import PROVENANCE

CONTEXTS = (128, 256, 512, 1024)


def record(device: str, model: str, ctx: int, ms: float | None, attention: str = "plain", **metrics) -> dict:
    cell = {"model": model, "context_length": ctx, "precision": "fp32", "compile": "eager", "warmup_steps": 5}
    provenance = {**PROVENANCE, "device_slug": device, "settings": {"attention": attention}}
    if ms is None:
        return make_record("e2e", cell, "oom", {}, provenance, "CUDA out of memory")
    return make_record("e2e", cell, "ok", {"training_step_ms_median": ms, **metrics}, provenance)


def grid(device: str, host_scale: float, gpu_scale: float, busy: bool = True) -> list[dict]:
    """`small`'s GPU is busy a third of its step (host-bound), `medium`'s nine tenths; the other device
    scales each by its factor (a small spread, so the cells are not all equal)."""
    out = []
    for i, ctx in enumerate(CONTEXTS):
        for model, ms, scale, share in (("small", 40.0, host_scale, 0.3), ("medium", ctx / 4, gpu_scale, 0.9)):
            metrics = {"gpu_busy_fraction": share} if busy else {}
            out.append(record(device, model, ctx, ms * scale * (1 + 0.002 * i), **metrics))
    return out


def test_slower_only_where_the_host_sets_the_time():
    c = compare({"h100": grid("h100", 1, 1), "h200": grid("h200", 1.3, 1.0)})
    assert c.devices == ("h100", "h200") and c.cells == 8 and c.interval == "bootstrap over cells"
    assert "level where the GPU's work sets the time, `h200` slower where the host sets it" in c.verdict
    assert c.evidence.startswith("4 host-bound cells (the GPU busy under half the step)")
    assert "; 4 GPU-bound: 1.00×" in c.evidence
    assert list(c.table["model"]) == ["small", "medium"] and list(c.table["host-bound cells"]) == [4, 0]


def test_faster_only_where_the_gpu_sets_the_time_and_level_everywhere():
    gpu_faster = compare({"h100": grid("h100", 1, 1), "h200": grid("h200", 1.0, 0.8)}).verdict
    assert "`h200` faster where the GPU's work sets the time, level where the host sets it" in gpu_faster
    level = compare({"h100": grid("h100", 1, 1), "h200": grid("h200", 1.01, 0.99)}).verdict
    assert level == "level (1.00×); host-bound and GPU-bound cells level, within the noise"


def test_without_a_measured_busy_share_nothing_is_guessed_from_the_times():
    c = compare({"h100": grid("h100", 1, 1, busy=False), "h200": grid("h200", 1.3, 1.0, busy=False)})
    assert "no cell could be tested for what bounds it" in c.verdict
    assert c.evidence.endswith("8 untested (no busy share measured)")


def test_trial_intervals_decide_the_side():
    def cells(device, scale, spread):
        return [
            record(device, "medium", ctx, ctx * scale, training_step_ms_median_interval=[low, high], trials=[{}] * 3)
            for ctx in CONTEXTS
            for low, high in [(ctx * scale * (1 - spread), ctx * scale * (1 + spread))]
        ]

    tight = compare({"h100": cells("h100", 1.0, 0.01), "h200": cells("h200", 0.9, 0.01)})
    assert tight.interval == "the cells' trial intervals" and tight.verdict.startswith("`h200` faster (0.90×)")
    wide = compare({"h100": cells("h100", 1.0, 0.08), "h200": cells("h200", 0.9, 0.08)})
    assert wide.verdict.startswith("level (0.90×)")  # the same ratio, within its trials' noise


def test_other_attentions_are_cells_of_their_own_and_oom_cells_are_left_out():
    def cells(device, flash_ms):
        small = [record(device, "small", 128, 40.0), record(device, "small", 256, None)]
        return small + [record(device, "small", 128, flash_ms, attention="flash")]

    c = compare({"h100": cells("h100", 20.0), "h200": cells("h200", 10.0)})
    assert c.cells == 2 and c.ratio.low == 0.5 and c.ratio.high == 1.0
    assert compare({"h100": cells("h100", 20.0), "h200": []}).verdict.startswith("not compared: fewer than two")
