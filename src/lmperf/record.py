"""The record: one JSON object per measured cell, validated and written atomically.

Schema: ``workflow/schemas/record.schema.json``. Status ``ok``, ``oom`` (the configuration
does not fit: an answer, not a failure) or ``unsupported`` (e.g. no CUDA), with a reason.
``run_cell`` turns the expected outcomes into records and lets every other error propagate,
so the job fails loudly with its traceback in the rule's log.
"""

from __future__ import annotations

import glob
import json
import math
import os
import sys
import tempfile
import traceback
from functools import lru_cache
from pathlib import Path
from typing import Callable

import jsonschema

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "record.schema.json"
STATUSES = ("ok", "oom", "unsupported")


class Unsupported(Exception):
    """Raised by a measurement that cannot run here (no CUDA, missing tool): becomes a record."""


class PartialOutOfMemory(Exception):
    """Part of a cell ran out of memory; what was measured before and after is kept."""

    def __init__(self, reason: str, metrics: dict):
        super().__init__(reason)
        self.metrics = metrics


@lru_cache(maxsize=1)
def _schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def _clean(value):
    """JSON-safe copy: NaN/inf become None, tuples become lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def make_record(kind: str, cell: dict, status: str, metrics: dict, provenance: dict,
                reason: str | None = None) -> dict:
    record = {"kind": kind, "cell": cell, "status": status, "reason": reason,
              "metrics": metrics, "provenance": provenance}
    record = _clean(record)
    validate(record)
    return record


def validate(record: dict) -> None:
    jsonschema.validate(record, _schema())


def write_record(path: str | os.PathLike, record: dict) -> Path:
    """Validate, then write via a temporary file in the same directory and rename."""
    validate(record)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_record(path: str | os.PathLike) -> dict:
    record = json.loads(Path(path).read_text())
    validate(record)
    return record


def load_records(pattern: str) -> list[dict]:
    """All records matching a glob pattern, sorted by path."""
    return [load_record(p) for p in sorted(glob.glob(pattern))]


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    # Some allocators (e.g. inside Triton or cuBLAS workspaces) raise a plain RuntimeError.
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def run_cell(kind: str, cell: dict, output: str | os.PathLike, provenance: Callable[[], dict],
             measure: Callable[[], dict]) -> dict:
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
        _free_cuda_memory()
    record = make_record(kind, cell, status, metrics, provenance(), reason)
    write_record(output, record)
    print(f"[{kind}] {cell} -> {status}" + (f" ({reason})" if reason else ""), file=sys.stderr)
    return record


def _free_cuda_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
