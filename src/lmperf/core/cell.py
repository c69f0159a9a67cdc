"""What every cell shares: its job (``python -m lmperf <cell> --device SLUG --job JSON``: every setting,
the schema's defaults filled in, and the records' paths), the device check and writing records, which
keep the settings as they came and the code's fingerprint.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
from collections.abc import Callable

from lmperf.core import device as devices
from lmperf.core.device import process_age_s, process_clock  # noqa: F401 - the cells' names for them
from lmperf.core.record import free_memory, run_cell  # noqa: F401 - free_memory: the cells' name for it


@dataclasses.dataclass
class CellJob:
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
        """Measure ``cell`` and write its record at ``output`` (default: the job's output template filled
        in with the cell's coordinates)."""
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
