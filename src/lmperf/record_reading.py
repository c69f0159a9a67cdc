"""Reading a grid's records (the workflow's and the reports'): one schema validator for them all.

``lmperf.record.load_record``, which cells use for the few records they read, validates with
``jsonschema.validate``, and that checks the schema itself before every record: 4.5 s for the H100's
777 records on a 2-core machine, most of Snakemake's start in a dry run and of each report job. Here
the schema is checked once and one validator reads every record (0.07 s for the same 777), with the
same errors (``RecordError`` naming the file and the fix). ``lmperf.record`` is in every cell's code
version, so it keeps its own reader until the cells' code next changes (bench/grid_time_notes.md).
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

import jsonschema

from lmperf.record import SCHEMA_PATH, RecordError


@cache
def validator() -> jsonschema.protocols.Validator:
    """The record schema's validator, the schema checked once."""
    schema = json.loads(SCHEMA_PATH.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def read_record(path: str | os.PathLike) -> dict:
    """The record at ``path``; a truncated or schema-invalid file raises RecordError naming it (the
    error jsonschema.validate would raise: the best match among the record's errors)."""
    try:
        record = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise RecordError(path, f"not valid JSON (truncated or edited? {exc})") from None
    error = jsonschema.exceptions.best_match(validator().iter_errors(record))
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "the top level"
        raise RecordError(path, f"not a valid record (at {where}: {error.message})")
    return record
