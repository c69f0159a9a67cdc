"""Every rule says what it needs, so a scheduler (SLURM, or `--resources gpu=K` on one host) can
place it: cells declare gpu (GPUS_PER_CELL: 1 on a GPU grid, 0 on the CPU grid), mem_mb and
runtime; the tables, figures, sections and the report are local rules (`localrule: True`), run by
the Snakemake process itself rather than submitted. Read from the parsed workflow, for both grids.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Loads the workflow through Snakemake's API (no job runs) and prints each rule's declarations.
_PROBE = r"""
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

with SnakemakeApi(OutputSettings()) as api:
    workflow = api.workflow(resource_settings=ResourceSettings(),
                            config_settings=ConfigSettings(config={"device": sys.argv[1]}),
                            snakefile=Path("Snakefile"), workdir=Path("."))._workflow
    rules = []
    for rule in workflow.rules:
        declared = {}
        for name, resource in rule.resources.items():
            declared[name] = "callable" if resource.is_evaluable() else resource.value
        rules.append(dict(name=rule.name, local=rule.name in workflow._localrules, norun=rule.norun,
                          resources=declared, outputs=[str(o) for o in rule.output]))
print("RULES=" + json.dumps(rules))
"""

AGGREGATE_MARKERS = ("/tables/", "/figures/", "/sections/", "report/")


def _rules(device: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("LMPERF_GPUS_PER_CELL", "LMPERF_AUTO_DEVICE")}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, device], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RULES="))
    return json.loads(line.removeprefix("RULES="))


@pytest.mark.parametrize("device, gpus", [("h100", 1), ("cpu", 0)])
def test_cells_declare_resources_and_aggregates_are_local(device, gpus):
    rules = _rules(device)
    assert any(r["name"] == "e2e_cell" for r in rules)
    problems = []
    for rule in rules:
        if rule["norun"]:
            continue  # rule all: a target list, never a job
        aggregate = any(m in o for o in rule["outputs"] for m in AGGREGATE_MARKERS)
        if aggregate and not rule["local"]:
            problems.append(f"{rule['name']}: writes {rule['outputs'][0]} but is not `localrule: True`")
        if rule["local"]:
            continue
        declared = rule["resources"]
        missing = [name for name in ("gpu", "mem_mb", "runtime") if name not in declared]
        if missing:
            problems.append(f"{rule['name']}: declares no {', '.join(missing)} under resources:")
        elif declared["gpu"] != "callable" and declared["gpu"] != gpus:
            problems.append(f"{rule['name']}: gpu={declared['gpu']} on the {device} grid (GPUS_PER_CELL is {gpus})")
    assert not problems, "\n".join(problems)
