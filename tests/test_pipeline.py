"""The CPU pipeline end to end in a temporary copy, and which jobs a change reruns.

The copy holds the Snakefile, config, workflow/ and src/ (the rules hash src/ to version each
kind's code); cells run the installed lmperf package.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lmperf.record import load_record

TINY_CPU_GRID = {
    "e2e": {
        "batch_size": 2, "vocab_size": 10000, "warmup_steps": 1, "measured_steps": 2,
        "main": {"models": ["tiny"], "context_lengths": [16], "precisions": ["fp32", "bf16"]},
        "warmup_sweep": {"models": ["tiny"], "context_lengths": [16], "precisions": ["fp32"], "warmup_steps": [0]},
        "attention_compare": {"models": ["tiny"], "context_lengths": [16], "precisions": ["fp32"],
                              "attentions": ["plain", "flash"]},
    },
}


def snakemake(workdir: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args], cwd=workdir,
                            capture_output=True, text=True, timeout=timeout)
    return result


def job_counts(dry_run_output: str) -> dict[str, int]:
    """{'rule': n} from the 'Job stats' table of a dry run."""
    block = dry_run_output.split("Job stats:")[1].split("\n\n")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", block, re.M) if m.group(1) != "total"}


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, request):
    repo = Path(request.config.rootpath)
    work = tmp_path_factory.mktemp("pipeline")
    for name in ("Snakefile", "workflow", "src", "envs"):
        src = repo / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, work / name)
    config = yaml.safe_load((repo / "config.yaml").read_text())
    config["device"] = "cpu"
    # only the e2e kind in the copy: the other kinds are tested in their own files
    config["grids"]["cpu"] = TINY_CPU_GRID
    (work / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    result = snakemake(work, "all")
    assert result.returncode == 0, result.stdout + result.stderr
    return work


def test_pipeline_writes_records_tables_figures_and_report(pipeline):
    records = sorted((pipeline / "results/cpu/e2e").glob("*.json"))
    names = {p.name for p in records}
    assert names >= {"tiny_ctx16_fp32_eager_w1.json", "tiny_ctx16_bf16_eager_w1.json", "tiny_ctx16_fp32_eager_w0.json"}
    assert all(load_record(p)["status"] == "ok" for p in records)
    assert (pipeline / "results/cpu/tables/e2e.csv").read_text().count("\n") == len(records) + 1
    for fig in ("phase_times", "precision_speedup", "warmup", "compile"):
        assert (pipeline / f"results/cpu/figures/e2e_{fig}.png").stat().st_size > 1000
    answers = (pipeline / "report/cpu/answers.md").read_text()
    assert not (pipeline / "report/answers.md").exists()  # a CPU run leaves the GPU report alone
    # figures linked from report/cpu/ (two folders down) resolve
    links = re.findall(r"\]\((\.\./\.\./results/[^)]+)\)", answers)
    assert links and all((pipeline / "report/cpu" / link).resolve().exists() for link in links)
    assert "## benchmarking_script" in answers and "Backward takes" in answers
    fwd = load_record(pipeline / "results/cpu/e2e/tiny_ctx16_fp32_eager_w1.json")["metrics"]["forward_ms_mean"]
    # the table shows the record's number
    assert f"{fwd:.2f} ±" in answers
    # the whole model with our flash attention, beside plain's cell of the same coordinates
    flash = load_record(pipeline / "results/cpu/e2e/tiny_ctx16_fp32_eager_w1_flash.json")
    assert flash["status"] == "ok" and flash["provenance"]["settings"]["attention"] == "flash"
    assert "### In the whole model" in answers and "With `flash` a training step takes" in answers


def test_nothing_to_do_after_a_complete_run(pipeline):
    result = snakemake(pipeline, "-n", "all")
    assert result.returncode == 0
    assert "Nothing to be done" in result.stdout + result.stderr


def jobs_after_edit(pipeline: Path, relative_path: str, edit) -> dict[str, int]:
    """Apply ``edit`` to a file of the copy, count the jobs a dry run plans, restore the file."""
    path = pipeline / relative_path
    original = path.read_text()
    path.write_text(edit(original))
    try:
        result = snakemake(pipeline, "-n", "all", "--quiet", "rules")
    finally:
        path.write_text(original)
    assert result.returncode == 0, result.stdout + result.stderr
    return job_counts(result.stdout)


def test_a_new_grid_value_runs_only_its_cells_and_the_aggregates(pipeline):
    def add_context_length(text):
        config = yaml.safe_load(text)
        config["grids"]["cpu"]["e2e"]["main"]["context_lengths"].append(24)
        return yaml.safe_dump(config, sort_keys=False)

    # two new cells (fp32, bf16 at context 24), then the aggregates
    assert jobs_after_edit(pipeline, "config.yaml", add_context_length) == {
        "e2e_cell": 2, "e2e_report": 1, "answers": 1, "all": 1}


def test_editing_report_code_reruns_only_the_report(pipeline):
    assert jobs_after_edit(pipeline, "src/lmperf/report/answers.py", lambda text: text + "\n# an edit\n") == {
        "answers": 1, "all": 1}


def test_editing_cell_code_reruns_its_cells(pipeline):
    assert jobs_after_edit(pipeline, "src/lmperf/cells/e2e.py", lambda text: text + "\n# an edit\n") == {
        "e2e_cell": 3, "e2e_attention_cell": 1, "e2e_report": 1, "answers": 1, "all": 1}


def test_editing_the_flash_kernels_reruns_only_the_cells_that_use_them(pipeline):
    # plain's e2e cells do not run the flash code: only the flash attention cell reruns
    assert jobs_after_edit(pipeline, "src/lmperf/flash/triton_forward.py", lambda text: text + "\n# an edit\n") == {
        "e2e_attention_cell": 1, "e2e_report": 1, "answers": 1, "all": 1}


def test_html_report_builds_and_carries_the_same_sections(pipeline):
    """`snakemake --report` (README's command; needs pygments) packs the written answers with every section."""
    import zipfile

    result = snakemake(pipeline, "--report", "report.zip")
    assert result.returncode == 0, result.stdout + result.stderr
    answers = (pipeline / "report" / "cpu" / "answers.md").read_text()
    headings = [line for line in answers.splitlines() if line.startswith("## ")]
    assert len(headings) > 10
    with zipfile.ZipFile(pipeline / "report.zip") as z:
        packed = [n for n in z.namelist() if n.endswith("/answers.md")]
        assert packed, z.namelist()[:20]
        text = z.read(packed[0]).decode()
    assert [line for line in text.splitlines() if line.startswith("## ")] == headings
    html = snakemake(pipeline, "--report", "report.html")
    assert html.returncode == 0, html.stdout + html.stderr
    assert (pipeline / "report.html").stat().st_size > 0
