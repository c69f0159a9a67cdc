"""The ladder's section: its sentences' parts add up, its figures' titles name the ceiling its text
uses, a CPU reads in CPU words, and main writes exactly its outputs with every figure referenced."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from lmperf.kinds.ladder import bounds, facts, figures, report

from .ladder_synth import rung
from .test_ladder_bounds import best_rung, profile

REPO = Path(__file__).resolve().parents[3]
H100 = REPO / "results" / "h100"
NUMBER = r"([\d,]+\.?\d*)"


def number(text: str) -> float:
    return float(text.replace(",", ""))


def two_point_seven_b() -> list[dict]:
    mfu = {"mfu_datasheet_bf16": 0.3, "mfu_measured_bf16": 0.4}
    return [
        rung("baseline", 0, None, None, model="2.7B", status="oom"),
        rung("sdpa_flash", 1, "baseline", 282.2, model="2.7B", mfu=mfu),
        rung("sdpa_cudnn", 2, "sdpa_flash", 276.1, model="2.7B", mfu=mfu),
        rung("flash", 3, "sdpa_cudnn", 286.3, model="2.7B", mfu=mfu),
        rung("compile", 4, "sdpa_cudnn", 201.4, model="2.7B", mfu=mfu),
        rung("max_batch", 5, "compile", 355.6, model="2.7B", batch=8, mfu=mfu),
    ]


def test_the_waterfall_sentence_reads_as_it_should_and_its_parts_add_up():
    (ladder,) = facts.ladders_from(two_point_seven_b())
    text = report.waterfall_text(ladder, "h100")
    assert text == (
        "**2.7B, context 1024**: `sdpa_flash` at 68.9 µs per token to `max_batch` at 43.4 (1.59× the tokens/s): "
        "`sdpa_cudnn` saves 1.5 (within the noise), `compile` saves 18.2, `max_batch` saves 5.8; 25.5 µs per token "
        "in all. Not built on: `flash` (within the noise against `sdpa_cudnn`). Did not run: `baseline` (out of memory)."
    )
    start = number(re.search(rf"at {NUMBER} µs per token to", text).group(1))
    best = number(re.search(rf"`max_batch` at {NUMBER} ", text).group(1))
    saved = [number(x) for x in re.findall(rf"saves {NUMBER}", text)]
    total = number(re.search(rf"; {NUMBER} µs per token in all", text).group(1))
    assert round(sum(saved), 1) == total == round(start - best, 1)


def test_the_profile_sentence_adds_up_to_the_step_it_names():
    best = best_rung()
    classes = {"matmul": 745.71, "elementwise": 119.91, "optimizer": 109.47, "other": 56.36, "memory": 2.43}
    record = profile(best, classes, 19.76, sum(classes.values()) + 19.76, steps=3)
    text = report.profile_text(bounds.profile_from(record, best), [], "h100")
    step = number(re.search(rf"splits its {NUMBER} ms step into", text).group(1))
    listed = re.search(r"step into (.*?) ms;", text).group(1)
    parts = [number(x) for x in re.findall(rf"[a-z]+ {NUMBER}", listed)]
    assert len(parts) == len(classes) + 1  # every class and the idle time, none left out
    assert round(sum(parts), 1) == step
    assert "blends GEMMs with attention" in text and "another run" not in text


def section_and_head(records, device="h100"):
    text = report.section(records, device, {})
    rungs = [r for la in facts.ladders_from(records) for r in la.rungs]
    return text, facts.headline(rungs), facts.ladders_from(records)[0]


def test_the_figure_title_names_the_ceiling_the_text_uses():
    gpu, head, ladder = section_and_head(two_point_seven_b())
    assert head.words == "the bf16 datasheet peak"
    assert head.words in figures.figure_title(ladder, head)
    assert f"% of {head.words}" in gpu and f"against {head.words}." in gpu
    # without a datasheet MFU (a CPU, or a GPU that lmperf.core.peaks does not list): the measured ceiling
    measured = two_point_seven_b()
    for r in measured:
        r["metrics"].pop("mfu_datasheet_bf16", None)
    text, head, ladder = section_and_head(measured)
    assert head.words == "the measured bf16 GEMM ceiling" and head.words in figures.figure_title(ladder, head)
    assert f"% of {head.words}" in text and "datasheet" not in text


def cpu_records() -> list[dict]:
    mfu = {"mfu_datasheet_bf16": None, "mfu_measured_bf16": 0.2}
    common = dict(model="tiny", ctx=32, device="cpu")
    return [
        rung("baseline", 0, None, 20.0, mfu=mfu, **common),
        rung("tf32", 1, "baseline", None, status="unsupported", **common),
        rung("bf16", 2, "baseline", 200.0, mfu=mfu, **common),
        rung("fused_adamw", 3, "baseline", 15.0, mfu=mfu, **common),
    ]


def test_a_cpu_section_reads_in_cpu_words_and_says_once_what_a_cpu_does_not_measure():
    text = report.section(cpu_records(), "cpu", {})
    assert "a CPU has no device to synchronize with" in text and "with a synchronize" not in text
    assert "Nsight" not in text and "kernel profile" not in text.split("Not measured on a CPU")[0]
    assert text.count("Not measured on a CPU: `tf32` (CUDA only)") == 1
    assert "cannot run here" not in report.waterfall_text(facts.ladders_from(cpu_records())[0], "cpu")
    assert "On this CPU `bf16` runs at 0.10× the tokens/s of its parent `baseline` (slower)" in text
    gpu = report.section(
        [{**r, "provenance": {**r["provenance"], "device_slug": "h100"}} for r in cpu_records()], "h100", {}
    )
    assert "On this CPU" not in gpu and "with a synchronize around the whole step" in gpu


def test_the_section_states_no_goal():
    text, _, _ = section_and_head(two_point_seven_b())
    assert not re.search(r"\bgoal|target", text, re.I)


def run_main(tmp_path, records: list[str], grid: dict, device: str = "h100") -> Path:
    argv = ["--device", device, "--out", str(tmp_path), "--grid", json.dumps(grid), "--records", *records]
    assert report.main(argv) == 0
    return tmp_path


def test_main_on_committed_records_writes_its_outputs_and_references_every_figure(tmp_path):
    grid = yaml.safe_load((REPO / "config.yaml").read_text())["grids"]["gpu"]["ladder"]
    records = sorted(map(str, H100.glob("ladder/small_ctx1024_*.json"))) + sorted(
        map(str, H100.glob("ladder/2.7B_ctx1024_*.json"))
    )
    records += sorted(map(str, H100.glob("gemm_peak/*.json"))) + sorted(map(str, H100.glob("ladder_profile/*.json")))
    out = run_main(tmp_path, records, grid)
    for path in report.outputs(grid):
        assert (out / path).stat().st_size > 0, path
    sections = {name: (out / "sections" / f"{name}.md").read_text() for name in report.SECTIONS}
    text = "\n".join(sections.values())
    for figure in (out / "figures").glob("*.png"):
        assert f"](../../results/h100/figures/{figure.name})" in text, figure.name
    assert "[full table](../../results/h100/tables/ladder.csv)" in text
    assert "\n\n\n" not in text and text.endswith("\n") and not text.endswith("\n\n")


def test_main_without_records_says_so_in_one_line_and_still_writes_its_outputs(tmp_path):
    grid = {
        "models": ["small"],
        "context_lengths": [1024],
        "long_context": {"models": ["small"], "context_lengths": [2048]},
    }
    assert report.outputs(grid) == [
        "tables/ladder.csv",
        "figures/ladder_small_ctx1024.png",
        "figures/ladder_small_ctx2048.png",
    ]
    out = run_main(tmp_path, [], grid, "h200")
    assert all((out / p).exists() for p in report.outputs(grid))
    assert (out / "sections" / "speed_ladder.md").read_text() == "The speed ladder was not measured on `h200`.\n"


def test_an_fp8_rung_is_said_to_give_bf16_equivalent_mfu_and_its_own():
    fp8 = {"mfu_datasheet_bf16": 0.6, "mfu_datasheet_fp8": 0.3}
    records = [
        rung("baseline", 0, None, 100.0, mfu={"mfu_datasheet_bf16": 0.3}),
        rung("fp8_rowwise", 1, "baseline", 50.0, mfu=fp8),
    ]
    text = report.section(records, "h100", {})
    assert "Rungs that run in fp8 give MFU against the bf16 peak too (bf16-equivalent" in text
    assert "Rungs that run in" not in report.section(records[:1], "h100", {})
