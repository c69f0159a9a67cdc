"""bench/compile_scope_compare.py: pairs block-by-block records with whole-model ones of the same cell."""

from __future__ import annotations

import pytest


def record(scope, train_ms, infer_ms, age_s=10.0, commit="abc1234"):
    settings = {"compile": "compiled"}
    if scope is not None:
        settings["compile_scope"] = scope
    return {
        "metrics": {"training_step_ms_mean": train_ms, "inference_forward_ms_mean": infer_ms},
        "provenance": {"settings": settings, "process_age_s": age_s, "git_commit": commit},
    }


def test_only_blocks_against_whole_model_pairs_are_compared_with_their_ratios(bench_module):
    compare = bench_module("compile_scope_compare")
    new = {
        "a.json": record("blocks", 110.0, 50.0),
        "b.json": record("blocks", 100.0, None),  # its inference ran out of memory
        "c.json": record("blocks", 100.0, 40.0),  # no old record of this cell
        "d.json": record(None, 100.0, 40.0),  # not block by block
    }
    old = {"a.json": record(None, 100.0, 40.0), "b.json": record(None, 80.0, 40.0), "d.json": record(None, 1.0, 1.0)}
    rows = compare.pair_rows(new, old)
    assert [r["cell"] for r in rows] == ["a", "b"]
    assert rows[0]["training_step_ms_mean"] == (110.0, 100.0, pytest.approx(1.1))
    assert rows[0]["inference_forward_ms_mean"][2] == pytest.approx(1.25)
    assert rows[1]["inference_forward_ms_mean"][2] is None
    text = compare.render(rows, "h100", "old", ([15.0, 19.0], [3.0, 4.0]), ([40.0], [12.0]))
    assert "training step, blocks / whole over 2 cells: median 1.175, range 1.100-1.250" in text
    assert "inference forward, blocks / whole over 1 cells: median 1.250" in text
    assert "compile job, blocks: cold training graphs 15.0-19.0 s, no-grad graph 3.0-4.0 s over 2 cells" in text


def test_a_record_without_the_setting_compiled_the_whole_model(bench_module):
    compare = bench_module("compile_scope_compare")
    assert compare.scope(record(None, 1.0, 1.0)) == "model"
    assert compare.scope(record("blocks", 1.0, 1.0)) == "blocks"
