"""Exact reruns: after a run nothing is left to do; a change plans exactly the jobs of the records it
makes stale (from each record's own fingerprint and settings, so in a fresh clone too) and the
aggregates that read them. Dry runs (`snakemake -n`) in copies of the one real run."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from lmperf.core import config
from lmperf.core.fingerprint import fingerprint
from lmperf.core.record import load_record
from lmperf.kinds import CELLS, grid_module

from .pipeline import E2E, PRECISION, cells, config_edit, e2e_jobs, edited, modes, plan, run_env


def jobs_of(workdir):
    """{record path: its job}, from the kinds' grid modules and the copy's config."""
    cfg = config.validate(yaml.safe_load((workdir / "config.yaml").read_text()))
    grid = config.grid(cfg, "cpu")
    return {
        path: job
        for kind in ("e2e", "precision")
        for job in grid_module(kind).jobs(grid[kind], "cpu")
        for path in job.records
    }


def test_the_run_writes_each_record_with_its_settings_and_fingerprint(pipeline):
    jobs = jobs_of(pipeline)
    written = sorted(str(p.relative_to(pipeline)) for p in (pipeline / "results/cpu").glob("*/*.json"))
    assert written == sorted(jobs)  # and no scale-out record: `all` never runs that check
    for path, job in jobs.items():
        record = load_record(pipeline / path)
        assert record["status"] == "ok" and record["cell"] == job.records[path]
        assert record["provenance"]["settings"] == job.settings
        expected = fingerprint(CELLS[job.cell], job.settings, pipeline / "src/lmperf")
        assert record["provenance"]["code_version"] == expected, path
    plain, flash = (load_record(pipeline / f"results/cpu/e2e/{s}.json") for s in (E2E[0], E2E[2]))
    assert plain["provenance"]["code_version"] != flash["provenance"]["code_version"]  # flash adds our kernels
    assert "ready" in (pipeline / "logs/cpu/warm.log").read_text()
    assert (pipeline / "report/cpu/answers.md").stat().st_size > 0
    assert not (pipeline / "report/answers.md").exists()  # the front page is h100's
    assert not list(pipeline.rglob("pwned"))  # the directory's name never reached a shell unquoted
    assert modes(pipeline / "results") | modes(pipeline / "report") == {"f 644", "d 755"}


def test_nothing_to_do_after_the_run_and_in_a_fresh_clone_no_cell(pipeline, clone):
    assert plan(pipeline) == {}
    assert plan(pipeline, "--config", "report_only=true") == {}
    assert cells(plan(clone)) == set()  # its aggregates may be rebuilt, once (test_runs, umask)


@pytest.mark.parametrize("where, change", [("copy", {"measured_steps": 3}), ("clone", {"batch_size": 3})])
def test_a_changed_grid_value_redoes_exactly_its_cells(request, where, change):
    work = request.getfixturevalue(where)
    with edited(work / "config.yaml", config_edit(**change)):
        planned = plan(work)
    assert cells(planned) == e2e_jobs(*E2E)  # every e2e cell runs with it, no precision cell does
    if where == "copy":
        assert set(planned) - cells(planned) == {"e2e_report", "answers", "all"}


@pytest.mark.parametrize("kind, expected", [("precision", {PRECISION}), ("e2e", e2e_jobs(*E2E))])
def test_an_edit_of_one_kinds_cell_code_redoes_only_its_cells(copy, kind, expected):
    with edited(copy / f"src/lmperf/kinds/{kind}/cell.py", lambda text: text + "\nEDITED = True\n"):
        assert cells(plan(copy)) == expected


def test_comments_and_docstrings_anywhere_redo_no_cell(copy):
    for path in (copy / "src/lmperf").rglob("*.py"):
        text = path.read_text()
        if text.startswith('"""'):
            text = '"""Edited docstring.\n\n' + text[3:]
        path.write_text(text.replace("\ndef ", "\n# a comment\n\n\ndef ") + "\n# trailing comment \n")
    assert cells(plan(copy)) == set()


@pytest.mark.parametrize("where", ["copy", "clone"])
def test_a_deleted_record_redoes_exactly_its_job(request, where):
    work = request.getfixturevalue(where)
    (work / f"results/cpu/e2e/{E2E[1]}.json").unlink()
    planned = plan(work)
    assert cells(planned) == e2e_jobs(E2E[1])
    if where == "copy":
        assert set(planned) - cells(planned) == {"e2e_report", "answers", "all"}


def test_an_edit_of_our_flash_kernels_redoes_the_cells_that_choose_flash(clone):
    kernel = clone / "src/lmperf/kernels/flash/triton_backward.py"
    kernel.write_text(kernel.read_text() + "\nEDITED = True\n")
    assert cells(plan(clone)) == e2e_jobs(E2E[2])


# The workflow's rules as Snakemake parsed them (no job runs): name, local or not, resources, outputs.
PROBE = """
import json
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

with SnakemakeApi(OutputSettings()) as api:
    workflow = api.workflow(ResourceSettings(), ConfigSettings(config={"device": "auto"}),
                            snakefile=Path("Snakefile"), workdir=Path("."))._workflow
    print("RULES=" + json.dumps([dict(name=r.name, local=r.name in workflow._localrules, outputs=list(map(str, r.output)),
        resources={k: None if v.is_evaluable() else v.value for k, v in r.resources.items()}) for r in workflow.rules]))
"""


def test_another_device_plans_its_grid_on_gpus_and_only_its_own_files(clone):
    """On an h100 (the front page's device) the same grid: cells hold a GPU, memory and a time
    budget (a scheduler places them with these), aggregates run where Snakemake runs, and every
    file is the h100's."""
    env = {**run_env(clone), "LMPERF_AUTO_DEVICE": "h100"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    rules = json.loads(out.stdout.split("RULES=")[-1]) if "RULES=" in out.stdout else pytest.fail(out.stderr[-3000:])
    assert {r["name"] for r in rules} >= e2e_jobs(*E2E) | {PRECISION, "e2e_report", "answers"}
    for rule in rules:
        assert all(re.match(r"(results|report)/h100/|report/answers\.md$", path) for path in rule["outputs"]), rule
        if "__" in rule["name"]:
            assert not rule["local"] and rule["resources"]["gpu"] >= 1, rule
            assert rule["resources"]["mem_mb"] > 0 and rule["resources"]["runtime"] > 0, rule
        elif rule["name"] not in ("all", "scaleout"):
            assert rule["local"], f"{rule['name']} writes aggregates: it should be a local rule"
