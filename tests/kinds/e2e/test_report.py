"""The e2e report's sections and files: what each template says on either side of its verdicts, the
host-bound marks in its tables, and a run of ``main`` on committed records that writes every declared
output and links every figure."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lmperf.core.stats import Estimate
from lmperf.kinds.e2e import facts as F
from lmperf.kinds.e2e import report
from tests.kinds.e2e.report_records import compile_job, compiled_pair, e2e

REPO = Path(__file__).resolve().parents[3]
GRID = {"warmup_steps": 5, "warmup_sweep": {"context_lengths": [256]}}


def test_host_bound_is_said_and_marked_from_a_measured_busy_share_only():
    unmeasured = report.section_benchmarking_script([e2e(cv=0.2), e2e(ctx=256, forward=11.0)], GRID, "h100")
    assert "| host-bound" not in unmeasured and ": host-bound" not in unmeasured  # no column, no claim
    busy = [e2e(busy=0.3), e2e(ctx=256, forward=20.0, busy=0.9)]
    measured = report.section_benchmarking_script(busy, GRID, "h100")
    assert "busy under 50% of the step in small/128 (30%): host-bound" in measured and "| host-bound" in measured
    assert [row["host-bound"] for row in report.timing_table(F.TimingFacts(busy, 5))] == ["host-bound", "no"]
    assert "none is host-bound" in report.section_benchmarking_script([e2e(busy=0.9)], GRID, "h100")
    pair = [e2e(busy=0.9, forward=30.0), e2e(precision="bf16", busy=0.2)]  # a pair marks which way is host-bound
    assert [r["host-bound"] for r in report.pair_table(F.PrecisionFacts(pair, 5).rows, ("fp32", "bf16"))] == ["bf16"]
    bf16 = report.section_mixed_precision(pair, GRID, "h100")
    assert "In small/128 the GPU is busy under 50% of the bf16 step" in bf16
    # a busy share's interval stays within 0 and 100%
    assert report.share(Estimate(0.68, 0.26, 1.74, 2, "t")) == "68% [26%, 100%]"  # two trials' t interval passes 100%
    assert report.share(Estimate(0.38, 0.35, 0.41, 3, "t")) == "38% [35%, 41%]" and report.share(None) == "—"


def test_times_carry_their_interval_and_unstable_ones_a_mark():
    tight = report.section_benchmarking_script([e2e(width=0.01)], GRID, "h100")
    # ± a trial's std over its steps (the builder's samples have CV 1%), the median over trials
    assert "| 10.0 [9.9, 10.1] ± 0.10 | 20.0 [19.8, 20.2] ± 0.20 | 1.0% |" in tight and "†" not in tight
    assert "median over up to 3 trials" in tight and "(ms, mean ± std)" in tight
    wide = report.section_benchmarking_script([e2e(width=0.2)], GRID, "h100")
    assert "† unstable: its 95% interval is wider than 10% of its median." in wide
    single = report.section_benchmarking_script([e2e()], GRID, "h100")
    assert "| 10.0 ± 0.10 | 20.0 ± 0.20 | 1.0% |" in single and "Each cell is one trial" in single
    # a GPU-bound cell whose two trials agreed stopped there (lmperf.core.trials), and the text says so
    at_two = e2e(ctx=256, width=0.01, busy=0.95, metrics={"fewer_trials_because": "gpu_bound"})
    stopped = report.section_benchmarking_script([e2e(width=0.01), at_two], GRID, "h100")
    assert "1 cell of the grid stopped at two trials: the GPU was busy at least 90% of the step in both" in stopped
    assert "stopped at two" not in tight


def test_variability_names_the_cells_at_or_over_the_threshold_and_says_whose_cv_it_is():
    quiet = report.section_benchmarking_script([e2e(cv=0.01), e2e(ctx=256, cv=0.02)], GRID, "h100")
    assert "(± std and CV, std/mean: a trial's, the median over its trials) is under 5%." in quiet
    noisy = report.section_benchmarking_script([e2e(cv=0.08), e2e(ctx=256, cv=0.02)], GRID, "h100")
    assert "the median over its trials) is 5% or more in 1 of 2 cells: small/128 (8.0%)." in noisy
    everywhere = report.section_benchmarking_script([e2e(cv=0.08)], GRID, "h100")  # not 'under 5% in 0 of 1'
    assert "is 5% or more in 1 of 1 cell: small/128 (8.0%)." in everywhere


def test_warmup_verdicts_only_beyond_the_noise():
    def text(width):
        records = [e2e(ctx=256, warmup=w, forward=ms, width=width) for w, ms in ((5, 10.0), (0, 15.0), (1, 12.0))]
        return report.section_benchmarking_script(records, GRID, "h100")

    tight, wide = text(0.01), text(0.3)
    assert "beyond the noise for 1 of 1 size." in tight and "in none of 1 cell; small after 1 is slower." in tight
    assert "beyond the noise for none of 1 size." in wide and "within the noise of 5's in 1 of 1 cell." in wide


def test_the_default_warmup_comes_from_the_grid_and_cpu_runs_speak_cpu():
    records = [e2e(warmup=2, forward=10.0, device="cpu"), e2e(warmup=5, forward=50.0, device="cpu")]
    two, five = (report.section_benchmarking_script(records, {"warmup_steps": w}, "cpu") for w in (2, 5))
    assert "a forward takes 10.0 ms" in two and "a forward takes 50.0 ms" in five
    assert "torch.cuda.synchronize()" not in two and "host-bound" not in two and "cudaMalloc" not in two
    assert "Not measured here" in report.section_timer_check(records, GRID, "cpu")
    bf16 = report.section_mixed_precision([*records, e2e(warmup=5, precision="bf16", device="cpu")], GRID, "cpu")
    assert "not the fast path it is on a GPU" in bf16


def test_bf16_speedups_are_stated_only_beyond_the_noise():
    def text(width):
        pairs = [(m, p, ms) for m in ("small", "xl") for p, ms in (("fp32", 30.0), ("bf16", 20.0))]
        records = [e2e(m, precision=p, forward=ms, width=width) for m, p, ms in pairs]
        return report.section_mixed_precision(records, GRID, "h100")

    assert "faster beyond the noise in 2 of 2 cells (1.49×)." in text(0.01) and "From small on bf16" in text(0.01)
    wide = text(0.3)
    assert (
        "bf16 autocast makes the training step within the noise in 2 of 2 cells (small/128 and xl/128) (1.49×)." in wide
    )

    def counts(bf16_ms: dict[str, float]) -> str:  # the first verdict met leads, out of the cells
        runs = [(m, p, ms) for m, bf16 in bf16_ms.items() for p, ms in (("fp32", 30.0), ("bf16", bf16))]
        records = [e2e(m, precision=p, forward=ms, width=0.01) for m, p, ms in runs]
        return report.verdict_counts(F.PrecisionFacts(records, 5).rows, "step")

    assert counts({"small": 20.0, "medium": 40.0}).startswith("faster beyond the noise in 1 of 2 cells, slower in 1 (")
    assert counts({"small": 40.0}).startswith("slower beyond the noise in 1 of 1 cell (small/128) (0.")
    assert re.search(r"\| small +\| 1\.49× \[0\.80, 2\.77\] † ≈ +\|", wide)  # the pivot: † unstable, ≈ same


def test_torch_compile_b_names_compile_times_and_what_was_not_compiled_or_ran_out_of_memory():
    records = compiled_pair("small", 128, 20.0, 10.0) + compiled_pair("small", 256, 30.0, 20.0) + [e2e("small", 512)]
    records += compiled_pair("xl", 1024, 100.0, 90.0, training="oom") + [e2e("medium", 128)]  # medium: eager only
    jobs = [compile_job("small", 128, 11.0, 2.0), compile_job("small", 256, 12.5, 2.5)]
    text = report.section_compile(records + jobs, GRID, "h100")
    assert "the final norm's took 11.0 s–12.5 s per cell" in text and "3 of 3 records count cache hits" in text
    assert "faster beyond the noise in 2 of 2 cells" in text
    assert "Not compiled (eager only): small/512 and medium/128." in text
    assert "xl/1024 run out of memory for a compiled training step, as eager does." in text
    assert "Compilation happens in the warm-up steps" in report.section_compile(records, GRID, "h100")
    # how many the compile job compiled, and how many at once as its records say (nothing where they do not)
    assert "in a job of its own that compiled 2 cells (records" in text and "several" not in text

    def job_text(*at_once: int) -> str:
        for job, n in zip(jobs, at_once):
            job["metrics"]["concurrent_compiles"] = n
        return report.section_compile(records + jobs[: len(at_once)], GRID, "h100")

    assert "compiled 2 cells, up to 2 at once (records" in job_text(1, 2)
    assert "compiled 2 cells, one at a time (records" in job_text(1, 1)
    assert "compiled 1 cell (records" in job_text(1)


def test_timer_check_golden_text():
    events = [20.0, 40.0]
    metrics = {f"{p}_event_ms_samples": events for p in F.TIMER_PHASES}
    metrics.update({f"{p}_ms_samples": [e * 1.001 for e in events] for p in F.TIMER_PHASES})
    metrics["forward_ms_samples"] = [e * 1.03 for e in events]
    text = report.section_timer_check([e2e(metrics=metrics)], GRID, "h100")
    assert text.split("\n\n")[1] == (
        "The step timer does not always agree with CUDA events: over 8 phase samples longer than 10 ms in 1 of the 1 "
        "cells of the course's model, the median deviation (timer / events − 1) is 0.10% and the worst 3.00% (small, "
        "ctx 128, fp32, eager, w=5, forward); 6 of them are within 2%."
    )


def test_attention_in_the_model_has_no_blank_peak_columns_on_a_cpu():
    def rows(device, peak):
        metrics = {"training_peak_allocated_mib": peak} if peak else {}
        pairs = (("plain", 30.0), ("sdpa", 24.0))
        return [e2e(ctx=32, forward=f, device=device, attention=a, metrics=metrics) for a, f in pairs]

    cpu = report.section_attention_in_model(rows("cpu", None), GRID, "cpu")
    assert "peak" not in next(line for line in cpu.splitlines() if line.startswith("| model"))
    assert "tiled PyTorch version on a CPU" in cpu and "faster beyond the noise in 1 of 1 cell (1.25×)" in cpu
    assert "at 1.00× its peak memory" in report.section_attention_in_model(rows("h100", 1000.0), GRID, "h100")


def _run(tmp_path: Path, device: str, paths: list[Path], grid: dict) -> dict[str, str]:
    """``main`` into tmp_path/results/<device>: every declared output written, the sections' texts."""
    out = tmp_path / "results" / device
    args = ["--device", device, "--out", str(out), "--grid", json.dumps(grid), "--records", *map(str, paths)]
    assert report.main(args) == 0
    written = {p.relative_to(out).as_posix() for p in out.glob("*/*.*") if p.parent.name != "sections"}
    assert written == set(report.outputs(grid))
    return {name: (out / "sections" / f"{name}.md").read_text() for name in report.SECTIONS}


def test_main_writes_every_output_says_not_measured_without_records_and_links_every_figure(tmp_path):
    assert set(_run(tmp_path, "h200", [], {}).values()) == {report.NOT_MEASURED}
    patterns = ("e2e/small_*", "e2e_compile/small_*")  # no out-of-memory cell among them
    paths = [p for pattern in patterns for p in sorted((REPO / "results/h100").glob(pattern))]
    if not paths:
        pytest.skip("no committed h100 e2e records")
    sections = _run(tmp_path, "h100", paths, GRID)
    text = "\n".join(sections.values())
    assert report.NOT_MEASURED not in text and "\n\n\n" not in text
    for link in re.findall(r"\]\((\.\./\.\./results/[^)]+)\)", text):  # relative to report/h100/answers.md
        assert (tmp_path / "report" / "h100" / link).resolve().is_file(), link
    assert len(re.findall(r"!\[", text)) == len(report.FIGURES)
