"""flash_forward and flash_backward: FlashAttention-2 against float64 attention (one record per implementation).

``pytorch``: the tiled autograd.Function; ``triton``: the Triton forward and backward kernels. Over
every precision x head dim x causal x shape (batch, n_queries, n_keys) of the grid, on fresh random
inputs (the seed is in the record, one per entry), it runs forward and backward through the
autograd.Function and records the relative Frobenius error of O, L, dQ, dK and dV against float64
attention on the same rounded inputs (``lmperf.kernels.flash.reference.reference_with_grads``), the
tolerance it is held to, and the saved-tensor contract (exactly one saved tensor of L's shape
(batch, n_queries), in float32). Each entry gets a status: ``ok``, ``fail``, ``oom`` or ``error``
(the exception; an entry's error does not stop the others). On a CPU the Triton kernels run in
Triton's interpreter: this process sets TRITON_INTERPRET=1 before Triton is first imported. Entries
run in tasks spread over ``--workers`` processes (spawned: they compile their kernels in parallel),
slowest first: the Triton entries that share every binary form one task (`_groups`), each PyTorch
entry is a task of its own. Tiles: ``--triton-tiles pinned`` takes the tuner's remembered or
heuristic tiles and tunes nothing (lmperf.kernels.flash.tuning, policy ``off``); ``autotuned`` tunes each
bucket without a remembered choice first. Each entry records the tiles it ran.

The course's own entries (``--course-precisions`` x ``--course-head-dims``; flash_benchmarking's
dtypes and head dims in the grid) are checked first: their tasks go to the pool before the others,
and when the last of them is done the record keeps the process's age as ``course_part_process_age_s``.
The report's header counts the process's time up to it as the course's grid and the rest (fp16,
head dims beyond the course's: issue 12's) as this project's additions. Each entry says which it is
(``course``). Without the two flags every entry is the course's and the field is left out.

    python -m lmperf flash_correctness --device cpu --implementation triton \\
        --output results/cpu/flash/correctness_triton.json --precisions fp32 bf16 \\
        --head-dims 16 80 --causal false true --shapes 2x64x64 1x45x77
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import timeit
import traceback

import torch

from lmperf.core import device as devices
from lmperf.core.cell import free_memory, parse_job
from lmperf.core.dtypes import torch_dtype
from lmperf.core.record import Unsupported, is_out_of_memory
from lmperf.kernels.flash.products import dot_precision_for
from lmperf.kernels.flash.warm import default_workers
from lmperf.kinds.flash.common import (
    KIND,
    tuned_choices,
    tuning_settings,
    use_interpreter_without_cuda,
)

TENSORS = ("O", "L", "dQ", "dK", "dV")
CORRECTNESS_IMPLEMENTATIONS = ("pytorch", "triton")
# Relative Frobenius error allowed, (O and L, gradients), per implementation and input dtype: the
# tolerances of tests/test_flash_pytorch.py and tests/test_flash_triton.py. Compiled, float32 inputs
# multiply in lmperf.kernels.flash.products.fp32_products() (3xTF32 by default; the interpreter in float32);
# TF32 only when asked for, not in this grid.
TOLERANCES = {
    "pytorch": {"fp32": (1e-5, 1e-4), "bf16": (2e-2, 3e-2), "fp16": (5e-3, 5e-3)},
    "triton_interpreted": {"fp32": (1e-5, 1e-4), "bf16": (2e-2, 3e-2), "fp16": (5e-3, 1e-2)},
    "triton_compiled": {"fp32": (1e-5, 1e-4), "bf16": (2e-2, 3e-2), "fp16": (5e-3, 1e-2)},
}
TILE_POLICIES = {"pinned": "off", "autotuned": "missing"}
HEAD_DIM_RANGE = (16, 256)


def parse_shape(text: str) -> tuple[int, int, int]:
    """'2x1024x1000' -> (batch, n_queries, n_keys)."""
    try:
        batch, n_q, n_k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be BATCHxN_QUERIESxN_KEYS, got {text!r}") from None
    if batch < 1 or n_q < 2 or n_k < 2:
        # one key makes dQ and dK exactly zero: a relative error is undefined
        raise argparse.ArgumentTypeError(f"need batch >= 1 and at least 2 queries and 2 keys, got {text!r}")
    return batch, n_q, n_k


def is_course_entry(args, precision: str, head_dim: int) -> bool:
    """Whether an entry is one of the course's own (``--course-precisions`` x ``--course-head-dims``;
    a flag left out admits every value)."""
    precisions, head_dims = args.course_precisions, args.course_head_dims
    return (precisions is None or precision in precisions) and (head_dims is None or head_dim in head_dims)


def correctness_specs(args, seed: int) -> list[dict]:
    """Every entry of the grid, each with its own seed (seed + index) and whether it is the course's."""
    specs = []
    for precision in args.precisions:
        for head_dim in args.head_dims:
            for causal in args.causal:
                for batch, n_q, n_k in args.shapes:
                    specs.append(
                        dict(
                            precision=precision,
                            head_dim=head_dim,
                            causal=causal,
                            batch=batch,
                            n_queries=n_q,
                            n_keys=n_k,
                            seed=seed + len(specs),
                            course=is_course_entry(args, precision, head_dim),
                        )
                    )
    return specs


def tolerance_key(implementation: str, interpreted: bool) -> str:
    if implementation == "pytorch":
        return "pytorch"
    return "triton_interpreted" if interpreted else "triton_compiled"


def _function(implementation: str):
    if implementation == "pytorch":
        from lmperf.kernels.flash import FlashAttention2PyTorch

        return FlashAttention2PyTorch
    from lmperf.kernels.flash.autograd import FlashAttention2Triton

    return FlashAttention2Triton


def run_entry(fn, spec: dict, device: torch.device, tolerance: tuple[float, float]) -> dict:
    """One entry: forward and backward through ``fn``, errors against float64, the saved tensors."""
    from lmperf.kernels.flash.reference import reference_with_grads, relative_error

    start = timeit.default_timer()
    entry = dict(spec, tolerance_o_l=tolerance[0], tolerance_grad=tolerance[1])
    dtype = torch_dtype(spec["precision"])
    batch, n_q, n_k, d = spec["batch"], spec["n_queries"], spec["n_keys"], spec["head_dim"]
    q = k = v = do = o = qg = kg = vg = saved = ref = None
    try:
        gen = torch.Generator().manual_seed(spec["seed"])  # on the CPU: the same inputs on any device
        q, k, v, do = (torch.randn(batch, n, d, generator=gen).to(device, dtype) for n in (n_q, n_k, n_k, n_q))
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        o = fn.apply(qg, kg, vg, spec["causal"])
        saved = o.grad_fn.saved_tensors
        o.backward(do)
        l_like = [t for t in saved if tuple(t.shape) == (batch, n_q)]
        entry.update(
            saved_tensor_count=len(saved),
            saved_l_shaped_count=len(l_like),
            saved_l_dtype=str(l_like[0].dtype).replace("torch.", "") if l_like else None,
        )
        entry["saved_contract_ok"] = len(l_like) == 1 and l_like[0].dtype == torch.float32
        lse = l_like[0] if len(l_like) == 1 else None
        ref = reference_with_grads(q, k, v, do, spec["causal"])
        got = (o.detach(), lse, qg.grad, kg.grad, vg.grad)
        failed = []
        for name, g, r in zip(TENSORS, got, ref):
            error = relative_error(g, r) if g is not None and g.shape == r.shape else None
            entry[f"{name}_rel_error"] = error
            limit = tolerance[0] if name in ("O", "L") else tolerance[1]
            if error is None or not math.isfinite(error) or error >= limit:
                failed.append(f"{name} error {error if error is None else f'{error:.2e}'} >= {limit:.0e}")
        entry["output_dtype_ok"] = o.dtype == dtype and all(g.dtype == dtype for g in got[2:])
        if not entry["output_dtype_ok"]:
            failed.append("O or a gradient is not in the input dtype")
        if not entry["saved_contract_ok"]:
            failed.append(
                f"saved {len(l_like)} tensor(s) of L's shape (dtype {entry['saved_l_dtype']}), "
                "want exactly one in float32"
            )
        entry["status"] = "fail" if failed else "ok"
        entry["failed_checks"] = failed
    except Exception as exc:  # noqa: BLE001 - recorded per entry; the grid goes on
        if is_out_of_memory(exc):
            entry.update(status="oom", message=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        else:
            traceback.print_exc(file=sys.stderr)
            entry.update(status="error", message=f"{type(exc).__name__}: {exc}"[:500])
    q = k = v = do = o = qg = kg = vg = saved = ref = None
    free_memory(device)
    entry["entry_wall_s"] = timeit.default_timer() - start
    return entry


def correctness_group(
    implementation: str, specs: list[dict], device_type: str, tile_policy: str | None, tolerance: tuple | None = None
) -> list[dict]:
    """Run a group of entries in this process (also the worker function of the process pool)."""
    device = torch.device(device_type)
    interpreted = False
    if implementation == "triton":
        from lmperf.kernels.flash.triton_forward import INTERPRETED

        interpreted = INTERPRETED
        if tile_policy is not None:
            tuning_settings(tile_policy, None, None)
    fn = _function(implementation)
    entries = []
    for spec in specs:
        tol = tolerance or TOLERANCES[tolerance_key(implementation, interpreted)][spec["precision"]]
        entry = run_entry(fn, spec, device, tol)
        if implementation == "triton":
            entry["tiles"] = tuned_choices()
        print(
            f"[flash correctness {implementation}] {spec['precision']} d={spec['head_dim']} "
            f"causal={spec['causal']} {spec['batch']}x{spec['n_queries']}x{spec['n_keys']}: {entry['status']}"
            + (f" {entry.get('failed_checks') or entry.get('message')}" if entry["status"] != "ok" else ""),
            file=sys.stderr,
            flush=True,
        )
        entries.append(entry)
    return entries


def _warm_spec(spec: dict) -> dict:
    """An entry as lmperf.kernels.flash.warm describes a shape (this grid never runs TF32 products)."""
    keys = ("batch", "n_queries", "n_keys", "head_dim", "causal")
    return {**{key: spec[key] for key in keys}, "dtype": spec["precision"]}


def _groups(implementation: str, specs: list[dict], device_type: str) -> list[list[dict]]:
    """The pool's tasks, slowest first. ``triton``: the entries that run the same binaries
    (lmperf.kernels.flash.warm.binaries: the tiles each kernel gets, the lengths' and strides' classes) form
    one task, whose first entry compiles them and the others reuse them, so the sets of binaries of
    one slow combination compile side by side instead of one after the other (float32 at d = 256, in
    the H100's record of 2591fa8: four sets of 18-38 s, 120 s in one task, most of the cell's 143 s).
    ``pytorch`` compiles nothing: one task per entry."""
    if implementation != "triton":
        return [[spec] for spec in specs]
    from lmperf.kernels.flash import tuning, warm

    device = tuning.device_slug() if device_type == "cuda" else device_type  # the interpreter's tiles need none
    groups: dict[tuple, list[dict]] = {}
    for spec in specs:
        groups.setdefault(warm.binaries(_warm_spec(spec), device), []).append(spec)
    return sorted(groups.values(), key=lambda group: warm.slowest_first(_warm_spec(group[0])))


def summarize_correctness(entries: list[dict]) -> dict:
    """Counts per status and the largest error of each tensor per precision."""
    counts = {s: sum(e["status"] == s for e in entries) for s in ("ok", "fail", "oom", "error")}
    largest: dict[str, dict] = {}
    nonfinite = 0
    for e in entries:
        for name in TENSORS:
            error = e.get(f"{name}_rel_error")
            if error is not None and not math.isfinite(error):
                nonfinite += 1  # a failed entry already; kept out of the maxima
            elif error is not None:
                slot = largest.setdefault(e["precision"], {})
                slot[f"{name}_rel_error"] = max(slot.get(f"{name}_rel_error", 0.0), error)
    ran = [e for e in entries if "saved_contract_ok" in e]
    return {
        "entries": len(entries),
        **{f"entries_{s}": n for s, n in counts.items()},
        "all_within_tolerance": counts["ok"] == len(entries),
        "max_rel_error_by_precision": largest,
        "nonfinite_errors": nonfinite,
        "saved_contract_ok_entries": sum(bool(e["saved_contract_ok"]) for e in ran),
        "saved_contract_checked_entries": len(ran),
    }


def correctness_measure(args, device: torch.device, seed: int) -> dict:
    start = timeit.default_timer()
    interpreted = False
    if args.implementation == "triton":
        try:
            import triton  # noqa: F401
        except ImportError:
            raise Unsupported("Triton is not installed") from None
        from lmperf.kernels.flash.triton_forward import INTERPRETED

        interpreted = INTERPRETED
        if device.type != "cuda" and not interpreted:
            raise RuntimeError("the Triton kernels need CUDA or TRITON_INTERPRET=1 (set by this cell on CPU)")
    specs = correctness_specs(args, seed)
    tiles = TILE_POLICIES[args.triton_tiles] if args.implementation == "triton" else None
    # the course's entries first, then the others: each part's tasks slowest first (`_groups`)
    course = _groups(args.implementation, [s for s in specs if s["course"]], device.type)
    beyond = _groups(args.implementation, [s for s in specs if not s["course"]], device.type)
    workers = min(args.workers or default_workers(), len(course) + len(beyond))
    course_part_age = None
    if workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            # submitted in order, so idle workers take the course's tasks before any other
            futures = [
                pool.submit(correctness_group, args.implementation, g, device.type, tiles) for g in course + beyond
            ]
            entries = [e for f in futures[: len(course)] for e in f.result()]
            if course and beyond:
                course_part_age = devices.process_age_s()
            entries += [e for f in futures[len(course) :] for e in f.result()]
    else:
        entries = [e for g in course for e in correctness_group(args.implementation, g, device.type, tiles)]
        if course and beyond:
            course_part_age = devices.process_age_s()
        entries += [e for g in beyond for e in correctness_group(args.implementation, g, device.type, tiles)]
    order = {spec["seed"]: index for index, spec in enumerate(specs)}  # seeds are one per entry
    entries.sort(key=lambda e: order[e["seed"]])  # the grid's order, whatever order the tasks ran in
    metrics = {
        "implementation": args.implementation,
        "function": _function(args.implementation).__name__,
        "kernel_mode": (
            "pytorch"
            if args.implementation == "pytorch"
            else "triton interpreter (TRITON_INTERPRET=1)"
            if interpreted
            else "triton compiled"
        ),
        "seed": seed,
        "reference": "lmperf.kernels.flash.reference.attention_reference in float64 on the same rounded inputs",
        "error_measure": "relative Frobenius norm ||x - ref||_F / ||ref||_F",
        "tolerances": TOLERANCES[tolerance_key(args.implementation, interpreted)],
        "workers": workers,
    }
    if args.implementation == "triton":  # the distinct tiles each kernel ran (each entry's under `tiles`)
        metrics["triton_tile_policy"] = f"lmperf.kernels.flash.tuning, policy {tiles}"
        metrics["triton_tiles"] = {}
        for e in entries:
            for kernel, choice in (e.get("tiles") or {}).items():
                seen = metrics["triton_tiles"].setdefault(kernel, [])
                if choice["config"] not in seen:
                    seen.append(choice["config"])
    metrics.update(summarize_correctness(entries))
    metrics["course_entries"] = sum(e["course"] for e in entries)
    if course_part_age is not None:
        # the process's age when the course's last entry was done (lmperf.report.devices.record_parts)
        metrics["course_part_process_age_s"] = course_part_age
    metrics["entries_detail"] = entries
    metrics["cell_wall_s"] = timeit.default_timer() - start
    return metrics


def run(job, argv: list[str] | None = None) -> int:
    """The cell; `argv` (its command line) lets a CPU run restart itself with Triton's interpreter on."""
    args = job.args
    device = devices.check_device(args.device)
    if args.implementation == "triton":
        use_interpreter_without_cuda(device, argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    labels = {}
    if args.implementation == "triton" and device.type == "cuda":
        # what compiled kernels multiply float32 inputs in (this grid never asks for TF32)
        labels["dot_precision"] = dot_precision_for("fp32", allow_tf32=False)
    cell = {"test": "correctness", "implementation": args.implementation}
    job.write(KIND, cell, lambda: {**correctness_measure(args, device, seed), **labels})
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run(parse_job("flash_correctness", argv, __doc__.splitlines()[0]), argv)


if __name__ == "__main__":
    sys.exit(main())
