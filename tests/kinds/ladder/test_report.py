"""The ladder's report: rungs read as data, the waterfall adds up, verdicts flip only beyond the noise,
the profile's split adds up and counts the FLOPs the kernels compute, the section reads as it should."""

from __future__ import annotations

import json
import random
import re

import pytest

from lmperf.core import stats
from lmperf.core.record import make_record, write_record
from lmperf.kinds.ladder import bounds, facts, figures, report, tables

from .ladder_synth import PROV, rung, us_per_token

NUMBER = r"([\d,]+\.?\d*)"
BF16 = {"mfu_datasheet_bf16": 0.3, "mfu_measured_bf16": 0.4}
FULL, HALF = 100e12, 90e12  # attention 20e12 in full, 10e12 counted half; GEMMs 80e12


def ladder_of(records):
    (ladder,) = facts.ladders_from(records)
    return ladder


def number(text: str) -> float:
    return float(text.replace(",", ""))


def test_the_waterfall_follows_the_parents_and_its_parts_add_up(fresh_seed):
    rng = random.Random(fresh_seed)
    base, tf32 = rng.uniform(300, 400), rng.uniform(150, 200)
    comp = tf32 * rng.uniform(0.4, 0.6)
    big = comp * 2 * rng.uniform(0.6, 0.8)  # batch 8: two steps' tokens in less than twice the time
    records = [
        rung("baseline", 0, None, base),
        rung("tf32", 1, "baseline", tf32),
        rung("bf16", 2, "tf32", tf32 * rng.uniform(1.2, 1.5)),  # slower: off the best rung's path
        rung("compile", 3, "tf32", comp),
        rung("max_batch", 4, "compile", big, batch=8),
        rung("grad_accum", 5, "max_batch", None, status="oom"),
    ]
    ladder = ladder_of(records)
    assert (ladder.start.name, ladder.best.name) == ("baseline", "max_batch")
    assert [(s.parent, s.rung) for s in ladder.chain] == [
        ("baseline", "tf32"),
        ("tf32", "compile"),
        ("compile", "max_batch"),
    ]
    assert [(s.rung, s.verdict) for s in ladder.off_chain] == [("bf16", "slower")]
    assert [r.name for r in ladder.failed] == ["grad_accum"]
    total = us_per_token(base) - us_per_token(big, batch=8)
    assert sum(s.saved_us for s in ladder.chain) == pytest.approx(total)
    assert ladder.speedup.median == pytest.approx(us_per_token(base) / us_per_token(big, batch=8))
    # the baseline out of memory: the waterfall starts at the first rung that runs
    ladder = ladder_of([rung("baseline", 0, None, None, status="oom"), *records[1:]])
    assert ladder.start.name == "tf32" and facts.answer_facts([ladder], None).baseline_fits == 0


def test_rounded_parts_add_up_to_the_rounded_total(fresh_seed):
    rng = random.Random(fresh_seed)
    for _ in range(200):
        parts = [rng.uniform(-5, 50) for _ in range(rng.randint(1, 9))]
        digits = rng.choice([0, 1, 2])
        shown = facts.round_parts(parts, digits)
        assert round(sum(shown), digits) == round(sum(parts), digits)
        assert all(abs(a - b) < 10.0**-digits + 1e-9 for a, b in zip(shown, parts))


@pytest.mark.parametrize(
    ("child", "interval", "trials", "verdict"),
    [
        (100 / 1.3, (76.0, 78.0), 5, "faster"),  # 1.3x faster, tight intervals
        (100 / 1.3, (70.0, 101.0), 5, "within noise"),  # the same speed-up, intervals that overlap
        (100 * 1.3, (129.0, 131.0), 5, "slower"),
        (95.0, None, 1, "within noise"),  # one trial: 5% is inside twice the margin
        (90.0, None, 1, "faster"),  # one trial: 10% is outside it
    ],
)
def test_a_rung_against_its_parent_is_a_verdict_only_beyond_the_noise(child, interval, trials, verdict):
    records = [
        rung("baseline", 0, None, 100.0, interval=(99.0, 101.0) if interval else None, trials=trials),
        rung("tf32", 1, "baseline", child, interval=interval, trials=trials),
    ]
    (step,) = ladder_of(records).chain or ladder_of(records).off_chain
    assert step.verdict == verdict


def test_rungs_are_data_unknown_ones_shown_by_name_in_their_order():
    records = [rung("new_trick", 9, "fp8_rowwise", 40.0), rung("baseline", 0, None, 100.0)]
    records.append(rung("fp8_rowwise", 8, "baseline", 60.0))
    ladder = ladder_of(records)
    assert [r.name for r in ladder.rungs] == ["baseline", "fp8_rowwise", "new_trick"]
    assert [r["rung"] for r in tables.pivot_table([ladder], 1024, None)] == [f"`{r.name}`" for r in ladder.rungs]
    del records[0]["metrics"]["rung_index"]  # without its index: the grid's order, else the end
    assert [r.name for r in ladder_of(records).rungs][-1] == "new_trick"
    assert ladder_of(records[:1] + records[1:]).rungs[0].name == "baseline"


def test_the_headline_is_the_bf16_datasheet_and_an_fp8_rung_gets_its_fp8_columns():
    fp8 = {"mfu_datasheet_bf16": 0.6, "mfu_measured_bf16": 0.7, "mfu_datasheet_fp8": 0.3}
    records = [rung("baseline", 0, None, 100.0, mfu=BF16), rung("fp8_tensorwise", 1, "baseline", 50.0, mfu=fp8)]
    ladder = ladder_of(records)
    assert facts.yardsticks(ladder.rungs) == ["mfu_datasheet_bf16", "mfu_measured_bf16", "mfu_datasheet_fp8"]
    table = tables.sizes_table([ladder])
    assert table["MFU bf16 datasheet (%)"].iloc[0] == "60.0%" and table["MFU fp8 datasheet (%)"].iloc[0] == "30.0%"
    text = report.section(records, "h100", {})
    assert "FP8 rungs give MFU against the bf16 peak (bf16-equivalent" in text
    assert "FP8 rungs" not in report.section(records[:1], "h100", {})
    # no datasheet MFU (a CPU): the measured ceiling heads the text and the figure
    cpu = ladder_of([rung("baseline", 0, None, 100.0, mfu={"mfu_datasheet_bf16": None, "mfu_measured_bf16": 0.3})])
    head = facts.yardsticks(cpu.rungs)[0]
    assert head == "mfu_measured_bf16" and facts.YARDSTICKS[head] in figures.figure_title(cpu, head)


def test_fp8_is_set_beside_the_fastest_bf16_rung_without_fp8():
    def at(name, index, parent, ms, precision="bf16", fp8=None, batch=4, spread=1.0, **kw):
        config = {"precision": precision, "fp8": fp8, "batch_size": batch, "accumulation_steps": 1}
        interval = None if ms is None else (ms - spread, ms + spread)
        return rung(name, index, parent, ms, batch=batch, config=config, interval=interval, trials=3, **kw)

    records = [
        at("baseline", 0, None, 20.0, precision="fp32"),  # the most tokens/s, but not bf16
        at("bf16", 1, "baseline", 100.0),
        at("max_batch", 2, "bf16", 160.0, batch=8),
        at("fp8_tensorwise", 3, "max_batch", 128.0, fp8="tensorwise", batch=8),
        at("fp8_rowwise", 4, "max_batch", 150.0, fp8="rowwise", batch=8),
    ]
    (gain,) = facts.fp8_gains([ladder_of(records)])
    assert (gain.bf16.name, gain.fp8.name, gain.verdict) == ("max_batch", "fp8_tensorwise", "faster")
    # the same tokens per step in 128 ms against 160 ms; the interval from the ends of both
    assert gain.speedup.median == pytest.approx(160 / 128)
    assert (gain.speedup.low, gain.speedup.high) == (pytest.approx(159 / 129), pytest.approx(161 / 127))
    row = tables.fp8_table([gain], None)[0]
    assert (row["bf16 rung"], row["FP8 rung"], row["verdict"]) == ("`max_batch`", "`fp8_tensorwise`", "faster")
    text = report.section(records, "h100", {})
    assert "FP8 training (torchao float8) runs 1.25× the tokens/s of the fastest bf16 rung" in text
    assert "(faster in 1 of 1 ladder)" in text
    # within the noise of the bf16 rung it says so; with no FP8 rung that ran, no sentence and no table
    records[3:] = [at("fp8_tensorwise", 3, "max_batch", 158.0, fp8="tensorwise", batch=8, spread=8.0)]
    assert facts.fp8_gains([ladder_of(records)])[0].verdict == "within noise"
    records[3:] = [at("fp8_tensorwise", 3, "max_batch", None, fp8="tensorwise", batch=8, status="unsupported")]
    assert facts.fp8_gains([ladder_of(records)]) == [] and "FP8 training" not in report.section(records, "h100", {})


def test_the_answer_counts_largest_gains_and_names_the_longest_compile():
    def ladder(model, gain):
        fast = gain == "compile"
        return [
            rung("baseline", 0, None, 100.0, model=model),
            rung("compile", 1, "baseline", 50.0 if fast else 90.0, model=model, compile_s=7.5),
            rung("max_batch", 2, "compile", 170.0 if fast else 80.0, model=model, batch=8, compile_s=1.0),
        ]

    records = ladder("small", "compile") + ladder("medium", "compile") + ladder("large", "max_batch")
    records[4]["metrics"]["compile_s"] = 9.0  # medium's compile rung
    a = facts.answer_facts(facts.ladders_from(records), None)
    assert a.gains == (("compile", 2), ("max_batch", 1))
    assert (a.longest_compile.model, a.longest_compile.name, a.longest_compile.compile_s) == ("medium", "compile", 9.0)
    # compile is best where max_batch runs slower per token (2×); max_batch best in large (2.5×)
    assert a.slowest.speedup.median == pytest.approx(2.0) and a.fastest.model == "large" and a.ran == 3


def best_rung(attention: str = "sdpa_cudnn", **extra):
    metrics = dict(step_flops=FULL, step_flops_causal_half=HALF, parameter_count=10**9, datasheet_hbm_gbps=2000.0)
    return ladder_of([rung("compile", 0, None, 300.0, attention=attention, **metrics, **extra)]).best


def profile(best, class_ms: dict, idle_ms: float, window_ms: float, steps: int = 2) -> dict:
    m = {"rung": best.name, "config": best.config, "profiled_steps": steps, "window_ms": window_ms}
    m |= {"idle_ms": idle_ms, "busy_fraction": 1 - idle_ms / window_ms, "class_ms": class_ms}
    m["top_kernels"] = [{"name": "nvjet_x", "class": "matmul", "ms": 100.0, "share": 0.5}]
    return make_record("ladder_profile", {"model": best.model, "context_length": best.context_length}, "ok", m, PROV)


def test_the_profiled_step_splits_into_parts_that_add_up_in_the_sentence_too():
    best, classes = best_rung(), {"matmul": 400.0, "elementwise": 60.0, "optimizer": 30.0}
    p = bounds.Profile(profile(best, classes, 6.0, 496.0), best)
    assert p.parts == (("matmul", 200.0), ("elementwise", 30.0), ("optimizer", 15.0), ("idle", 3.0))
    # overlapping kernels count twice in the classes: the split says so, and still adds up
    p = bounds.Profile(profile(best, classes, 6.0, 490.0), best)
    assert p.parts[-1] == (bounds.OVERLAP, pytest.approx(-3.0)) and sum(v for _, v in p.parts) == pytest.approx(245.0)
    classes = {"matmul": 745.71, "elementwise": 119.91, "optimizer": 109.47, "other": 56.36, "memory": 2.43}
    text = report.profile_text(
        bounds.Profile(profile(best, classes, 19.76, sum(classes.values()) + 19.76, 3), best), []
    )
    step = number(re.search(rf"splits its {NUMBER} ms step into", text).group(1))
    parts = [number(x) for x in re.findall(rf"[a-z]+ {NUMBER}", re.search(r"step into (.*?) ms;", text).group(1))]
    assert len(parts) == len(classes) + 1 and round(sum(parts), 1) == step
    assert "counts the fused attention kernels among them" in text


@pytest.mark.parametrize(
    ("attention", "classes", "matmul", "attn"),
    [
        ("sdpa_cudnn", {"matmul": 400.0, "attention": 100.0}, 80e12 / 0.2 / 1e12, 10e12 / 0.05 / 1e12),
        ("sdpa_cudnn", {"matmul": 500.0}, 90e12 / 0.25 / 1e12, None),  # fused, not told apart: half counted
        ("plain", {"matmul": 500.0}, 100e12 / 0.25 / 1e12, None),  # the unfused attention computes every score
    ],
)
def test_matmul_rates_count_what_the_kernels_compute(attention, classes, matmul, attn):
    best = best_rung(attention)
    p = bounds.Profile(profile(best, classes, 0.0, sum(classes.values())), best)
    assert p.matmul_tflops == pytest.approx(matmul)
    assert p.attention_separate == (attn is not None) and p.attention_fused == (attention != "plain")
    assert (p.attention_tflops == pytest.approx(attn)) if attn else p.attention_tflops is None
    if attn:
        assert "the attention kernels take 50.0 ms at 200 TFLOP/s" in report.profile_text(p, [])


def test_the_step_with_its_matmuls_at_the_ceiling_is_what_the_other_parts_allow():
    best = best_rung(mfu={"mfu_datasheet_bf16": 0.3})
    # per step: matmul 200 ms at 90e12 FLOPs (fused attention counted half) = 450 TFLOP/s; 48 ms besides
    p = bounds.Profile(profile(best, {"matmul": 400.0, "elementwise": 60.0, "optimizer": 30.0}, 6.0, 496.0), best)
    fast = bounds.Ceiling("bf16", 600.0, 8192, 989.4)
    assert bounds.at_ceiling_ms(p, fast) == pytest.approx(48.0 + 200.0 * 450 / 600)  # 198 ms
    text = report.profile_text(p, [fast], "mfu_datasheet_bf16")
    assert (
        "the step would take 198.0 ms, 1.25× faster (37.6% of the bf16 datasheet peak against 30.0% measured)" in text
    )
    assert "the 48.0 ms outside the matmul kernels bound it" in text
    # matmuls already above a lower ceiling: no faster step is claimed, what lies outside them bounds it
    slow = bounds.Ceiling("bf16", 400.0, 8192, 989.4)
    text = report.profile_text(p, [slow], None)
    assert bounds.at_ceiling_ms(p, slow) is None and "would take" not in text
    assert "112.5% of the measured bf16 GEMM ceiling" in text
    assert "The matmul kernels run at or above that ceiling, which times square GEMMs only: the 48.0 ms outside" in text


def test_the_optimizer_floor_the_ceilings_and_a_profile_not_taken():
    best = best_rung()
    p = bounds.Profile(profile(best, {"matmul": 400.0, "optimizer": 40.0}, 0.0, 440.0), best)
    assert p.optimizer_floor_ms == pytest.approx(1e9 * 28 / 2000e9 * 1e3) and p.optimizer_ms == pytest.approx(20.0)
    cell = {"model": "small", "context_length": 1024}
    not_taken = bounds.Profile(make_record("ladder_profile", cell, "unsupported", {}, PROV, "no nsys"), best)
    assert not not_taken.ok and not_taken.reason == "no nsys"
    metrics = {"precisions": ["fp32", "bf16"], "fp32_tflops": 50.0, "fp32_best_n": 4096, "fp32_datasheet_tflops": 66.9}
    metrics |= {"bf16_tflops": 800.0, "bf16_best_n": 8192}
    fp32, bf16 = bounds.ceilings_from([make_record("gemm_peak", {"probe": "square_gemm"}, "ok", metrics, PROV)])
    assert (fp32.precision, fp32.tflops, fp32.best_n) == ("fp32", 50.0, 4096)
    assert fp32.share_of_datasheet == pytest.approx(50.0 / 66.9) and bf16.share_of_datasheet is None


def two_point_seven_b() -> list[dict]:
    return [
        rung("baseline", 0, None, None, model="2.7B", status="oom"),
        rung("sdpa_flash", 1, "baseline", 282.2, model="2.7B", mfu=BF16),
        rung("sdpa_cudnn", 2, "sdpa_flash", 276.1, model="2.7B", mfu=BF16),
        rung("flash", 3, "sdpa_cudnn", 286.3, model="2.7B", mfu=BF16),
        rung("compile", 4, "sdpa_cudnn", 201.4, model="2.7B", mfu=BF16),
        rung("max_batch", 5, "compile", 355.6, model="2.7B", batch=8, mfu=BF16),
    ]


def test_the_waterfall_sentence_reads_as_it_should_and_its_parts_add_up():
    text = report.waterfall_text(ladder_of(two_point_seven_b()), "h100")
    assert text == (
        "**2.7B, context 1024**: `sdpa_flash` at 68.9 µs per token to `max_batch` at 43.4 (1.59× the tokens/s): "
        "`sdpa_cudnn` saves 1.5 (within the noise), `compile` saves 18.2, `max_batch` saves 5.8; 25.5 µs per token "
        "in all. Off the best rung's path: `flash` (within the noise against `sdpa_cudnn`). Did not run: `baseline` (out of memory)."
    )
    start = number(re.search(rf"at {NUMBER} µs per token to", text).group(1))
    saved = [number(x) for x in re.findall(rf"saves {NUMBER}", text)]
    assert round(sum(saved), 1) == number(re.search(rf"; {NUMBER} µs per token in all", text).group(1))
    assert round(sum(saved), 1) == round(start - number(re.search(rf"`max_batch` at {NUMBER} ", text).group(1)), 1)


def test_main_writes_its_outputs_and_references_every_figure(tmp_path):
    paths, records = [], two_point_seven_b()
    for r in records:
        paths.append(str(tmp_path / "ladder" / f"{r['cell']['rung']}.json"))
        write_record(paths[-1], r)
    grid = {"models": ["small", "2.7B"], "context_lengths": [1024], "rungs": [r["cell"]["rung"] for r in records]}
    argv = ["--device", "h100", "--out", str(tmp_path / "out"), "--grid", json.dumps(grid), "--records", *paths]
    assert report.main(argv) == 0
    assert all((tmp_path / "out" / p).stat().st_size > 0 for p in report.outputs(grid))
    text = (tmp_path / "out" / "sections" / "speed_ladder.md").read_text()
    for figure in (tmp_path / "out" / "figures").glob("*.png"):
        assert f"](../../results/h100/figures/{figure.name})" in text, figure.name
    assert "[full table](../../results/h100/tables/ladder.csv)" in text
    assert "**small, context 1024**: no records" in text
    assert "\n\n\n" not in text and text.endswith("\n") and not text.endswith("\n\n")
    none = tmp_path / "none"
    assert report.main(["--device", "h200", "--out", str(none), "--grid", json.dumps(grid), "--records"]) == 0
    assert (none / "sections" / "speed_ladder.md").read_text() == "The speed ladder was not measured on `h200`.\n"


@pytest.mark.parametrize("kept", [True, None])
def test_the_method_says_the_keep_rule_only_for_records_that_followed_it(kept):
    # records written before the keep rule name no `kept`: their rungs built on the fastest rung before them
    extra = {} if kept is None else {"kept": kept}
    records = [rung("baseline", 0, None, 100.0, **extra), rung("bf16", 1, "baseline", 50.0, **extra)]
    text = report.method_text(facts.ladders_from(records), None, "h100")
    assert ("is kept when its first trial beats its parent's tokens/s by more than 3%" in text) == (kept is not None)
    assert ("builds on the fastest rung measured before it" in text) == (kept is None)
    # a sentence without data (no FP8 rung) leaves no gap before the next one
    assert "  " not in report.method_text(facts.ladders_from(records), "mfu_datasheet_bf16", "h100")


def test_the_waterfall_says_path_not_kept_and_its_legend_keeps_one_order(monkeypatch, tmp_path):
    # the best rung's first trial did not beat its parent beyond the margin (kept: False), as on the CPU's
    # tiny/32; an FP8 rung off the path, not kept, is still the parent its batch search named. The legend's
    # entries in COLORS' order, not a set's (which changes from one process to the next)
    records = [
        rung("baseline", 0, None, 100.0, kept=True),
        rung("bf16", 1, "baseline", 60.0, kept=True),
        rung("grad_accum", 2, "bf16", 50.0, kept=False),
        rung("fp8_rowwise", 3, "bf16", 62.0, kept=False),
        rung("fp8_max_batch", 4, "fp8_rowwise", None, status="oom", kept=False),
    ]
    ladder = ladder_of(records)
    assert ladder.best.name == "grad_accum" and ladder.best.kept is False
    shown = []
    monkeypatch.setattr(figures, "save", lambda fig, path: shown.append(fig.axes[0].get_legend().get_texts()))
    figures.waterfall(ladder, None, tmp_path / "w.png")
    labels = [t.get_text() for t in shown[0]]
    assert labels == [figures.LEGEND[k] for k in ("end", "saves", "off path")]  # none 'kept', as the records say
    assert "on the best rung's path: saves time over its parent" in labels and "ran, off that path" in labels
    text = report.waterfall_text(ladder, "h100")
    assert "Not built on" not in text and "Off the best rung's path: `fp8_rowwise` (within the noise" in text


def test_a_cpu_section_speaks_cpu_says_once_what_it_does_not_measure_and_drops_rungs_that_never_ran():
    mfu, cpu = {"mfu_measured_bf16": 0.2}, dict(ctx=32, device="cpu")
    records = [
        rung("baseline", 0, None, 20.0, mfu=mfu, model="tiny", **cpu),
        rung("tf32", 1, "baseline", None, status="unsupported", model="tiny", **cpu),
        rung("flash", 2, "baseline", None, status="unsupported", model="tiny", **cpu),
        rung("max_batch", 3, "baseline", None, status="oom", model="tiny", **cpu),
    ]
    text = report.section(records, "cpu", {})
    assert "timed around the whole step" in text and "synchronize" not in text and "Nsight" not in text
    assert text.count("Not measured on a CPU: `flash`, `tf32` (CUDA only)") == 1
    assert "cannot run here" not in report.waterfall_text(ladder_of(records), "cpu")
    assert "with a synchronize around the whole step" in report.section(records, "h100", {})
    # the table of every rung: no row for a rung that cannot run anywhere
    every = text[text.index("<summary>Every rung</summary>") :]
    assert "`tf32`" not in every and "`flash`" not in every and "n/a" not in every
    assert "`baseline` | 20.0 ms" in every and "| `max_batch` | OOM |" in every
    assert "; OOM: out of memory.\n" in every
    # a rung that cannot run in one model but ran in another keeps its row, n/a where it could not
    records.append(rung("baseline", 0, None, 40.0, mfu=mfu, model="mini", **cpu))
    records.append(rung("tf32", 1, "baseline", 30.0, mfu=mfu, model="mini", **cpu))
    ladders = facts.ladders_from(records)
    assert [r["rung"] for r in tables.pivot_table(ladders, 32, None)] == ["`baseline`", "`tf32`", "`max_batch`"]
    assert tables.pivot_table(ladders, 32, None)[1]["tiny"] == "n/a"
    assert "OOM: out of memory, n/a: cannot run here." in report.section(records, "cpu", {})


def test_a_wide_interval_is_marked_unstable_and_a_speedup_with_one_said_within_the_noise():
    wide = ladder_of([rung("baseline", 0, None, 100.0, interval=(80.0, 125.0), trials=5)])
    assert tables.est(wide.best.step_ms, unit=" ms") == "100 ms [80, 125] †"
    assert tables.est(ladder_of([rung("baseline", 0, None, 100.0)]).best.step_ms, unit=" ms") == "100 ms"  # one trial
    records = [
        rung("baseline", 0, None, 100.0, interval=(20.0, 500.0), trials=2, kept=True),
        rung("fused_adamw", 1, "baseline", 80.0, interval=(30.0, 200.0), trials=2, kept=True),
        rung("grad_accum", 2, "fused_adamw", 70.0, interval=(50.0, 100.0), trials=2, kept=False),
    ]
    ladder = ladder_of(records)
    assert ladder.speedup.unstable
    assert stats.compare(ladder.best.us_per_token, ladder.start.us_per_token) == "within noise"
    marked = tables.times(ladder.speedup, mark=True)
    assert marked.endswith(" †") and marked.startswith("1.43× [")
    assert tables.sizes_table([ladder])["speed-up"].iloc[0] == marked
    assert f"({marked} the tokens/s)" in report.waterfall_text(ladder, "h100")
    a = facts.answer_facts([ladder], None)
    text = report.answer_text(a, None)
    assert f"The best rung's speed-up is within the noise in small at context 1024 ({marked})." in text
    assert "largest single gain" not in text  # no step beats its parent beyond the noise
    assert f"runs {marked} (small/1024) the first rung's tokens/s, within the noise" in report.summary(a, None)
    # a tight interval: no mark, no noise sentence; the largest gain is the largest step beyond the noise
    tight = [
        rung(r["cell"]["rung"], i, r["metrics"]["parent"], ms, interval=(ms * 0.99, ms * 1.01), trials=3)
        for i, (r, ms) in enumerate(zip(records, (100.0, 60.0, 57.0)))
    ]
    a = facts.answer_facts([ladder_of(tight)], None)
    text = report.answer_text(a, None)
    assert "†" not in report.waterfall_text(ladder_of(tight), "h100") and "within the noise in" not in text
    assert "The largest single gain of a ladder is `fused_adamw` (in 1 ladder)." in text
