"""The e2e report's sections and files: what each template says on either side of its verdicts, the
slips it must not make (issue 52: torch_compile (b) compiles block by block), and a run of ``main`` on
committed records that writes every declared output and references every figure."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lmperf.kinds.e2e import facts as F
from lmperf.kinds.e2e import report
from tests.kinds.e2e.report_records import compile_job, compiled_pair, e2e

REPO = Path(__file__).resolve().parents[3]
GRID = {"warmup_steps": 5, "warmup_sweep": {"context_lengths": [256]}}


def test_the_report_imports_no_torch():
    code = "import sys, lmperf.kinds.e2e.report\nraise SystemExit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# -- benchmarking_script --------------------------------------------------------------------------


def test_host_bound_is_said_from_a_measured_busy_share_and_never_guessed():
    noisy = [e2e(cv=0.2), e2e(ctx=256, forward=11.0)]  # a context doubling that barely grows the time
    unmeasured = report.section_benchmarking_script(noisy, GRID, "h100")
    assert "do not measure how busy the GPU was" in unmeasured and "host-bound, their" not in unmeasured
    busy = [e2e(cv=0.2, busy=0.3), e2e(ctx=256, forward=20.0, busy=0.9)]
    measured = report.section_benchmarking_script(busy, GRID, "h100")
    assert "busy under 50% of the step in small/128 (30%): host-bound" in measured
    assert "| GPU busy" in measured
    quiet = report.section_benchmarking_script([e2e(busy=0.9)], GRID, "h100")
    assert "none is host-bound" in quiet and "Variability is low everywhere" in quiet


def test_times_carry_their_interval_and_unstable_ones_a_mark():
    tight = report.section_benchmarking_script([e2e(width=0.01)], GRID, "h100")
    assert "10.0 [9.90, 10.1] ± 0.10" in tight and "median over up to 3 trials" in tight and "†" not in tight
    wide = report.section_benchmarking_script([e2e(width=0.2)], GRID, "h100")
    assert "†" in wide and "† unstable: the 95% interval over trials is wider than 10% of the median." in wide
    single = report.section_benchmarking_script([e2e()], GRID, "h100")
    assert "10.0 ± 0.10" in single and "Each cell is one trial" in single


def test_warmup_verdicts_only_beyond_the_noise():
    def text(width):
        records = [
            e2e(ctx=256, forward=10.0, width=width),
            e2e(ctx=256, warmup=0, forward=15.0, width=width),
            e2e(ctx=256, warmup=1, forward=12.0, width=width),
        ]
        return report.section_benchmarking_script(records, GRID, "h100")

    tight = text(0.01)
    assert "slower than with 5 warm-up steps beyond the noise for all 1 sizes" in tight
    assert "within the noise of 5's in 0 of 1 cells; small after 1 is slower" in tight
    wide = text(0.3)
    assert "beyond the noise for 0 of 1 sizes" in wide and "within the noise of 5's in 1 of 1 cells." in wide


def test_the_default_warmup_comes_from_the_grid():
    records = [e2e(warmup=2, forward=10.0), e2e(warmup=5, forward=50.0)]
    assert "a forward takes 10.0 ms" in report.section_benchmarking_script(records, {"warmup_steps": 2}, "h100")
    assert "a forward takes 50.0 ms" in report.section_benchmarking_script(records, {"warmup_steps": 5}, "h100")


def test_a_cpu_run_is_described_in_cpu_words():
    records = [e2e(device="cpu"), e2e(precision="bf16", forward=30.0, device="cpu")]
    text = report.section_benchmarking_script(records, GRID, "cpu")
    assert "torch.cuda.synchronize()" not in text and "on the CPU (nothing to synchronize" in text
    assert "busy" not in text and "cudaMalloc" not in text
    assert len(report.section_timer_check(records, "cpu").strip().split("\n\n")) == 2  # heading and one line
    bf16 = report.section_mixed_precision(records, GRID, "cpu")
    assert "not the fast path it is on a GPU" in bf16 and "tensor core" not in bf16


# -- benchmarking_mixed_precision (c) ---------------------------------------------------------------


def test_bf16_speedups_are_stated_only_beyond_the_noise():
    def text(width):
        records = []
        for model in ("small", "xl"):
            records += [e2e(model, forward=30.0, width=width), e2e(model, precision="bf16", forward=20.0, width=width)]
        return report.section_mixed_precision(records, GRID, "h100")

    assert "faster beyond the noise in 2 of 2 cells." in text(0.01) and "from small on bf16 is faster" in text(0.01)
    wide = text(0.3)
    assert "faster beyond the noise in 0 of 2 cells, within the noise in 2 (small/128 and xl/128)" in wide
    assert re.search(r"\| small +\| 1\.49× \[0\.80, 2\.77\] † ≈ +\|", wide)  # the pivot's cell: † unstable, ≈ same
    assert "does not grow with size beyond the noise" in wide


# -- torch_compile (b) ------------------------------------------------------------------------------


def _compiled(scope: str | None) -> list[dict]:
    records = compiled_pair("small", 128, 20.0, 10.0) + compiled_pair("small", 256, 30.0, 20.0)
    for r in records:
        if scope is None:
            r["provenance"]["settings"].pop("compile_scope", None)
    return records + [compile_job("small", 128, 11.0, 2.0, 0, 20), compile_job("small", 256, 12.5, 2.5, 5, 20)]


def test_torch_compile_b_says_block_by_block_and_names_per_block_compile_times():
    text = report.section_compile(_compiled("blocks"), GRID, "h100")
    head = text.splitlines()[0]
    assert head == "### (b) The model under `torch.compile`, block by block" and "whole model" not in text
    assert "each Transformer block and of the final norm" in text
    assert "compiling one block's graph (all blocks share it) and the final norm's took 11.0 s–12.5 s" in text
    assert "faster beyond the noise in 2 of 2 cells" in text and "2 of 2 records count cache hits" in text
    whole = report.section_compile(_compiled(None), GRID, "h100")
    assert whole.startswith("### (b) The whole model under `torch.compile`") and "the whole model's graphs" in whole
    mixed = _compiled("blocks")
    mixed[1]["provenance"]["settings"].pop("compile_scope")
    assert "differ in how they compiled: 1 block by block, 1 as one graph." in report.section_compile(
        mixed, GRID, "h100"
    )


def test_torch_compile_b_names_what_was_not_compiled_or_ran_out_of_memory():
    records = compiled_pair("small", 128, 20.0, 10.0) + [e2e("small", 512)]
    records += compiled_pair("xl", 1024, 100.0, 90.0, training="oom")
    text = report.section_compile(records, GRID, "h100")
    assert "Not compiled at context 512 (eager only)." in text
    assert "xl/1024 run out of memory for a compiled training step, as eager does." in text
    assert "Compilation happens in the warm-up steps" in text  # no compile job's records


# -- timer_check (the one golden text of this report) ----------------------------------------------


def test_timer_check_golden_text():
    events = [20.0, 40.0]
    metrics = {f"{p}_event_ms_samples": events for p in F.TIMER_PHASES}
    metrics.update({f"{p}_ms_samples": [e * 1.001 for e in events] for p in F.TIMER_PHASES})
    metrics["forward_ms_samples"] = [e * 1.002 for e in events]
    text = report.section_timer_check([e2e(metrics=metrics)], "h100")
    assert text.split("\n\n")[1] == (
        "The step timer agrees with CUDA events: over 8 phase samples longer than 10 ms in 1 of the 1 cells of "
        "the course's model, the median deviation (timer / events − 1) is 0.10% and the worst 0.20% (small, ctx "
        "128, fp32, eager, w=5, forward). Every (cell, phase) series stays within 2%."
    )


# -- main: every declared output, every section, every figure referenced -----------------------------


def _run(tmp_path: Path, device: str, paths: list[Path], grid: dict) -> Path:
    out = tmp_path / "results" / device
    args = ["--device", device, "--out", str(out), "--grid", json.dumps(grid), "--records", *map(str, paths)]
    assert report.main(args) == 0
    return out


def _check_outputs(out: Path, grid: dict) -> dict[str, str]:
    """Every declared output and every section is written; the sections' texts."""
    for path in report.outputs(grid):
        assert (out / path).is_file(), path
    assert {p.relative_to(out).as_posix() for p in out.glob("*/*.*") if p.parent.name != "sections"} == set(
        report.outputs(grid)
    )
    return {name: (out / "sections" / f"{name}.md").read_text() for name in report.SECTIONS}


def test_main_on_committed_records_writes_every_output_and_references_every_figure(tmp_path):
    e2e_dir = REPO / "results" / "h100" / "e2e"
    paths = sorted(e2e_dir.glob("small_*.json")) + sorted(e2e_dir.glob("xl_ctx1024_*.json"))
    paths += sorted((REPO / "results" / "h100" / "e2e_compile").glob("small_*.json"))
    if not paths:
        pytest.skip("no committed h100 e2e records")
    grid = {"warmup_steps": 5, "warmup_sweep": {"context_lengths": [256]}}
    out = _run(tmp_path, "h100", paths, grid)
    sections = _check_outputs(out, grid)
    text = "\n".join(sections.values())
    for figure in (out / "figures").iterdir():
        assert f"](../../results/h100/figures/{figure.name})" in text, figure.name
    assert all(report.NOT_MEASURED not in text and "\n\n\n" not in text for text in sections.values())
    # the variability sentence cites the table's CVs: each noisy cell's larger of its two
    script = sections["benchmarking_script"]
    table = [line.split("|")[1:-1] for line in script.split("### (c)")[0].splitlines() if line.startswith("| ")]
    cvs = {f"{row[0].strip()}/{row[2].strip()}": row[5:7] for row in table[1:]}
    cited = re.findall(r"([\w.]+/\d+) \(([\d.]+)%\)", script.split("high in ")[1].split("\n")[0])
    assert cited
    for cell, cv in cited:
        assert float(cv) == max(float(c.strip().rstrip("%")) for c in cvs[cell])
    for link in re.findall(r"\]\((\.\./\.\./results/[^)]+)\)", "\n".join(sections.values())):
        # links are relative to report/h100/answers.md
        assert (tmp_path / "report" / "h100" / link).resolve() == (tmp_path / link.removeprefix("../../")).resolve()
        assert (tmp_path / link.removeprefix("../../")).is_file(), link


def test_main_without_records_writes_every_output_and_says_not_measured(tmp_path):
    out = _run(tmp_path, "h200", [], {})
    sections = _check_outputs(out, {})
    assert set(sections.values()) == {report.NOT_MEASURED}


def test_attention_in_the_model_has_no_blank_peak_columns_on_a_cpu():
    def rows(device, peak):
        metrics = {"training_peak_allocated_mib": peak} if peak else {}
        return [
            e2e(ctx=32, forward=30.0, device=device, metrics=metrics),
            e2e(ctx=32, forward=24.0, device=device, attention="sdpa", metrics=metrics),
        ]

    cpu = report.section_attention_in_model(rows("cpu", None), "cpu")
    header = next(line for line in cpu.splitlines() if line.startswith("| model"))
    assert "peak" not in header and "speed-up over plain" in header and "tiled PyTorch version on a CPU" in cpu
    gpu = report.section_attention_in_model(rows("h100", 1000.0), "h100")
    assert "| training peak (MiB)" in gpu and "at 1.00× its peak memory" in gpu
