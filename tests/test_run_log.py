"""Runs' starts beside a device's records (lmperf.core.run_log): written by the workflow, read by the header."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from lmperf.core import run_log

UTC = dt.timezone.utc


def test_starts_are_appended_and_read_back_in_order(tmp_path):
    assert run_log.run_starts(tmp_path) == []
    later, earlier = dt.datetime(2026, 11, 26, 5, 0, 1, tzinfo=UTC), dt.datetime(2026, 11, 26, 4, 0, tzinfo=UTC)
    run_log.note_start(tmp_path, later)
    path = run_log.note_start(tmp_path, earlier)
    assert path == tmp_path / run_log.RUNS_FILE
    assert [json.loads(line)["started"] for line in path.read_text().splitlines()] == [
        "2026-11-26T05:00:01.000+00:00",
        "2026-11-26T04:00:00.000+00:00",
    ]
    assert run_log.run_starts(tmp_path) == [earlier, later]
    now = run_log.run_starts(run_log.note_start(tmp_path / "new").parent)[0]
    assert now.tzinfo is not None and abs((dt.datetime.now(UTC) - now).total_seconds()) < 60


@pytest.mark.parametrize(
    "line, problem",
    [
        ("{not json", "JSONDecodeError"),
        ('{"host": "vm"}', "KeyError"),
        ('{"started": "2026-11-26T05:00:00"}', "time zone"),
    ],
)
def test_a_broken_line_is_named_with_its_file_and_number(tmp_path, line, problem):
    run_log.note_start(tmp_path, dt.datetime(2026, 11, 26, tzinfo=UTC))
    with open(tmp_path / run_log.RUNS_FILE, "a") as f:
        f.write(line + "\n")
    with pytest.raises(ValueError, match=rf"{run_log.RUNS_FILE}:2: .*{problem}"):
        run_log.run_starts(tmp_path)


def test_a_start_without_its_time_zone_is_refused(tmp_path):
    with pytest.raises(ValueError, match="time zone"):
        run_log.note_start(tmp_path, dt.datetime(2026, 11, 26))
    assert not (tmp_path / run_log.RUNS_FILE).exists()
