"""The record contract: schema, atomic writes, and expected outcomes turned into records."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from lmperf.core import record
from lmperf.core.device import provenance


def _prov():
    return provenance("cpu", {"a": 1})


def test_valid_record_roundtrip(tmp_path):
    r = record.make_record("e2e", {"model": "tiny"}, "ok", {"forward_ms_mean": 1.5, "x": float("nan")}, _prov())
    path = record.write_record(tmp_path / "sub" / "r.json", r)
    loaded = record.load_record(path)
    assert loaded["metrics"] == {"forward_ms_mean": 1.5, "x": None}  # NaN is not JSON: stored as null
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]  # no temporary file left


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r.update(status="crashed"),
        lambda r: r.pop("provenance"),
        lambda r: r.update(status="oom", reason=None),  # a non-ok record needs a reason
        lambda r: r.update(metrics={}),  # an ok record needs metrics
        lambda r: r["provenance"].update(device_slug="H100 GPU"),
    ],
)
def test_schema_rejects_bad_records(mutate):
    r = record.make_record("e2e", {"model": "tiny"}, "ok", {"m": 1}, _prov())
    mutate(r)
    with pytest.raises(jsonschema.ValidationError):
        record.validate(r)


def test_failed_write_leaves_previous_record_intact(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    good = record.make_record("e2e", {"model": "tiny"}, "ok", {"m": 1}, _prov())
    record.write_record(path, good)

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dump", boom)
    with pytest.raises(OSError):
        record.write_record(path, good)
    assert json.loads(path.read_text())["metrics"] == {"m": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_run_cell_turns_oom_into_a_record(tmp_path):
    def measure():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    r = record.run_cell("e2e", {"model": "tiny"}, tmp_path / "r.json", _prov, measure)
    assert r["status"] == "oom" and "Tried to allocate" in r["reason"]
    assert record.load_record(tmp_path / "r.json")["status"] == "oom"


def test_run_cell_keeps_partial_metrics_and_unsupported(tmp_path):
    def partial():
        raise record.PartialOutOfMemory("training step: out of memory", {"inference_forward_ms_mean": 3.0})

    r = record.run_cell("e2e", {"c": 1}, tmp_path / "p.json", _prov, partial)
    assert r["status"] == "oom" and r["metrics"] == {"inference_forward_ms_mean": 3.0}

    def unsupported():
        raise record.Unsupported("needs CUDA")

    r = record.run_cell("memory", {"c": 1}, tmp_path / "u.json", _prov, unsupported)
    assert r["status"] == "unsupported" and r["reason"] == "needs CUDA"


def test_run_cell_lets_unexpected_errors_fail_without_a_record(tmp_path):
    def measure():
        raise ZeroDivisionError("bug")

    with pytest.raises(ZeroDivisionError):
        record.run_cell("e2e", {"c": 1}, tmp_path / "r.json", _prov, measure)
    assert not (tmp_path / "r.json").exists()


def test_provenance_names_device_versions_and_settings():
    p = _prov()
    assert p["device_slug"] == "cpu" and p["torch_version"] == torch.__version__
    assert p["settings"] == {"a": 1} and "git_commit" in p and "start_time" in p


def test_git_state_named_by_the_environment_wins_over_the_checkout(monkeypatch):
    from lmperf.core import device as devices

    monkeypatch.setenv("LMPERF_GIT_COMMIT", "a" * 40)
    monkeypatch.setenv("LMPERF_GIT_DIRTY", "0")
    assert devices.git_state() == {"git_commit": "a" * 40, "git_dirty": False}
    monkeypatch.setenv("LMPERF_GIT_DIRTY", "1")
    assert devices.git_state()["git_dirty"] is True
    monkeypatch.delenv("LMPERF_GIT_COMMIT")
    monkeypatch.delenv("LMPERF_GIT_DIRTY")
    state = devices.git_state()  # this checkout: git's answer
    assert len(state["git_commit"]) == 40 or state["git_commit"] == "unknown"


def test_records_are_readable_by_everyone(tmp_path):
    import stat

    path = record.write_record(tmp_path / "r.json", record.make_record("e2e", {"c": 1}, "ok", {"m": 1}, _prov()))
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


@pytest.mark.parametrize(
    "text, problem",
    [
        ('{"kind": "e2e", "cell": {"c"', "not valid JSON"),  # truncated
        (
            '{"kind": "e2e", "cell": {"c": 1}, "status": "ok"}',
            "not a valid record (at the top level: 'reason' is a required",
        ),
        ("[1, 2]", "not a valid record"),
    ],
)
def test_a_bad_record_names_its_path_the_problem_and_the_fix(tmp_path, text, problem):
    path = tmp_path / "tiny.json"
    path.write_text(text)
    with pytest.raises(record.RecordError) as err:
        record.load_record(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and problem in message
    assert message.endswith("delete it and rerun `snakemake --cores 1 all` to re-measure")
    assert len(message.splitlines()) == 1


def test_two_records_of_one_cell_are_named():
    r = record.make_record("e2e", {"model": "tiny"}, "ok", {"m": 1}, _prov())
    other = record.make_record("e2e", {"model": "mini"}, "ok", {"m": 1}, _prov())
    record.check_unique({"a.json": r, "c.json": other})
    with pytest.raises(record.RecordError, match=r"^b.json: claims the same cell as a.json"):
        record.check_unique({"a.json": r, "b.json": dict(r), "c.json": other})


def test_provenance_keeps_the_code_version_the_workflow_names(monkeypatch):
    monkeypatch.setenv("LMPERF_CODE_VERSION", "0123456789abcdef")
    assert provenance("cpu", {})["code_version"] == "0123456789abcdef"
    monkeypatch.delenv("LMPERF_CODE_VERSION")
    assert provenance("cpu", {})["code_version"] is None


def test_git_and_the_driver_are_asked_once_per_process(monkeypatch):
    from lmperf.core import device as devices

    monkeypatch.delenv("LMPERF_GIT_COMMIT", raising=False)
    calls = []
    monkeypatch.setattr(
        devices, "_git", lambda *args: calls.append(args) or ("b" * 40 if args[0] == "rev-parse" else "")
    )
    devices._checkout_git_state.cache_clear()
    try:
        first = devices.git_state()
        first["git_dirty"] = True  # a caller's copy: the process's answer stays
        assert devices.git_state() == {"git_commit": "b" * 40, "git_dirty": False}
        assert [c[0] for c in calls] == ["rev-parse", "status"]
    finally:
        devices._checkout_git_state.cache_clear()
    runs = []

    class Done:
        returncode, stdout = 0, "580.159.04\n"

    monkeypatch.setattr(devices.subprocess, "run", lambda *a, **k: runs.append(a) or Done())
    devices._driver_version.cache_clear()
    try:
        assert devices._driver_version() == devices._driver_version() == "580.159.04"
        assert len(runs) == 1
    finally:
        devices._driver_version.cache_clear()
