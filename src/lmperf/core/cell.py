"""What every cell shares: its job (settings and the records it writes), the device check,
writing records,.

A cell is started as ``python -m lmperf <cell> --device SLUG --job JSON`` (lmperf.core.runner),
where the job (lmperf.core.plan.Job) holds every setting the cell runs with — the schema's
defaults already filled in; a cell has no defaults of its own — and the path of each record it
writes, by the record's cell coordinates. The settings go into every record as they came
(``provenance.settings``), with the code's fingerprint, so the workflow can tell a stale record.

The measuring harness itself: ``lmperf.core.timing`` (timers, pass budgets), ``lmperf.core.oom``
(out of memory as an outcome), ``lmperf.core.dtypes`` (precision names, autocast),
``lmperf.core.units``, ``lmperf.core.flops.tflops_per_s``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
from collections.abc import Callable

import torch

from lmperf.core import device as devices
from lmperf.core.device import process_age_s, process_clock  # noqa: F401 - the cells' names for them
from lmperf.core.record import run_cell


@dataclasses.dataclass
class CellJob:
    """One job of a cell: where it runs, what it runs with, the records it writes."""

    cell: str  # its name in lmperf.kinds.CELLS
    device: str  # the device slug its records' paths name
    settings: dict
    output: str  # the record path, or its template over the cell's coordinates ({seq_len}, …)

    @property
    def args(self) -> types.SimpleNamespace:
        """The settings as attributes (``args.batch_size``), with ``device`` and ``output``."""
        return types.SimpleNamespace(**self.settings, device=self.device, output=self.output)

    def provenance(self) -> dict:
        return devices.provenance(self.device, self.settings, self.cell)

    def write(self, kind: str, cell: dict, measure: Callable[[], dict], output: str | None = None) -> dict:
        """Measure ``cell`` and write its record at ``output`` (default: the job's output filled in with
        the cell's coordinates): ok, oom or unsupported; anything else raises."""
        path = output or self.output.format(**cell)
        return run_cell(kind, cell, path, self.provenance, measure)


def parse_job(cell: str, argv=None, description: str = "") -> CellJob:
    """``--device SLUG --job JSON`` of a cell's command line."""
    parser = argparse.ArgumentParser(prog=f"python -m lmperf {cell}", description=description)
    parser.add_argument("--device", required=True, help="device slug the records' paths name (cpu, h100, …)")
    parser.add_argument("--job", required=True, help='{"settings": {...}, "output": path or template}')
    options = parser.parse_args(argv)
    job = json.loads(options.job)
    return CellJob(cell, options.device, job["settings"], job["output"])


def free_memory(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
