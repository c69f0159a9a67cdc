"""The pipeline on a real SLURM scheduler, the way a cluster user runs it.

A throw-away single-node cluster (slurmctld, slurmd and munge from Debian's packages, two fake
GRES GPUs) comes up in a temp dir (tests/slurm/start.sh), and a tiny CPU grid runs in a temp copy
of the repository through the SLURM profile (workflow/profiles/slurm) and Snakemake's SLURM
executor plugin. The cells ask for a GPU as GPU cells do (LMPERF_GPUS_PER_CELL=1, the switch for
testing schedulers on a CPU). Checked:
- the records are the same set, with the same cells and settings, as a local run makes;
- SLURM gave each cell a GPU, and two cells that ran at the same time different ones (the
  CUDA_VISIBLE_DEVICES their provenance records);
- the rule's mem_mb reached sbatch;
- a cell that fails (a GPU cell, results/h100/…, on a machine without that GPU) is reported:
  snakemake exits non-zero naming the rule, and the rule's log holds the DeviceMismatch.
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
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "tests" / "slurm"
SLURM_EXES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "srun", "scancel")
# The tiny grid: 3 cells (and one failing), of which SLURM runs two at a time (2 fake GPUs).
CELLS = [("tiny", 32, "fp32"), ("tiny", 32, "bf16"), ("tiny", 64, "fp32")]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="the test cluster runs on Linux"),
]


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
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks a CPU machine: its failing job is a GPU cell landing on no GPU")
    if _missing_tools():
        # the tests never install anything: .ci/run (or you, explicitly) runs tests/slurm/install.sh
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


def _copy_repo(dst: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "results", "logs", ".snakemake")
    dst.mkdir(parents=True)
    for name in ("Snakefile", "config.yaml"):
        shutil.copy2(REPO / name, dst / name)
    for name in ("workflow", "src", "envs"):
        if (REPO / name).exists():
            shutil.copytree(REPO / name, dst / name, ignore=ignore)
    return dst


def _targets(device="cpu") -> list[str]:
    warmup = yaml.safe_load((REPO / "config.yaml").read_text())["grids"]["cpu"]["e2e"]["warmup_steps"]
    return [f"results/{device}/e2e/{m}_ctx{c}_{p}_eager_w{warmup}.json" for m, c, p in CELLS]


def _env(**extra) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in ("CUDA_VISIBLE_DEVICES", "LMPERF_AUTO_DEVICE", "LMPERF_GPUS_PER_CELL", "SLURM_CONF", "SNAKEMAKE_PROFILE")
    }
    env.update(extra)
    return env


def _snakemake(workdir: Path, args: list[str], env: dict, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args, "--config", "device=cpu"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _records(workdir: Path) -> dict[str, dict]:
    return {
        str(p.relative_to(workdir)): json.loads(p.read_text())
        for p in sorted((workdir / "results" / "cpu" / "e2e").glob("*.json"))
    }


def _slurm_jobs(conf: Path) -> list[dict]:
    """Every job the cluster knows (finished ones stay for MinJobAge): id, comment, times, memory."""
    out = subprocess.run(
        ["squeue", "--states=all", "--noheader", "--format=%i|%k|%S|%e|%m|%T"],
        env=_env(SLURM_CONF=str(conf)),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    jobs = []
    for line in out.stdout.splitlines():
        job_id, comment, start, end, mem, state = line.split("|")
        jobs.append(dict(id=job_id, comment=comment, start=start, end=end, mem=mem, state=state))
    return jobs


def test_grid_runs_on_slurm_like_locally(slurm_conf, tmp_path):
    targets = _targets()
    failing = _targets("h100")[0]  # a GPU cell: on this CPU machine it must fail, loudly

    local = _copy_repo(tmp_path / "local")
    ran = _snakemake(local, [*targets, "--cores", "2"], _env(), timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]

    cluster = _copy_repo(tmp_path / "cluster")
    env = _env(
        SLURM_CONF=str(slurm_conf),
        LMPERF_GPUS_PER_CELL="1",
        PATH=f"{slurm_conf.parent / 'bin'}{os.pathsep}{os.environ['PATH']}",
    )  # see start.sh
    ran = _snakemake(
        cluster,
        [
            *targets,
            failing,
            "--profile",
            "workflow/profiles/slurm",
            # this cluster keeps no accounting: sacct would fail forever, so query squeue, and soon
            "--slurm-status-command",
            "squeue",
            "--slurm-init-seconds-before-status-checks",
            "2",
            "--latency-wait",
            "5",
        ],
        env,
        timeout=600,
    )
    log = ran.stdout + ran.stderr

    # the failing cell: reported, naming its rule and output; its log says why
    assert ran.returncode != 0, log[-3000:]
    assert "Error in rule e2e_cell" in log and failing in log, log[-3000:]
    failing_log = cluster / failing.replace("results/", "logs/").replace(".json", ".log")
    assert "DeviceMismatch" in failing_log.read_text()
    assert not (cluster / failing).exists()

    # the other cells: the same records as a local run
    local_records, cluster_records = _records(local), _records(cluster)
    assert sorted(cluster_records) == sorted(local_records) == sorted(targets), log[-3000:]
    for path, record in cluster_records.items():
        mine = local_records[path]
        assert record["status"] == mine["status"] == "ok"
        assert record["cell"] == mine["cell"]
        assert record["provenance"]["settings"] == mine["provenance"]["settings"]
        assert record["metrics"].keys() == mine["metrics"].keys()
        assert mine["provenance"]["cuda_visible_devices"] is None

    # SLURM gave every cell one of the two GPUs, and cells that overlapped in time different ones
    visible = {}
    for record in cluster_records.values():
        cell = record["cell"]
        key = f"cpu_{cell['model']}_{cell['context_length']}_{cell['precision']}_eager_{cell['warmup_steps']}"
        visible[key] = record["provenance"]["cuda_visible_devices"]
    assert set(visible.values()) <= {"0", "1"}, visible

    jobs = [j for j in _slurm_jobs(slurm_conf) if j["comment"].startswith("rule_e2e_cell_wildcards_cpu_")]
    assert len(jobs) == len(targets), jobs
    declared_mem_mb = set(re.findall(r"\bmem_mb=(\d+)", log))  # as Snakemake printed each job's resources
    for job in jobs:
        assert job["mem"].removesuffix("M") in declared_mem_mb, (job, declared_mem_mb)  # the rule's mem_mb
        # (the last wildcard, `attention`, is empty for plain attention)
        job["visible"] = visible[job["comment"].removeprefix("rule_e2e_cell_wildcards_").rstrip("_")]
    overlapping = [
        (a, b) for i, a in enumerate(jobs) for b in jobs[i + 1 :] if a["start"] < b["end"] and b["start"] < a["end"]
    ]  # ISO times compare as strings
    assert overlapping, f"no two cells ran at once: {jobs}"
    for a, b in overlapping:
        assert a["visible"] != b["visible"], f"concurrent jobs shared a GPU: {a} {b}"
