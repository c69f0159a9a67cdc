"""bench/grid_targets.py: a device's records of `all` in the three lists of a re-measure sitting."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
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


def _record(path: Path, commit: str, dirty: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"provenance": {"git_commit": commit, "git_dirty": dirty}}))


def test_done_leaves_out_only_what_that_commit_measured_clean(tmp_path):
    results = tmp_path / "results" / "h200"
    _record(results / "e2e" / "a_eager_w5.json", "b33cbba77f20d82a", dirty=False)  # done: left out
    _record(results / "e2e" / "b_eager_w5.json", "b33cbba77f20d82a", dirty=True)  # dirty tree: again
    _record(results / "e2e" / "c_eager_w5.json", "cc976f5d11bb0000", dirty=False)  # older commit: again
    _record(results / "ladder" / "d_baseline.json", "cc976f5d11bb0000", dirty=False)
    module = _module()
    assert module.target_lists("h200", tmp_path, done="b33cbba") == {
        "t1": [],
        "t2": ["results/h200/e2e/b_eager_w5.json", "results/h200/e2e/c_eager_w5.json"],
        "t3": ["results/h200/ladder/d_baseline.json"],
    }
    assert sum(map(len, module.target_lists("h200", tmp_path).values())) == 4


def test_main_writes_the_lists_and_refuses_a_short_commit(tmp_path, capsys):
    module = _module()
    assert module.main(["h100", str(tmp_path)]) == 0
    assert (tmp_path / "h100_t1").read_text().count("\n") == 40
    for bad in ("b33", "HEAD~1"):
        with pytest.raises(SystemExit):
            module.main(["h100", str(tmp_path), "--done", bad])
        assert "7 to 40 lowercase hex digits" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_tracked_record_missing_from_the_tree_is_listed_until_measured(tmp_path):
    """Deleted to be measured and not measured yet (a drained call did not reach it): listed again,
    with or without --done, so rewriting the lists between calls keeps it."""
    results = tmp_path / "results" / "h200"
    _record(results / "e2e" / "a_eager_w5.json", "b33cbba77f20d82a", dirty=False)
    _record(results / "attention" / "b_fp32.json", "cc976f5d11bb0000", dirty=False)
    _record(results / "ladder" / "c_baseline.json", "cc976f5d11bb0000", dirty=False)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "results"], check=True)
    subprocess.run([*git, "commit", "-qm", "records"], check=True)
    (results / "attention" / "b_fp32.json").unlink()  # deleted to be measured
    (results / "ladder" / "c_baseline.json").unlink()
    _record(results / "ladder" / "c_baseline.json", "b33cbba77f20d82a", dirty=False)  # measured since
    module = _module()
    assert module.target_lists("h200", tmp_path, done="b33cbba") == {
        "t1": [],
        "t2": ["results/h200/attention/b_fp32.json"],
        "t3": [],
    }
    assert module.target_lists("h200", tmp_path)["t2"] == [
        "results/h200/attention/b_fp32.json",
        "results/h200/e2e/a_eager_w5.json",
    ]
