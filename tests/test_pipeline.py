"""The CPU pipeline end to end in a temporary copy, and exactly which jobs a change reruns.

One real run of a tiny grid (e2e and precision cells) in a copy of the repository, then dry runs
(`snakemake -n`) in it and in "fresh clones" of it (copies without .snakemake/ whose file times
are shuffled, as a checkout leaves them), counting the planned jobs by rule. The copy holds the
Snakefile, config, workflow/, profiles and src/ (the rules version each job's code from the
copy's src/); cells run the lmperf on PYTHONPATH.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lmperf.core import fingerprint as code_version
from lmperf.core import run_log
from lmperf.core.record import load_record

TINY_CPU_GRID = {
    "e2e": {
        "batch_size": 2,
        "vocab_size": 10000,
        "warmup_steps": 1,
        "measured_steps": 2,
        "main": {"models": ["tiny"], "context_lengths": [16], "precisions": ["fp32", "bf16"]},
        "warmup_sweep": {"models": ["tiny"], "context_lengths": [16], "precisions": ["fp32"], "warmup_steps": [0]},
        # torch_compile (b): the compile job (e2e_compile) compiles it cold, the measured cell loads it
        "compile": {"models": ["tiny"], "context_lengths": [16], "precisions": ["fp32"]},
        "attention_compare": {
            "models": ["tiny"],
            "context_lengths": [16],
            "precisions": ["fp32"],
            "attentions": ["plain", "flash"],
        },
    },
    # a kind whose code does not import lmperf.nvtx (see test_an_nvtx_edit_reruns_exactly_its_cells)
    "precision": {"layer_norm": {"width": 64, "rows": 2}},
    # one job per implementation; only `flash` runs our kernels (test_a_flash_kernel_edit_...)
    "attention": {
        "implementations": ["plain", "flash"],
        "head_dims": [16],
        "sequence_lengths": [32],
        "batch_size": 2,
        "precision": "fp32",
        "warmup_passes": 1,
        "measured_passes": 2,
        "min_measured_passes": 2,
        "max_phase_seconds": 1.0,
        "full_passes_up_to": 0,
        "max_warmup_seconds": 0.5,
        "compile_dynamic": True,
    },
}
E2E_RECORDS = [
    "tiny_ctx16_fp32_eager_w1",
    "tiny_ctx16_bf16_eager_w1",
    "tiny_ctx16_fp32_eager_w0",
    "tiny_ctx16_fp32_eager_w1_flash",
    "tiny_ctx16_fp32_compiled_w1",
]
RERUN_HINT = "delete it and rerun `snakemake --cores 1 all` to re-measure"


def snakemake(workdir: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def job_counts(dry_run_output: str) -> dict[str, int]:
    """{'rule': n} from the 'Job stats' table of a dry run ({} when there is nothing to do)."""
    if "Nothing to be done" in dry_run_output:
        return {}
    block = dry_run_output.split("Job stats:")[1].split("\n\n")[0]
    return {
        m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", block, re.M) if m.group(1) != "total"
    }


def plan(workdir: Path, *args: str) -> dict[str, int]:
    result = snakemake(workdir, "-n", "all", "--quiet", "rules", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return job_counts(result.stdout)


def copy_repo(repo: Path, work: Path) -> Path:
    for name in ("Snakefile", "workflow", "src", "envs", "config.yaml"):
        src = repo / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, work / name)
    os.symlink("workflow/profiles", work / "profiles")  # the auto-loaded default profile
    return work


def fresh_clone(done: Path, dst: Path) -> Path:
    """What `git clone` of a repository holding these results gives: no .snakemake/ or logs/, and
    file times in checkout order (here shuffled: records may be newer than the tables)."""
    shutil.copytree(done, dst, symlinks=True, ignore=shutil.ignore_patterns(".snakemake", "logs", "__pycache__"))
    files = [p for p in dst.rglob("*") if p.is_file() and not p.is_symlink()]
    random.Random(0).shuffle(files)
    start = time.time() - 3600  # in the past, as a checkout's
    for i, path in enumerate(files):
        os.utime(path, (start + i, start + i))
    return dst


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, request):
    work = copy_repo(Path(request.config.rootpath), tmp_path_factory.mktemp("pipeline"))
    config = yaml.safe_load((work / "config.yaml").read_text())
    config["device"] = "cpu"
    config["grids"]["cpu"] = TINY_CPU_GRID
    (work / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    result = snakemake(work, "all")
    assert result.returncode == 0, result.stdout + result.stderr
    return work


@pytest.fixture
def clone(pipeline, tmp_path):
    return fresh_clone(pipeline, tmp_path / "clone")


def edited(path: Path, edit):
    """Context: ``edit`` applied to a file, restored afterwards."""

    class _Edit:
        def __enter__(self):
            self.original = path.read_text()
            path.write_text(edit(self.original))

        def __exit__(self, *exc):
            path.write_text(self.original)

    return _Edit()


def test_pipeline_writes_records_tables_figures_and_report(pipeline):
    records = sorted((pipeline / "results/cpu/e2e").glob("*.json"))
    assert sorted(p.stem for p in records) == sorted(E2E_RECORDS)
    assert all(load_record(p)["status"] == "ok" for p in records)
    # each record keeps the version of the code it was measured with, computed from the copy's src/:
    # the cell with our flash kernels as its attention covers them too, the others do not
    src = pipeline / "src" / "lmperf"
    plain, flash = (code_version.code_version("lmperf.kinds.e2e.cell", src, c) for c in ((), ("lmperf.kernels.flash",)))
    assert plain != flash
    assert {p.stem: load_record(p)["provenance"]["code_version"] for p in records} == {
        stem: flash if stem.endswith("_flash") else plain for stem in E2E_RECORDS
    }
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in records)
    assert (pipeline / "results/cpu/tables/e2e.csv").read_text().count("\n") == len(records) + 1
    for fig in ("phase_times", "precision_speedup", "warmup", "compile"):
        assert (pipeline / f"results/cpu/figures/e2e_{fig}.png").stat().st_size > 1000
    answers = (pipeline / "report/cpu/answers.md").read_text()
    assert not (pipeline / "report/answers.md").exists()  # a CPU run leaves the GPU front page alone
    # figures linked from report/cpu/ (two folders down) resolve
    links = re.findall(r"\]\((\.\./\.\./results/[^)]+)\)", answers)
    assert links and all((pipeline / "report/cpu" / link).resolve().exists() for link in links)
    assert "## benchmarking_script" in answers and "Backward takes" in answers
    fwd = load_record(pipeline / "results/cpu/e2e/tiny_ctx16_fp32_eager_w1.json")["metrics"]["forward_ms_mean"]
    assert f"{fwd:.2f} ±" in answers  # the table shows the record's number
    flash = load_record(pipeline / "results/cpu/e2e/tiny_ctx16_fp32_eager_w1_flash.json")
    assert flash["status"] == "ok" and flash["provenance"]["settings"]["attention"] == "flash"
    assert "With `flash` a training step takes" in answers
    assert "Not yet measured" not in answers and "older code" not in answers
    # the compile job compiled cold; the measured compiled cell then found every graph on disk
    cold = load_record(pipeline / "results/cpu/e2e_compile/tiny_ctx16_fp32.json")
    assert cold["status"] == "ok" and cold["metrics"]["compile_cache_hits"] == 0
    assert cold["provenance"]["code_version"] == code_version.code_version(
        "lmperf.kinds.e2e.compile_job", pipeline / "src" / "lmperf"
    )
    warm_record = load_record(pipeline / "results/cpu/e2e/tiny_ctx16_fp32_compiled_w1.json")
    assert warm_record["provenance"]["settings"]["compile_threads"] == 1  # the workflow's MEASURED_COMPILE_THREADS
    warm = warm_record["metrics"]
    assert warm["compile_cache_hits"] > 0
    assert warm["inductor_fxgraph_cache_misses"] == warm["aot_autograd_cache_misses"] == 0
    assert "Compiling happens before the measured cells, cold" in answers
    # the run noted its start beside the records, before its first cell process (lmperf.core.run_log)
    (started,) = run_log.run_starts(pipeline / "results/cpu")
    first = min(dt.datetime.fromisoformat(load_record(p)["provenance"]["process_start_time"]) for p in records)
    assert started < first


def test_nothing_to_do_after_a_complete_run(pipeline):
    assert plan(pipeline) == {}
    assert plan(pipeline, "--config", "report_only=true") == {}
    assert len(run_log.run_starts(pipeline / "results/cpu")) == 1  # dry runs note nothing


def test_a_fresh_clone_plans_nothing(clone):
    assert plan(clone) == {}
    assert plan(clone, "--config", "report_only=true") == {}


def test_a_new_device_plans_its_whole_grid_and_only_its_files(clone):
    result = snakemake(clone, "-n", "all", "--config", "device=h100")
    assert result.returncode == 0, result.stderr
    counts = job_counts(result.stdout)
    gpu = yaml.safe_load((clone / "config.yaml").read_text())["grids"]["gpu"]
    e2e = gpu["e2e"]
    main = {
        (m, c, p, "eager", e2e["warmup_steps"], "plain")
        for m in e2e["main"]["models"]
        for c in e2e["main"]["context_lengths"]
        for p in e2e["main"]["precisions"]
    }
    grids = {
        "compile": {
            (m, c, p, k, e2e["warmup_steps"], "plain")
            for m in e2e["compile"]["models"]
            for c in e2e["compile"]["context_lengths"]
            for p in e2e["compile"]["precisions"]
            for k in ("eager", "compiled")
        },
        "warmup": {
            (m, c, p, "eager", w, "plain")
            for m in e2e["warmup_sweep"]["models"]
            for c in e2e["warmup_sweep"]["context_lengths"]
            for p in e2e["warmup_sweep"]["precisions"]
            for w in e2e["warmup_sweep"]["warmup_steps"]
        },
        "attention": {
            (m, c, p, "eager", e2e["warmup_steps"], a)
            for m in e2e["attention_compare"]["models"]
            for c in e2e["attention_compare"]["context_lengths"]
            for p in e2e["attention_compare"]["precisions"]
            for a in e2e["attention_compare"]["attentions"]
        },
    }
    assert counts["e2e_cell"] == len(main.union(*grids.values()))
    assert counts["attention_cells"] == len(gpu["attention"]["implementations"])
    assert counts["memory_cell"] == len(gpu["memory"]["context_lengths"]) * len(gpu["memory"]["precisions"])
    assert counts["flash_benchmark"] == len(gpu["flash"]["benchmarking"]["precisions"])
    assert counts["precision_cells"] == counts["answers"] == counts["e2e_report"] == counts["e2e_compile"] == 1
    assert "stale" not in counts  # nothing to redo: there is nothing yet
    # every file the plan writes is the h100's (no record, table or report of the CPU run)
    outputs = [
        path
        for line in result.stdout.splitlines()
        if line.strip().startswith("output:")
        for path in line.split(":", 1)[1].replace(",", " ").split()
    ]
    # (and the front page report/answers.md, which every GPU run writes: Across devices)
    others = [path for path in outputs if "h100" not in path and path != "report/answers.md"]
    assert outputs and not others, others


def report_only_plan(workdir: Path, device: str) -> dict[str, int]:
    return plan(workdir, "--config", f"device={device}", "report_only=true")


def test_the_front_page_is_rebuilt_when_another_device_records_change(clone):
    """Across devices reads the other GPU devices' records: their aggregate stamps (digests of their
    records) count in this device's answers stamp, by content, not by time; their answers stamps do
    not, and their report rules never run here."""
    stamps = clone / "results/h200/stamps"
    stamps.mkdir(parents=True)
    (stamps / "e2e_report.stamp").write_text('{"inputs": {"a": "1"}}\n')
    (stamps / "answers.stamp").write_text("{}\n")
    result = snakemake(clone, "all", "--config", "device=h100", "report_only=true")
    assert result.returncode == 0, result.stdout + result.stderr
    ours = json.loads((clone / "results/h100/stamps/answers.stamp").read_text())["inputs"]
    assert "results/h200/stamps/e2e_report.stamp" in ours and "results/h200/stamps/answers.stamp" not in ours
    assert report_only_plan(clone, "h100") == {}
    # newer but the same: nothing; another device's answers changed: nothing; its records changed: rebuilt
    os.utime(stamps / "e2e_report.stamp")
    (stamps / "answers.stamp").write_text('{"changed": 1}\n')
    assert report_only_plan(clone, "h100") == {}
    (stamps / "e2e_report.stamp").write_text('{"inputs": {"a": "2"}}\n')
    assert report_only_plan(clone, "h100") == {"all": 1, "answers": 1, "stale": 1}
    # a forced rebuild of this device's report rebuilds nothing of the other device's
    before = {p.name: p.read_text() for p in stamps.iterdir()}
    result = snakemake(clone, "all", "--forceall", "--config", "device=h100", "report_only=true")
    assert result.returncode == 0, result.stdout + result.stderr
    assert {p.name: p.read_text() for p in stamps.iterdir()} == before
    assert not (clone / "results/h200/tables").exists()


def test_the_front_page_judges_another_devices_records_by_the_current_code(clone):
    """Across devices counts a compared cell as different code where one device's record is stale,
    judged by the current code as this device's records are: a record of the other device going
    stale rebuilds the front page and is counted, though none of that device's records changed."""
    records = ("attention", "e2e", "e2e_compile", "precision")
    for device in ("h100", "h200"):
        for kind in records:
            shutil.copytree(clone / "results/cpu" / kind, clone / f"results/{device}/{kind}")
    result = snakemake(clone, "all", "--config", "device=h100", "report_only=true")
    assert result.returncode == 0, result.stdout + result.stderr
    front = (clone / "report/answers.md").read_text()
    assert "Every compared cell ran the same code on each device" in front
    assert report_only_plan(clone, "h100") == {}
    # an h200 record from older code (its label differs, from no clean commit)
    path = clone / "results/h200/e2e/tiny_ctx16_fp32_eager_w1.json"
    record = json.loads(path.read_text())
    record["provenance"].update(code_version="0123456789abcdef", git_dirty=True)
    path.write_text(json.dumps(record, indent=1))
    assert report_only_plan(clone, "h100") == {"all": 1, "answers": 1, "stale": 1}
    result = snakemake(clone, "all", "--config", "device=h100", "report_only=true")
    assert result.returncode == 0, result.stdout + result.stderr
    front = (clone / "report/answers.md").read_text()
    assert re.search(r"\*\*1 of \d+ compared cells ran different code on different devices\*\*", front), front
    assert "results/h200/e2e/tiny_ctx16_fp32_eager_w1.json" not in (clone / "report/h100/answers.md").read_text()


def test_a_deleted_record_reruns_that_cell_and_its_aggregates(clone):
    (clone / "results/cpu/e2e/tiny_ctx16_bf16_eager_w1.json").unlink()
    # flags (rule `stale`) for the aggregates: ancient() inputs pass no "input job reruns" on
    assert plan(clone) == {"e2e_cell": 1, "e2e_report": 1, "stale": 2, "answers": 1, "all": 1}
    # report-only mode runs no cell: e2e_report's inputs changed (its stamp says so), then the report
    assert plan(clone, "--config", "report_only=true") == {"stale": 2, "e2e_report": 1, "answers": 1, "all": 1}


def test_a_failed_report_job_is_retried(clone, tmp_path):
    # a `python` that fails for the e2e report only, first on PATH for one real run
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text(
        f'#!/bin/sh\ncase "$*" in *lmperf.kinds.e2e.report*) exit 3;; esac\nexec {sys.executable} "$@"\n'
    )
    (fake / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    failed = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "all", "--forcerun", "e2e_report"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert failed.returncode != 0 and "e2e_report" in failed.stderr
    assert plan(clone) == {"e2e_report": 1, "stale": 1, "answers": 1, "all": 1}


def test_editing_report_code_in_a_fresh_clone_reruns_that_report(clone):
    path = clone / "src/lmperf/report/e2e.py"
    path.write_text(path.read_text() + "\nEDITED = True\n")
    assert plan(clone) == {"stale": 2, "e2e_report": 1, "answers": 1, "all": 1}


# per kind of the tiny grid: its cell rule and jobs, its records, its aggregate rule
KINDS = {
    "e2e": ("e2e_cell", 5, 5, "e2e_report"),
    "e2e_compile": ("e2e_compile", 1, 1, "e2e_report"),
    "precision": ("precision_cells", 1, 3, "precision_report"),
    "attention": ("attention_cells", 2, 2, "attention_report"),
}


def expected_plan(kinds: set[str]) -> dict[str, int]:
    """The plan when the cells of ``kinds`` are stale: one flag per record and per aggregate to redo
    (the kinds' reports and the report), their cell jobs, the aggregates, the report."""
    plan = {"all": 1, "answers": 1, "stale": 1}
    for kind in kinds:
        rule, jobs, records, report = KINDS[kind]
        plan[rule] = jobs
        plan["stale"] += records + (report not in plan)  # one flag per report, however many kinds it reads
        plan[report] = 1
    return plan


def cells_importing(pipeline: Path, module: str) -> set[str]:
    return {kind for kind in KINDS if module in code_version.closure(f"lmperf.cells.{kind}", pipeline / "src/lmperf")}


def test_an_nvtx_edit_reruns_exactly_its_cells(pipeline):
    kinds = cells_importing(pipeline, "lmperf.nvtx")
    assert "e2e" in kinds  # e2e -> model -> attention -> nvtx
    with edited(pipeline / "src/lmperf/nvtx.py", lambda text: text + "\nEDITED = True\n"):
        assert plan(pipeline) == expected_plan(kinds)


def test_a_model_edit_reruns_the_e2e_cells_not_the_precision_probes(pipeline):
    # the compile job runs the e2e cell's code (--compile-only), so its version covers that code
    assert cells_importing(pipeline, "lmperf.model") == {"e2e", "e2e_compile"}
    with edited(pipeline / "src/lmperf/model.py", lambda text: text + "\nEDITED = True\n"):
        assert plan(pipeline) == expected_plan({"e2e", "e2e_compile"})


def test_a_flash_kernel_edit_reruns_only_the_cells_that_run_the_kernels(pipeline):
    """lmperf.attention imports lmperf.kernels.flash only when `flash` is chosen: of the e2e cells, only the
    one with our kernels as its attention reruns, of the attention jobs only `flash`'s; the compile
    job, precision and the other attention job do not."""
    with edited(pipeline / "src/lmperf/kernels/flash/triton_backward.py", lambda text: text + "\nEDITED = True\n"):
        # flags for each record and for the two reports and the report; the two jobs, their reports
        assert plan(pipeline) == {
            "all": 1,
            "answers": 1,
            "stale": 5,
            "e2e_cell": 1,
            "e2e_report": 1,
            "attention_cells": 1,
            "attention_report": 1,
        }
        redone = re.findall(r"results/cpu/\w+/([\w.]+)\.json\.[0-9a-f]+-to-", snakemake(pipeline, "-n", "all").stdout)
        assert sorted(set(redone)) == ["flash_fp32_d16_n32", "tiny_ctx16_fp32_eager_w1_flash"]


def test_comments_and_docstrings_anywhere_rerun_nothing(pipeline):
    src = pipeline / "src" / "lmperf"
    originals = {p: p.read_text() for p in src.rglob("*.py")}
    try:
        for path, text in originals.items():
            if text.startswith('"""'):
                text = '"""Edited docstring.\n\n' + text[3:]
            path.write_text(text.replace("\ndef ", "\n# a comment\n\n\ndef ") + "\n# trailing comment \n")
        assert plan(pipeline) == {}
    finally:
        for path, text in originals.items():
            path.write_text(text)


def added_context_length(part: str, length: int = 24):
    """An edit of config.yaml: ``length`` added to the CPU grid's e2e.<part>.context_lengths."""

    def edit(text):
        config = yaml.safe_load(text)
        config["grids"]["cpu"]["e2e"][part]["context_lengths"].append(length)
        return yaml.safe_dump(config, sort_keys=False)

    return edit


def test_a_new_grid_value_runs_only_its_cells_and_the_aggregates(pipeline):
    with edited(pipeline / "config.yaml", added_context_length("main")):
        assert plan(pipeline) == {"e2e_cell": 2, "e2e_report": 1, "stale": 2, "answers": 1, "all": 1}


def test_a_new_compiled_length_recompiles_all_and_measures_only_its_cells(pipeline):
    with edited(pipeline / "config.yaml", added_context_length("compile")):
        # the compile job (a missing record) compiles every compiled cell again; of the measured cells
        # only ctx 24's two run (eager and compiled), the compiled one after the job
        assert plan(pipeline) == {"e2e_compile": 1, "e2e_cell": 2, "e2e_report": 1, "stale": 2, "answers": 1, "all": 1}
        result = snakemake(pipeline, "-n", "all")
        new = result.stdout.split("output: results/cpu/e2e/tiny_ctx24_fp32_compiled_w1.json")[0].rsplit("rule ", 1)[1]
        assert "input: results/cpu/e2e_compile/tiny_ctx24_fp32.json" in new
        assert "output: results/cpu/e2e/tiny_ctx16_fp32_compiled_w1.json" not in result.stdout


def bad_input_message(workdir: Path, *config: str) -> str:
    result = snakemake(workdir, "-n", "all", *(["--config", *config] if config else []))
    assert result.returncode != 0
    return result.stdout + result.stderr


@pytest.mark.parametrize(
    "name, text, problem",
    [
        ("tiny_ctx16_fp32_eager_w1.json", '{"kind": "e2e", "cell": {', "not valid JSON"),
        (
            "tiny_ctx16_fp32_eager_w0.json",
            '{"kind": "e2e", "cell": {"model": "tiny"}, "status": "fine"}',
            "not a valid record",
        ),
    ],
)
def test_a_bad_record_stops_the_run_naming_it(clone, name, text, problem):
    (clone / "results/cpu/e2e" / name).write_text(text)
    message = bad_input_message(clone)
    assert f"results/cpu/e2e/{name}: {problem}" in message and RERUN_HINT in message
    assert "Traceback" not in message


@pytest.mark.parametrize(
    "name, setting, other",
    [
        ("e2e/tiny_ctx16_fp32_eager_w1.json", ("attention", "flash"), "e2e/tiny_ctx16_fp32_eager_w1_flash.json"),
        ("attention/plain_fp32_d16_n32.json", ("implementation", "compiled_flash"), None),
    ],
)
def test_a_record_that_ran_our_kernels_outside_its_version_stops_the_run(clone, name, setting, other):
    """A record whose cell ran our kernels (attention `flash` in the model, or an attention job of
    implementation `flash`) while record_choices leaves them out of its version would never go stale
    on a kernel edit: the run stops and says where the case is missing."""
    if other:
        (clone / "results/cpu" / other).unlink()  # else the two claim one cell
    path = clone / "results/cpu" / name
    record = json.loads(path.read_text())
    record["provenance"]["settings"][setting[0]] = setting[1]
    path.write_text(json.dumps(record))
    message = bad_input_message(clone)
    assert f"results/cpu/{name} ran attention `flash`" in message
    assert "record_choices" in message and "Traceback" not in message


def test_two_records_of_one_cell_stop_the_run_naming_both(clone):
    shutil.copy(clone / "results/cpu/e2e/tiny_ctx16_fp32_eager_w1.json", clone / "results/cpu/e2e/tiny_copy.json")
    message = bad_input_message(clone)
    assert "claims the same cell as" in message and "tiny_copy.json" in message and RERUN_HINT in message


@pytest.mark.parametrize(
    "setting, expected",
    [
        ("devise=h100", "unknown key devise: did you mean 'device'?"),
        ("report_only=maybe", "report_only = 'maybe': use true or false"),
    ],
)
def test_a_bad_setting_gets_one_line(clone, setting, expected):
    assert expected in bad_input_message(clone, setting)


def test_report_only_names_records_measured_with_older_code(clone):
    record = clone / "results/cpu/e2e/tiny_ctx16_fp32_eager_w0.json"
    text = record.read_text()
    assert '"code_version": "' in text
    record.write_text(re.sub(r'"code_version": "[0-9a-f]+"', '"code_version": "0000000000000000"', text))
    # a normal run re-measures it; report-only mode rebuilds the report and names it
    assert plan(clone) == {"stale": 3, "e2e_cell": 1, "e2e_report": 1, "answers": 1, "all": 1}
    result = snakemake(clone, "all", "--config", "report_only=true")
    assert result.returncode == 0, result.stderr
    answers = (clone / "report/cpu/answers.md").read_text()
    assert (
        "**Measured with older code** (1 record: its code version differs" in answers
        and "tiny_ctx16_fp32_eager_w0" in answers
    )
    assert plan(clone, "--config", "report_only=true") == {}


def test_a_stale_scaleout_record_is_named_and_not_rebuilt_on_every_run(clone, request):
    """`all` reads the scale-out record but never measures it (it needs several GPUs): a stale one
    is named in the header with the command that re-measures it, and the report is built once, not
    again on every later run."""
    record = json.loads((Path(request.config.rootpath) / "results/h200/scaleout/e2e.json").read_text())
    record["provenance"]["code_version"] = "0000000000000000"
    (clone / "results/cpu/scaleout").mkdir(parents=True)
    (clone / "results/cpu/scaleout/e2e.json").write_text(json.dumps(record))
    planned = plan(clone)
    assert planned.get("scaleout_report") == 1 and "scaleout_cell" not in planned
    result = snakemake(clone, "all")
    assert result.returncode == 0, result.stdout + result.stderr
    assert plan(clone) == {}
    answers = (clone / "report/cpu/answers.md").read_text()
    assert "**Measured with older code** (1 record" in answers
    assert "the scale-out check is not part of `all`: `snakemake --cores 4 scaleout --forcerun scaleout_cell" in answers
    assert "`snakemake --cores 1 all` on this device re-measures" not in answers


def test_a_stale_record_whose_rerun_was_stopped_is_still_rerun(clone):
    """A run makes a stale record's flag, then stops (Ctrl-C, the time limit) before the cell ends:
    the old record is still there, its flag too; the next run must still re-measure it."""
    record = clone / "results/cpu/e2e/tiny_ctx16_fp32_eager_w0.json"
    record.write_text(re.sub(r'"code_version": "[0-9a-f]+"', '"code_version": "0000000000000000"', record.read_text()))
    dry = snakemake(clone, "-n", "all")
    flags = sorted(
        set(re.findall(r"logs/stale/results/cpu/e2e/tiny_ctx16_fp32_eager_w0\.json\.[^ ,\n]*\.flag", dry.stdout))
    )
    assert len(flags) == 1
    made = snakemake(clone, flags[0])  # the stopped run got as far as the flag
    assert made.returncode == 0, made.stderr
    assert plan(clone)["e2e_cell"] == 1


def test_a_cell_dies_with_its_parent(tmp_path):
    """A killed Snakemake leaves no cell running: the cell's parent dies, the kernel ends the cell."""
    pid_file = tmp_path / "cell.pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import subprocess, sys, time\n"
                "subprocess.Popen([sys.executable, '-c', 'import os, sys, time\\n"
                "from lmperf.core.lifetime import die_with_parent\\n"
                "die_with_parent()\\n"
                'open(sys.argv[1], "w").write(str(os.getpid()))\\n'
                "time.sleep(60)', sys.argv[1]])\n"
                "time.sleep(60)\n"
            ),
            str(pid_file),
        ]
    )
    deadline = time.time() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the cell outlived its parent")


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
