"""The grid's reader (lmperf.record_reading) against the cells' (lmperf.record.load_record): the same
records and the same errors, one schema check."""

from __future__ import annotations

import copy
import glob
import json
from pathlib import Path

import pytest

from lmperf import record, record_reading
from lmperf.device import provenance

ROOT = Path(__file__).resolve().parents[1]


def _record() -> dict:
    return record.make_record("e2e", {"model": "tiny"}, "ok", {"forward_ms_mean": 1.5}, provenance("cpu", {"a": 1}))


def _bad_records() -> list[tuple[str, str]]:
    """(file text, what is wrong) of truncated and schema-invalid records, errors deep and at the top."""
    good = _record()
    wrong_status, wrong_slug, no_reason = (copy.deepcopy(good) for _ in range(3))
    wrong_status["status"] = "crashed"
    wrong_slug["provenance"]["device_slug"] = "H100 GPU"
    no_reason.update(status="oom", reason=None)
    return [
        ('{"kind": "e2e", "cell": {"c"', "truncated"),
        ('{"kind": "e2e", "cell": {"c": 1}, "status": "ok"}', "fields missing"),
        ("[1, 2]", "not an object"),
        (json.dumps(wrong_status), "unknown status"),
        (json.dumps(wrong_slug), "bad slug, deep"),
        (json.dumps(no_reason), "oom without a reason"),
    ]


@pytest.mark.parametrize("text, what", _bad_records(), ids=[w for _, w in _bad_records()])
def test_a_bad_record_raises_what_the_cells_reader_raises(tmp_path, text, what):
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(record.RecordError) as cells:
        record.load_record(path)
    with pytest.raises(record.RecordError) as grid:
        record_reading.read_record(path)
    assert str(grid.value) == str(cells.value) and grid.value.path == str(path)


def test_committed_records_read_alike_and_the_schema_is_checked_once(monkeypatch):
    paths = sorted(glob.glob(str(ROOT / "results" / "*" / "*" / "*.json")))
    paths = [p for p in paths if "/tables/" not in p and "/stamps/" not in p][:200]
    assert paths, "no committed records to read"
    checks = []
    record_reading.validator.cache_clear()
    cls = type(record_reading.validator())
    record_reading.validator.cache_clear()
    real = cls.check_schema.__func__
    monkeypatch.setattr(cls, "check_schema", classmethod(lambda c, s, **kw: checks.append(1) or real(c, s, **kw)))
    for path in paths:
        assert record_reading.read_record(path) == record.load_record(path)
    assert len(checks) == 1 + len(paths)  # the grid's reader once, the cells' reader once per record
