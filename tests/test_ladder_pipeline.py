"""The ladder's rules on the CPU: gemm_peak, ladder, its profile and its report section in a temporary copy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from lmperf.core.record import load_record


def test_ladder_rules_write_records_section_and_waterfall(tmp_path, request):
    repo = Path(request.config.rootpath)
    for name in ("Snakefile", "workflow", "src", "envs"):
        src = repo / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    config = yaml.safe_load((repo / "config.yaml").read_text())
    config["device"] = "cpu"
    cpu = config["grids"]["cpu"]
    ladder = {
        **cpu["ladder"],
        "context_lengths": [16],
        "rungs": ["baseline", "tf32", "bf16", "max_batch"],
        "batch_size": 2,
        "max_batch_size": 4,
        "measured_steps": 1,
        "profile": {"models": ["tiny"], "context_lengths": [16]},
    }
    config["grids"]["cpu"] = {"e2e": cpu["e2e"], "ladder": ladder, "gemm_peak": cpu["gemm_peak"]}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", "ladder_all_target"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    results = tmp_path / "results/cpu"
    statuses = {r: load_record(results / f"ladder/tiny_ctx16_{r}.json")["status"] for r in ladder["rungs"]}
    assert statuses == {"baseline": "ok", "tf32": "unsupported", "bf16": "ok", "max_batch": "ok"}
    assert load_record(results / "gemm_peak/square_gemm.json")["status"] == "ok"
    assert load_record(results / "ladder_profile/tiny_ctx16.json")["status"] == "unsupported"
    section = (results / "sections/speed_ladder.md").read_text()
    assert "**tiny** at context 16" in section and "The largest single gain is" in section
    assert (results / "figures/ladder_tiny_ctx16.png").stat().st_size > 1000
    assert (results / "tables/ladder.csv").read_text().count("\n") == 1 + len(ladder["rungs"])
