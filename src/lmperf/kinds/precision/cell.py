"""Precision cell: the mixed-precision probes, one record each (mixed_precision_accumulation and
benchmarking_mixed_precision (a)-(b)), on the device it runs on: the dtypes autocast picks differ
between CUDA and CPU, so they are measured, not assumed."""

from __future__ import annotations

import functools
import sys

import torch

from lmperf.core import device as devices
from lmperf.core.cell import parse_job
from lmperf.kinds.precision import probes


def measure(probe: str, args, device: torch.device) -> dict:
    """One probe's metrics, from its nested settings (``args.accumulation`` and so on)."""
    torch.manual_seed(args.seed)
    acc, toy, ln = args.accumulation, args.toy_model, args.layer_norm
    if probe == "accumulation":
        results = [probes.accumulate(v, acc["steps"], acc["increment"], device) for v in probes.ACCUMULATION_VARIANTS]
        metrics = {"results": results}
    elif probe == "toy_model":
        shape = (toy["in_features"], toy["out_features"], toy["batch_size"], args.seed)
        metrics = {"autocast": {d: probes.toy_model_dtypes(d, device, *shape) for d in toy["autocast_dtypes"]}}
    else:
        shape = (ln["std"], ln["width"], ln["rows"], device, args.seed)
        metrics = {"results": [probes.layer_norm_errors(d, m, *shape) for d in ln["dtypes"] for m in ln["means"]]}
    return {**metrics, "device_type": device.type}


def main(argv=None) -> int:
    job = parse_job("precision", argv, __doc__.splitlines()[0])
    device = devices.check_device(job.args.device)
    for probe in job.args.probes:
        job.write("precision", {"probe": probe}, functools.partial(measure, probe, job.args, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
