"""The pipeline on a real SLURM scheduler, the way a cluster user runs it.

A throw-away single-node cluster (slurmctld, slurmd and munge from Debian's packages, two fake
GRES GPUs) comes up in a temp dir (tests/slurm/start.sh), and cells of the CPU grid (two trials
each, then their merge) run in a temp copy of the checkout through the SLURM profile
(workflow/profiles/slurm) and Snakemake's SLURM executor plugin. The cells ask for a GPU as GPU
cells do (LMPERF_GPUS_PER_CELL=1, the switch for testing schedulers on a CPU). Checked:
- each record has the cell and settings its job (the e2e grid module) gives it;
- SLURM gave each trial a GPU, and two trials that ran at the same time different ones (the
  CUDA_VISIBLE_DEVICES their trial records keep: `--notemp` keeps them);
- the rule's mem_mb reached sbatch;
- a cell's trial that fails (given a time budget of 0) is reported: snakemake exits non-zero
  naming the rule, and the rule's log says why.
The cluster is torn down by process id (tests/slurm/stop.sh). Needs root and the Debian packages
that tests/slurm/install.sh installs (.ci/run runs it before the tests; the test itself never
changes the system) and skips, saying why, without them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from lmperf.core import config as lmconfig
from lmperf.core.trials import trial_path
from lmperf.kinds.e2e import grid as e2e_grid

from .pipeline import REPO, copy_checkout, run_env

HELPERS = REPO / "tests" / "slurm"
SLURM_EXES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "srun", "scancel")
# a cell of the CPU grid whose two trials SLURM runs at once (2 fake GPUs), and another's trial that
# fails, held back 20 s (sbatch --begin) so that the first two start first
CELL, FAILING = "tiny_ctx32_fp32_eager_w2", "tiny_ctx64_fp32_eager_w2"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.platform != "linux", reason="the test cluster runs on Linux")]


def _missing_tools() -> list[str]:
    missing = [exe for exe in SLURM_EXES if shutil.which(exe) is None]
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        missing.append("snakemake-executor-plugin-slurm")
    return missing


@pytest.fixture(scope="module")
def slurm_conf(tmp_path_factory):
    """A running single-node cluster with two GRES GPUs: the path of its slurm.conf."""
    if os.geteuid() != 0:
        pytest.skip("the test cluster's daemons need root")
    if _missing_tools():
        pytest.skip(
            f"no test scheduler installed (missing {', '.join(_missing_tools())});"
            " `bash tests/slurm/install.sh` as root installs one (.ci/run does)"
        )
    cluster = tmp_path_factory.mktemp("slurm")
    try:
        started = subprocess.run(
            ["bash", str(HELPERS / "start.sh"), str(cluster)], capture_output=True, text=True, timeout=120
        )
        assert started.returncode == 0, f"the test cluster did not start:\n{started.stdout}\n{started.stderr}"
        yield cluster / "slurm.conf"
    finally:
        subprocess.run(["bash", str(HELPERS / "stop.sh"), str(cluster)], capture_output=True, timeout=120)


def _slurm_jobs(env: dict) -> list[dict]:
    """Every job the cluster knows (finished ones stay for MinJobAge): comment, times, memory."""
    out = subprocess.run(
        ["squeue", "--states=all", "--noheader", "--format=%k|%S|%e|%m"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [dict(zip(("comment", "start", "end", "mem"), line.split("|"))) for line in out.stdout.splitlines()]


def test_cells_run_on_slurm_as_their_jobs_say(slurm_conf, tmp_path):
    config = lmconfig.validate(yaml.safe_load((REPO / "config.yaml").read_text()))
    jobs = {p: job for job in e2e_grid.jobs(lmconfig.grid(config, "cpu")["e2e"], "cpu") for p in job.records}
    target = f"results/cpu/e2e/{CELL}.json"
    # small enough that two trials fit any test machine's memory; the SLURM jobs must ask for it
    resources = [f"e2e__{CELL}{t}:mem_mb=1000" for t in ("__t0", "__t1", "")]
    resources += [f"e2e__{FAILING}__t0:runtime=0", f"e2e__{FAILING}__t0:slurm_extra='--begin=now+20'"]
    work = copy_checkout(tmp_path / "cluster", grids=yaml.safe_load((REPO / "config.yaml").read_text())["grids"])
    env = run_env(
        work,
        SLURM_CONF=str(slurm_conf),
        LMPERF_GPUS_PER_CELL="1",
        PATH=f"{slurm_conf.parent / 'bin'}{os.pathsep}{os.environ['PATH']}",  # see start.sh
    )
    ran = subprocess.run(
        [sys.executable, "-m", "snakemake", target, trial_path(f"results/cpu/e2e/{FAILING}.json", 0)]
        + ["--profile", "workflow/profiles/slurm", "--notemp", "--set-resources", *resources]
        # this cluster keeps no accounting: sacct would fail forever, so query squeue, and soon
        + ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2", "--latency-wait", "5"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = ran.stdout + ran.stderr

    # the failing cell: reported, naming its rule; its log says why; its record is not written
    assert ran.returncode != 0, log[-3000:]
    assert f"Error in rule e2e__{FAILING}__t0" in log, log[-3000:]
    assert "ran past its budget of 0 s" in (work / f"logs/cpu/e2e__{FAILING}__t0.log").read_text()
    assert not (work / f"results/cpu/e2e/{FAILING}.json").exists()

    # the other cell: its record as its job says
    record = json.loads((work / target).read_text())
    assert record["status"] == "ok" and record["cell"] == jobs[target].records[target], log[-3000:]
    assert record["provenance"]["settings"] == jobs[target].settings

    # SLURM gave every trial one of the two GPUs, and trials that overlapped in time different ones
    trials = [j for j in _slurm_jobs(env) if re.fullmatch(r"rule_e2e__\w+__t\d", j["comment"])]
    assert len(trials) == 3, trials
    for job in trials:
        assert job["mem"] == ("1000M" if CELL in job["comment"] else "8000M"), job  # the rule's mem_mb
        name, i = re.fullmatch(r"rule_e2e__(\w+)__t(\d)", job["comment"]).groups()
        if name != FAILING:
            trial = json.loads((work / trial_path(f"results/cpu/e2e/{name}.json", int(i))).read_text())
            job["visible"] = trial["provenance"]["cuda_visible_devices"]
            assert job["visible"] in ("0", "1"), job
    ran = [j for j in trials if "visible" in j]
    overlapping = [
        (a, b) for i, a in enumerate(ran) for b in ran[i + 1 :] if a["start"] < b["end"] and b["start"] < a["end"]
    ]
    assert overlapping, f"no two trials ran at once: {trials}"
    for a, b in overlapping:
        assert a["visible"] != b["visible"], f"concurrent jobs shared a GPU: {a} {b}"
