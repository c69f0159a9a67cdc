"""What a run must do (lmperf.core.plan): a record is current only while its fingerprint and its
settings are the job's; one that contradicts its path is named."""

from __future__ import annotations

import copy
import json

from conftest import cpu_grid

from lmperf.core import plan
from lmperf.core.record import make_record
from lmperf.kinds import grid_module
from tests.kinds.records import provenance as base_provenance


def precision_job() -> plan.Job:
    return grid_module("precision").jobs(cpu_grid()["precision"], "cpu")[0]


def record_of(job: plan.Job, **provenance) -> dict:
    settings = json.loads(job.argument())["settings"]  # as a record keeps it: through JSON
    prov = base_provenance("cpu", "x86_64", torch_version="2", git_commit="unknown", git_dirty=True, settings=settings)
    prov |= {"code_version": job.fingerprint(), **provenance}
    return make_record("precision", {"probe": "accumulation"}, "ok", {"m": 1}, prov)


def test_a_record_is_current_until_its_code_or_settings_differ():
    job = precision_job()
    assert plan.why_stale(record_of(job), job) is None  # tuples against lists and key order do not count
    assert plan.why_stale(record_of(job, code_version="0" * 16), job) == "measured with other code"
    old = copy.deepcopy(job.settings)
    old["accumulation"]["steps"] += 1
    old["seed"] += 1
    assert plan.why_stale(record_of(job, settings=old), job) == "measured with other settings (accumulation, seed)"


def test_a_record_that_contradicts_its_path_is_named():
    job = precision_job()
    r = record_of(job)
    path = "results/cpu/precision/accumulation.json"
    assert plan.misplaced(path, r, path) is None
    assert "of kind 'precision' in the folder of kind 'e2e'" in plan.misplaced("results/cpu/e2e/x.json", r, path)
    on_h100 = plan.misplaced("results/h100/precision/x.json", r, path)
    assert "measured on 'cpu' in the folder of device 'h100'" in on_h100
    other = "results/cpu/precision/layer_norm.json"
    assert f"belongs at {other}" in plan.misplaced(path, r, other)
    assert "names no record of this kind" in plan.misplaced(path, r, None)


def test_a_jobs_name_argument_and_resources():
    job = precision_job()
    assert job.name == "precision__accumulation" and job.name.isidentifier()
    assert json.loads(job.argument()) == {"settings": job.settings, "output": job.output}
    assert plan.cell_resources("2.7B", gpu=True, runtime=9) == {"threads": 2, "gpu": 1, "mem_mb": 32000, "runtime": 9}
    assert plan.cell_resources("tiny", gpu=False, runtime=5)["mem_mb"] == 8000
    assert plan.parameters("small") == 128_625_408  # 12 · (4·768² + 3·768·3072 + 2·768) + 2·10,000·768 + 768
