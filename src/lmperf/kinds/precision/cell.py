"""Precision cell: the mixed-precision probes, one record each (``--output`` has ``{probe}``).

Answers mixed_precision_accumulation and benchmarking_mixed_precision (a)-(b), on the device
it runs on (CUDA or CPU; the dtypes autocast picks differ between them, so they are measured):

- ``accumulation``: the four loops adding 0.01 a thousand times, with their exact results.
- ``toy_model``: the toy model's dtypes under fp16 and under bf16 autocast; an autocast dtype
  this device does not support is recorded as unsupported in its entry.
- ``layer_norm``: which parts of layer normalisation lose accuracy in fp16 and in bf16
  (see ``lmperf.kinds.precision.probes.layer_norm_errors``), for activations with growing means.

    python -m lmperf.kinds.precision.cell --output 'results/cpu/precision/{probe}.json' --device cpu
"""

from __future__ import annotations

import functools
import sys

import torch

from lmperf.core import device as devices
from lmperf.core.cell import parse_job
from lmperf.kinds.precision import probes as precision

PROBES = ("accumulation", "toy_model", "layer_norm")


def measure_accumulation(args, device) -> dict:
    results = [
        precision.accumulate(v, args.accumulation["steps"], args.accumulation["increment"], device)
        for v in precision.ACCUMULATION_VARIANTS
    ]
    return {"results": results, "device_type": device.type}


def measure_toy_model(args, device) -> dict:
    entries = {}
    toy = args.toy_model
    for dtype in toy["autocast_dtypes"]:
        try:
            entries[dtype] = {
                "status": "ok",
                **precision.toy_model_dtypes(
                    dtype, device, toy["in_features"], toy["out_features"], toy["batch_size"], args.seed
                ),
            }
        except NotImplementedError as exc:
            entries[dtype] = {"status": "unsupported", "reason": str(exc)}
    return {"autocast": entries, "device_type": device.type}


def measure_layer_norm(args, device) -> dict:
    ln = args.layer_norm
    rows = [
        precision.layer_norm_errors(dtype, mean, ln["std"], ln["width"], ln["rows"], device, args.seed)
        for dtype in ln["dtypes"]
        for mean in ln["means"]
    ]
    return {"results": rows, "device_type": device.type}


MEASURE = {"accumulation": measure_accumulation, "toy_model": measure_toy_model, "layer_norm": measure_layer_norm}


def main(argv=None) -> int:
    job = parse_job("precision", argv, __doc__.splitlines()[0])
    args = job.args
    device = devices.check_device(args.device)
    for probe in args.probes:
        torch.manual_seed(args.seed)
        job.write("precision", {"probe": probe}, functools.partial(MEASURE[probe], args, device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
