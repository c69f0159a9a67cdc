"""bench/grid_targets.py: a device's records of `all` in the three lists of a re-measure sitting."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("grid_targets", ROOT / "bench" / "grid_targets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_records_split_into_compile_rest_and_ladder(tmp_path):
    files = [
        "e2e_compile/small_ctx128_fp32.json",
        "e2e/small_ctx128_fp32_compiled_w5.json",
        "e2e/small_ctx128_fp32_eager_w5.json",
        "nsys/small_ctx128_fp32_training.json",
        "ladder/2.7B_ctx1024_bf16.json",
        "gemm_peak/square_gemm.json",
        "ladder_profile/2.7B_ctx1024.json",
        "scaleout/e2e.json",  # not part of `all`
        "tables/e2e.csv",
        "stamps/answers.stamp",  # report outputs, not records
    ]
    for name in files:
        path = tmp_path / "results" / "h100" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    lists = _module().target_lists("h100", tmp_path)
    assert lists == {
        "t1": [
            "results/h100/e2e/small_ctx128_fp32_compiled_w5.json",
            "results/h100/e2e_compile/small_ctx128_fp32.json",
        ],
        "t2": ["results/h100/e2e/small_ctx128_fp32_eager_w5.json", "results/h100/nsys/small_ctx128_fp32_training.json"],
        "t3": [
            "results/h100/gemm_peak/square_gemm.json",
            "results/h100/ladder/2.7B_ctx1024_bf16.json",
            "results/h100/ladder_profile/2.7B_ctx1024.json",
        ],
    }
    with pytest.raises(SystemExit, match="no results/h999"):
        _module().target_lists("h999", tmp_path)


def test_the_committed_grids_split_whole():
    """Every committed record of `all` lands in exactly one list."""
    for device in ("h100", "h200"):
        lists = _module().target_lists(device)
        paths = [p for t in lists.values() for p in t]
        assert len(paths) == len(set(paths)) and len(lists["t1"]) == 40
        committed = {
            str(p.relative_to(ROOT))
            for p in (ROOT / "results" / device).glob("*/*.json")
            if p.parent.name != "scaleout"
        }
        assert set(paths) == committed
