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
from lmperf.core.cell import base_parser
from lmperf.core.record import run_cell
from lmperf.kinds.precision import probes as precision

PROBES = ("accumulation", "toy_model", "layer_norm")


def parse_args(argv=None):
    p = base_parser(__doc__.splitlines()[0])
    # the long names are config.yaml's keys (grids.<grid>.precision.<table>.<key>), as the workflow passes them
    p.add_argument("--probes", nargs="+", choices=PROBES, default=list(PROBES))
    p.add_argument("--accumulation-steps", type=int, default=1000)
    p.add_argument("--accumulation-increment", "--increment", dest="increment", type=float, default=0.01)
    p.add_argument("--toy-model-in-features", "--toy-in-features", dest="toy_in_features", type=int, default=16)
    p.add_argument("--toy-model-out-features", "--toy-out-features", dest="toy_out_features", type=int, default=4)
    p.add_argument("--toy-model-batch-size", "--toy-batch-size", dest="toy_batch_size", type=int, default=8)
    p.add_argument(
        "--toy-model-autocast-dtypes",
        "--autocast-dtypes",
        dest="autocast_dtypes",
        nargs="+",
        choices=["fp16", "bf16"],
        default=["fp16", "bf16"],
    )
    p.add_argument("--layer-norm-width", "--ln-width", dest="ln_width", type=int, default=2560)
    p.add_argument("--layer-norm-rows", "--ln-rows", dest="ln_rows", type=int, default=16)
    p.add_argument(
        "--layer-norm-means", "--ln-means", dest="ln_means", type=float, nargs="+", default=[0.0, 10.0, 100.0]
    )
    p.add_argument("--layer-norm-std", "--ln-std", dest="ln_std", type=float, default=1.0)
    p.add_argument(
        "--layer-norm-dtypes",
        "--ln-dtypes",
        dest="ln_dtypes",
        nargs="+",
        choices=["fp16", "bf16", "fp32"],
        default=["fp16", "bf16", "fp32"],
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if "{probe}" not in args.output and len(args.probes) > 1:
        p.error("--output must contain {probe} when several probes run")
    return args


def measure_accumulation(args, device) -> dict:
    results = [
        precision.accumulate(v, args.accumulation_steps, args.increment, device)
        for v in precision.ACCUMULATION_VARIANTS
    ]
    return {"results": results, "device_type": device.type}


def measure_toy_model(args, device) -> dict:
    entries = {}
    for dtype in args.autocast_dtypes:
        try:
            entries[dtype] = {
                "status": "ok",
                **precision.toy_model_dtypes(
                    dtype, device, args.toy_in_features, args.toy_out_features, args.toy_batch_size, args.seed
                ),
            }
        except NotImplementedError as exc:
            entries[dtype] = {"status": "unsupported", "reason": str(exc)}
    return {"autocast": entries, "device_type": device.type}


def measure_layer_norm(args, device) -> dict:
    rows = [
        precision.layer_norm_errors(dtype, mean, args.ln_std, args.ln_width, args.ln_rows, device, args.seed)
        for dtype in args.ln_dtypes
        for mean in args.ln_means
    ]
    return {"results": rows, "device_type": device.type}


MEASURE = {"accumulation": measure_accumulation, "toy_model": measure_toy_model, "layer_norm": measure_layer_norm}


def main(argv=None) -> int:
    args = parse_args(argv)
    device = devices.check_device(args.device)
    settings = {k: v for k, v in vars(args).items() if k != "output"}
    for probe in args.probes:
        torch.manual_seed(args.seed)
        run_cell(
            "precision",
            {"probe": probe},
            args.output.format(probe=probe),
            lambda: devices.provenance(args.device, settings),
            functools.partial(MEASURE[probe], args, device),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
