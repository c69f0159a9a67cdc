"""The record (lmperf.core.record): schema, atomic writes, expected outcomes as records, and errors
that name the file, the problem and the fix. ``jsonschema.validate`` is the independent reference
for the validator."""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path

import jsonschema
import pytest
import torch

from lmperf.core import record
from lmperf.core.device import provenance
from lmperf.kinds import RECORD_FOLDERS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prov() -> dict:
    return provenance("cpu", {"a": 1}, "precision")


def make(prov, status="ok", metrics=None, cell=None, reason=None) -> dict:
    return record.make_record(
        "e2e", cell or {"model": "tiny"}, status, {"m": 1} if metrics is None else metrics, prov, reason
    )


def test_a_record_round_trips_with_nan_as_null_and_no_temporary_file_left(tmp_path, prov):
    r = make(prov, metrics={"forward_ms_mean": 1.5, "x": float("nan"), "t": (1, 2)})
    path = record.write_record(tmp_path / "sub" / "r.json", r)
    assert record.load_record(path)["metrics"] == {"forward_ms_mean": 1.5, "x": None, "t": [1, 2]}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_a_records_mode_is_what_the_umask_gives_any_file(tmp_path, prov, umask):
    old = os.umask(umask)
    try:
        path = record.write_record(tmp_path / "r.json", make(prov))
        (tmp_path / "other").touch()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE((tmp_path / "other").stat().st_mode) == 0o666 & ~umask


def test_a_failed_write_leaves_the_previous_record(tmp_path, prov, monkeypatch):
    path = record.write_record(tmp_path / "r.json", make(prov))
    monkeypatch.setattr(record.os, "replace", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        record.write_record(path, make(prov, metrics={"m": 2}))
    assert json.loads(path.read_text())["metrics"] == {"m": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def bad_records(prov) -> dict[str, str]:
    """File texts of broken records, by what is wrong: errors deep and at the top, one and two."""
    good = make(prov)
    cases = {
        "crashed": lambda r: r.update(status="crashed"),
        "no provenance": lambda r: r.pop("provenance"),
        "oom without a reason": lambda r: r.update(status="oom", reason=None),
        "ok without metrics": lambda r: r.update(metrics={}),
        "bad slug, deep": lambda r: r["provenance"].update(device_slug="H100 GPU"),
        "short commit": lambda r: r["provenance"].update(git_commit="abc123"),
        "two wrong": lambda r: (r.update(status="crashed"), r["provenance"].update(device_slug="H100 GPU")),
    }
    texts = {"truncated": '{"kind": "e2e", "cell": {"c"', "not an object": "[1, 2]"}
    for what, mutate in cases.items():
        bad = copy.deepcopy(good)
        mutate(bad)
        texts[what] = json.dumps(bad)
    return texts


def test_a_bad_record_raises_what_jsonschema_raises_naming_path_problem_and_fix(tmp_path, prov):
    schema = json.loads(record.SCHEMA_PATH.read_text())
    texts = {**bad_records(prov), "not UTF-8": b"\xff\xfe{}"}
    for what, text in texts.items():
        path = tmp_path / "r.json"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(record.RecordError) as err:
            record.load_record(path)
        message = str(err.value)
        assert message.startswith(f"{path}: ") and message.endswith(record.RERUN_HINT), what
        assert len(message.splitlines()) == 1 and err.value.path == str(path), what
        if what in ("truncated", "not UTF-8"):
            assert ("not valid JSON" if what == "truncated" else "not a readable UTF-8 file") in message
            continue
        instance = json.loads(text)
        with pytest.raises(jsonschema.ValidationError) as reference:
            jsonschema.validate(instance, schema)
        with pytest.raises(jsonschema.ValidationError) as ours:
            record.validate(instance)
        want = reference.value
        assert (ours.value.message, list(ours.value.absolute_path)) == (want.message, list(want.absolute_path)), what
        assert want.message in message, what


def test_committed_records_are_valid_and_the_schema_is_checked_once(monkeypatch):
    paths = sorted(p for folder in RECORD_FOLDERS for p in REPO.glob(f"results/*/{folder}/*.json"))  # no verify/
    assert paths, "no committed records"
    record.validator.cache_clear()
    cls = type(record.validator())
    record.validator.cache_clear()
    checks = []
    real = cls.check_schema.__func__
    monkeypatch.setattr(cls, "check_schema", classmethod(lambda c, s, **kw: checks.append(1) or real(c, s, **kw)))
    for path in paths:
        assert record.load_record(path) == json.loads(path.read_text())
    assert len(checks) == 1
    record.validator.cache_clear()


def test_run_cell_turns_the_expected_outcomes_into_records_and_fails_on_any_other(tmp_path, prov):
    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")

    def partial():
        raise record.PartialOutOfMemory("training step: out of memory", {"inference_ms": 3.0})

    def unsupported():
        raise record.Unsupported("needs CUDA")

    def plain_runtime_oom():  # allocators inside Triton or cuBLAS raise a plain RuntimeError
        raise RuntimeError("CUDA error: out of memory")

    outcomes = {
        oom: ("oom", {}, "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
        partial: ("oom", {"inference_ms": 3.0}, "training step: out of memory"),
        unsupported: ("unsupported", {}, "needs CUDA"),
        plain_runtime_oom: ("oom", {}, "RuntimeError: CUDA error: out of memory"),
        lambda: {"m": 2.0}: ("ok", {"m": 2.0}, None),
    }
    for i, (measure, (status, metrics, reason)) in enumerate(outcomes.items()):
        r = record.run_cell("e2e", {"c": i}, tmp_path / f"{i}.json", lambda: prov, measure)
        assert (r["status"], r["metrics"], r["reason"]) == (status, metrics, reason)
        assert record.load_record(tmp_path / f"{i}.json") == r
    with pytest.raises(ZeroDivisionError):  # any other error fails, without a record
        record.run_cell("e2e", {"c": 1}, tmp_path / "r.json", lambda: prov, lambda: 1 / 0)
    assert not (tmp_path / "r.json").exists()


def test_two_records_of_one_cell_are_named(prov):
    a, other = make(prov), make(prov, cell={"model": "mini"})
    record.check_unique({"a.json": a, "c.json": other})
    with pytest.raises(record.RecordError, match=r"^b.json: claims the same cell as a.json"):
        record.check_unique({"a.json": a, "b.json": dict(a), "c.json": other})
    # the same cell with another attention (a whole-model setting) is another cell
    flash = copy.deepcopy(a)
    flash["provenance"]["settings"]["attention"] = "flash"
    record.check_unique({"a.json": a, "f.json": flash})
