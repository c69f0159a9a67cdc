"""lmperf.core.record's one schema validator against ``jsonschema.validate`` (the independent reference):
the same records accepted, the same error for every bad one, and the schema checked once."""

from __future__ import annotations

import copy
import glob
import json
from pathlib import Path

import jsonschema
import pytest

from lmperf.core import record
from lmperf.core.device import provenance

ROOT = Path(__file__).resolve().parents[1]


def _record() -> dict:
    return record.make_record("e2e", {"model": "tiny"}, "ok", {"forward_ms_mean": 1.5}, provenance("cpu", {"a": 1}))


def _schema() -> dict:
    return json.loads(record.SCHEMA_PATH.read_text())


def _bad_records() -> list[tuple[str, str]]:
    """(file text, what is wrong) of truncated and schema-invalid records, errors deep and at the top."""
    good = _record()
    wrong_status, wrong_slug, no_reason, two_wrong = (copy.deepcopy(good) for _ in range(4))
    wrong_status["status"] = "crashed"
    wrong_slug["provenance"]["device_slug"] = "H100 GPU"
    no_reason.update(status="oom", reason=None)
    two_wrong["status"] = "crashed"
    two_wrong["provenance"]["device_slug"] = "H100 GPU"
    return [
        ('{"kind": "e2e", "cell": {"c"', "truncated"),
        ('{"kind": "e2e", "cell": {"c": 1}, "status": "ok"}', "fields missing"),
        ("[1, 2]", "not an object"),
        (json.dumps(wrong_status), "unknown status"),
        (json.dumps(wrong_slug), "bad slug, deep"),
        (json.dumps(no_reason), "oom without a reason"),
        (json.dumps(two_wrong), "two errors"),
    ]


@pytest.mark.parametrize("text, what", _bad_records(), ids=[w for _, w in _bad_records()])
def test_a_bad_record_raises_what_jsonschema_validate_raises(tmp_path, text, what):
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(record.RecordError) as err:
        record.load_record(path)
    assert err.value.path == str(path) and record.RERUN_HINT in str(err.value)
    try:
        instance = json.loads(text)
    except json.JSONDecodeError:
        assert "not valid JSON" in str(err.value)
        return
    with pytest.raises(jsonschema.ValidationError) as reference:
        jsonschema.validate(instance, _schema())
    with pytest.raises(jsonschema.ValidationError) as ours:
        record.validate(instance)
    assert ours.value.message == reference.value.message
    assert list(ours.value.absolute_path) == list(reference.value.absolute_path)
    assert reference.value.message in str(err.value)


def test_committed_records_are_valid_and_the_schema_is_checked_once(monkeypatch):
    paths = sorted(glob.glob(str(ROOT / "results" / "*" / "*" / "*.json")))
    paths = [p for p in paths if "/tables/" not in p and "/stamps/" not in p][:200]
    assert paths, "no committed records to read"
    checks = []
    record.validator.cache_clear()
    cls = type(record.validator())
    record.validator.cache_clear()
    real = cls.check_schema.__func__
    monkeypatch.setattr(cls, "check_schema", classmethod(lambda c, s, **kw: checks.append(1) or real(c, s, **kw)))
    schema = _schema()
    for path in paths:
        loaded = record.load_record(path)
        jsonschema.validate(loaded, schema)  # the reference accepts what the validator accepted
        assert loaded == json.loads(Path(path).read_text())
    assert len(checks) == 1 + len(paths)  # our validator once; jsonschema.validate once per record
    record.validator.cache_clear()
