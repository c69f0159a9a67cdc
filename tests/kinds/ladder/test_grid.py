"""The GPU ladder grid's order: the GEMM ceiling (which every ladder reads) before every ladder, the
largest models' ladders first."""

from __future__ import annotations

import yaml
from conftest import REPO

from lmperf.core import config
from lmperf.kinds.ladder import grid


def test_the_gemm_ceiling_goes_first_then_the_largest_ladders():
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    config.validate(cfg)
    jobs = grid.jobs(config.grid(cfg, "h100")["ladder"], "h100")
    gemm = next(j for j in jobs if j.cell == "gemm_peak")
    ladders = [j for j in jobs if j.cell == "ladder"]
    assert all(gemm.output in j.after and gemm.priority > j.priority for j in ladders)
    order = [j.settings["model"] for j in sorted(ladders, key=lambda j: -j.priority)]
    assert order[:2] == ["2.7B", "2.7B"] and order[-2:] == ["small", "small"]
