"""e2e across devices: the training step's ratio, and host- or GPU-bound from the cells themselves."""

from __future__ import annotations

from lmperf.core.record import make_record
from lmperf.kinds.e2e.compare import compare

CONTEXTS = (128, 256, 512, 1024)


def provenance(device: str, attention: str = "plain") -> dict:
    return {
        "device_slug": device,
        "device_name": device.upper(),
        "torch_version": "2.11",
        "git_commit": "0" * 40,
        "git_dirty": False,
        "start_time": "2026-11-26T10:00:00+00:00",
        "settings": {"attention": attention},
    }


def record(device: str, model: str, ctx: int, ms: float | None, attention: str = "plain", **metrics) -> dict:
    cell = {"model": model, "context_length": ctx, "precision": "fp32", "compile": "eager", "warmup_steps": 5}
    if ms is None:
        return make_record("e2e", cell, "oom", {}, provenance(device, attention), "CUDA out of memory")
    return make_record("e2e", cell, "ok", {"training_step_ms_median": ms, **metrics}, provenance(device, attention))


def grid(device: str, host_scale: float, gpu_scale: float) -> list[dict]:
    """`small`'s step is flat in the context (host-bound), `medium`'s doubles with it (GPU-bound);
    the other device scales each by its factor (a small spread, so the cells are not all equal)."""
    out = []
    for i, ctx in enumerate(CONTEXTS):
        out.append(record(device, "small", ctx, 40.0 * host_scale * (1 + 0.002 * i)))
        out.append(record(device, "medium", ctx, ctx / 4 * gpu_scale * (1 + 0.002 * i)))
    return out


def test_slower_only_where_the_host_sets_the_time():
    c = compare({"h100": grid("h100", 1, 1), "h200": grid("h200", 1.3, 1.0)})
    assert c.devices == ("h100", "h200") and c.cells == 8 and c.interval == "bootstrap over cells"
    assert "level where the GPU's work sets the time, `h200` slower where the host sets it" in c.verdict
    # small: three host-bound, its longest untested (flat into it: its own doubling is unknown); medium: four GPU-bound
    assert c.evidence.startswith("3 host-bound cells") and "; 4 GPU-bound: 1.00×" in c.evidence
    assert c.evidence.endswith("; 1 untested")
    assert list(c.table["model"]) == ["small", "medium"]  # size order
    assert list(c.table["host-bound cells"]) == [3, 0]


def test_faster_only_where_the_gpu_sets_the_time():
    c = compare({"h100": grid("h100", 1, 1), "h200": grid("h200", 1.0, 0.8)})
    assert (
        "`h200` faster where the GPU's work sets the time, level where the host sets it: the GPUs differ" in c.verdict
    )


def test_level_everywhere_and_the_overall_side():
    level = compare({"h100": grid("h100", 1, 1), "h200": grid("h200", 1.01, 0.99)})
    assert level.verdict == "level (1.00×); level, within the noise"
    faster = compare({"h100": grid("h100", 1, 1), "h200": grid("h200", 0.8, 0.8)})
    assert faster.verdict.startswith("`h200` faster (0.80×)")


def test_the_gpu_busy_share_decides_host_bound_where_records_carry_it():
    def busy_grid(device, scale):
        # every step grows with the context, but `small`'s GPU is busy a third of it: host-bound by the busy share
        return [
            record(device, m, ctx, ctx / 4 * scale, gpu_busy_fraction=busy)
            for ctx in CONTEXTS
            for m, busy in (("small", 0.3), ("medium", 0.9))
        ]

    c = compare({"h100": busy_grid("h100", 1.0), "h200": busy_grid("h200", 1.0)})
    assert c.evidence.startswith("4 host-bound cells (the GPU busy under half the step)")


def test_trial_intervals_decide_the_side():
    def with_interval(device, scale, spread):
        return [
            record(
                device,
                "medium",
                ctx,
                ctx * scale,
                training_step_ms_median_interval=[ctx * scale * (1 - spread), ctx * scale * (1 + spread)],
                trials=[{}, {}, {}],
            )
            for ctx in CONTEXTS
        ]

    tight = compare({"h100": with_interval("h100", 1.0, 0.01), "h200": with_interval("h200", 0.9, 0.01)})
    assert tight.interval == "the cells' trial intervals" and tight.verdict.startswith("`h200` faster (0.90×)")
    wide = compare({"h100": with_interval("h100", 1.0, 0.08), "h200": with_interval("h200", 0.9, 0.08)})
    assert wide.verdict.startswith("level (0.90×)")  # the same ratio, within its trials' noise


def test_other_attentions_are_cells_of_their_own_and_oom_cells_are_left_out():
    def cells(device, flash_ms):
        return [
            record(device, "small", 128, 40.0),
            record(device, "small", 128, flash_ms, attention="flash"),
            record(device, "small", 256, None),
        ]

    c = compare({"h100": cells("h100", 20.0), "h200": cells("h200", 10.0)})
    assert c.cells == 2 and c.ratio.low == 0.5 and c.ratio.high == 1.0


def test_a_single_device_is_not_compared():
    c = compare({"h100": grid("h100", 1, 1), "h200": []})
    assert c.ratio is None and c.verdict.startswith("not compared: fewer than two devices")
