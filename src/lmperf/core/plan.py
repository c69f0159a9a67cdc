"""What a run must do: each kind's grid module expands its config slice into ``Job`` objects, and a
record on disk is stale when its fingerprint or settings (both kept in the record, so any clone can
tell) differ from its job's now, misplaced when its kind, device or cell contradict its path. No torch.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from lmperf.core.fingerprint import DEFAULT_ROOT, fingerprint
from lmperf.kinds import CELLS


@dataclasses.dataclass(frozen=True)
class Job:
    cell: str  # a name of lmperf.kinds.CELLS
    records: dict  # record path -> the record's `cell` (grid coordinates)
    settings: dict  # everything the cell runs with; the records keep it (provenance.settings)
    output: str  # the record path, or a template of it over the cell's coordinates ({seq_len}, …)
    resources: dict = dataclasses.field(default_factory=dict)  # threads, mem_mb, runtime (minutes)
    after: tuple = ()  # records to measure first when both are measured in one run (their job's outputs)
    priority: int = 0
    trials: int = 1  # independent trials of a timed cell (lmperf.core.trials); 1 for the others

    @property
    def name(self) -> str:
        stem = Path(sorted(self.records)[0]).stem
        return "".join(c if c.isalnum() else "_" for c in f"{self.cell}__{stem}")

    def argument(self) -> str:
        return json.dumps({"settings": self.settings, "output": self.output}, sort_keys=True)

    def fingerprint(self, root: Path = DEFAULT_ROOT) -> str:
        return fingerprint(CELLS[self.cell], self.settings, root)


def canonical(value) -> str:
    """Settings as comparable text (key order, and tuples against lists, do not count)."""
    return json.dumps(value, sort_keys=True)


def why_stale(record: dict, job: Job, root: Path = DEFAULT_ROOT) -> str | None:
    """Why ``record`` must be measured again for ``job``, or None when it is current."""
    provenance = record["provenance"]
    if provenance.get("code_version") != job.fingerprint(root):
        return "measured with other code"
    if canonical(provenance.get("settings")) != canonical(job.settings):
        old, new = provenance.get("settings") or {}, job.settings
        keys = sorted(k for k in set(old) | set(new) if canonical(old.get(k)) != canonical(new.get(k)))
        return "measured with other settings (" + ", ".join(keys) + ")"
    return None


def misplaced(path: str, record: dict, expected_path: str | None) -> str | None:
    """What about ``record`` contradicts its path ``results/<device>/<kind>/<name>.json``, or None;
    ``expected_path`` is where the record's own cell says it belongs (None: its cell names no record)."""
    parts = Path(path).parts
    device, kind = parts[-3], parts[-2]
    if record["kind"] != kind:
        return f"a record of kind {record['kind']!r} in the folder of kind {kind!r}"
    slug = record["provenance"].get("device_slug")
    if slug != device:
        return f"a record measured on {slug!r} in the folder of device {device!r}"
    if expected_path != str(path):
        where = f"belongs at {expected_path}" if expected_path else "names no record of this kind"
        return f"its cell {canonical(record['cell'])} {where}"
    return None


def cell_resources(model: str | None = None, *, gpu: bool, runtime: int, small_mb: int = 8000, large_mb: int = 32000):
    """A job's resources: threads (a GPU cell launches kernels on one and serves torch.compile on a
    second), the GPU, host memory (2.7B holds ~14 GB of fp32 weights in host RAM) and its time budget
    in minutes (the runner kills a cell past it)."""
    big = model is not None and parameters(model) >= 0.5e9
    return {"threads": 2 if gpu else 1, "gpu": int(gpu), "mem_mb": large_mb if big else small_mb, "runtime": runtime}


def parameters(model: str) -> int:
    from lmperf.core.sizes import config_from_name, parameter_count

    return parameter_count(config_from_name(model))
