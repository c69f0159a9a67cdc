"""The record: one JSON object per measured cell (``workflow/schemas/record.schema.json``), validated
and written atomically. Status ``ok``, ``oom`` (does not fit: an answer, not a failure) or
``unsupported`` (e.g. no CUDA), with a reason; ``run_cell`` lets every other error propagate.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from functools import cache
from pathlib import Path

import jsonschema

SCHEMA_PATH = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "record.schema.json"
RERUN_HINT = "delete it and rerun `snakemake --cores 1 all` to re-measure"


class RecordError(ValueError):
    """A record file that cannot be used: its path, what is wrong, and the fix."""

    def __init__(self, path, problem: str):
        super().__init__(f"{path}: {problem}; {RERUN_HINT}")
        self.path = str(path)


class Unsupported(Exception):
    """A measurement that cannot run here (no CUDA, a missing tool): becomes a record."""


class PartialOutOfMemory(Exception):
    """Part of a cell ran out of memory; what was measured before and after is kept."""

    def __init__(self, reason: str, metrics: dict):
        super().__init__(reason)
        self.metrics = metrics


@cache
def validator() -> jsonschema.protocols.Validator:
    """The schema's validator, the schema checked once per process (not per record, as
    ``jsonschema.validate`` would: 4.5 s against 0.07 s for 777 records)."""
    schema = json.loads(SCHEMA_PATH.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _clean(value):
    """JSON-safe copy: NaN/inf become None, tuples become lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def make_record(kind: str, cell: dict, status: str, metrics: dict, provenance: dict, reason: str | None = None) -> dict:
    record = _clean(dict(kind=kind, cell=cell, status=status, reason=reason, metrics=metrics, provenance=provenance))
    validate(record)
    return record


def validate(record: dict) -> None:
    """Raise the best-matching jsonschema.ValidationError where ``record`` breaks the schema."""
    error = jsonschema.exceptions.best_match(validator().iter_errors(record))
    if error is not None:
        raise error


def write_record(path: str | os.PathLike, record: dict) -> Path:
    """Validate, then write atomically (``write_atomic``)."""
    validate(record)
    return write_atomic(path, json.dumps(record, indent=1) + "\n")


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write via a temporary file beside ``path`` and a rename: readers never see half a file, and a
    failed write leaves the previous one. Its mode is what the umask gives any file (not mkstemp's 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_record(path: str | os.PathLike) -> dict:
    """The record at ``path``; RecordError where it is unreadable, truncated or invalid."""
    try:
        record = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(path, f"not a readable UTF-8 file ({type(exc).__name__}: {exc})") from None
    except json.JSONDecodeError as exc:
        raise RecordError(path, f"not valid JSON (truncated or edited? {exc})") from None
    try:
        validate(record)
    except jsonschema.ValidationError as exc:
        where = "/".join(map(str, exc.absolute_path)) or "the top level"
        raise RecordError(path, f"not a valid record (at {where}: {exc.message})") from None
    return record


def cell_key(record: dict) -> str:
    """What a record measured (kind, cell, and the attention its settings hold) as one string."""
    attention = record["provenance"].get("settings", {}).get("attention")
    return json.dumps([record["kind"], record["cell"], attention], sort_keys=True)


def check_unique(records: dict[str, dict]) -> None:
    """Raise RecordError where two records ({path: record}) claim the same cell."""
    seen: dict[str, str] = {}
    for path in sorted(records):
        key = cell_key(records[path])
        if key in seen:
            raise RecordError(path, f"claims the same cell as {seen[key]} ({key}); one of them is a copy")
        seen[key] = path


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    # some allocators (inside Triton, cuBLAS workspaces) raise a plain RuntimeError
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    )


def run_cell(
    kind: str, cell: dict, output: str | os.PathLike, provenance: Callable[[], dict], measure: Callable[[], dict]
) -> dict:
    """Run ``measure`` and write its record: ok, oom or unsupported; anything else raises."""
    try:
        metrics = measure()
        status, reason = "ok", None
    except Unsupported as exc:
        metrics, status, reason = {}, "unsupported", str(exc)
    except PartialOutOfMemory as exc:
        metrics, status, reason = exc.metrics, "oom", str(exc)
    except Exception as exc:  # noqa: BLE001 - only OOM is swallowed, the rest re-raises
        if not is_out_of_memory(exc):
            raise
        traceback.print_exc(file=sys.stderr)
        metrics, status, reason = {}, "oom", f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        free_memory()
    record = make_record(kind, cell, status, metrics, provenance(), reason)
    write_record(output, record)
    print(f"[{kind}] {cell} -> {status}" + (f" ({reason})" if reason else ""), file=sys.stderr)
    return record


def free_memory(device=None) -> None:
    """Collect garbage and return the CUDA allocator's cache (on ``device``, or wherever CUDA runs)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available() and (device is None or device.type == "cuda"):
        torch.cuda.empty_cache()
