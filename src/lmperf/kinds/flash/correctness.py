"""flash_forward and flash_backward: FlashAttention-2 against float64 attention, one record per
implementation (``pytorch``: the tiled autograd.Function; ``triton``: our kernels, on a CPU in Triton's
interpreter). Each entry (precision × head dim × causal × shape, fresh inputs) keeps the relative
errors of O, L, dQ, dK, dV, the tolerance and the saved-tensor contract. Entries run in spawned
workers, slowest first, Triton entries that share binaries in one task.
"""

from __future__ import annotations

import functools
import itertools
import math
import multiprocessing
import os
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor

import torch

from lmperf.core import device as devices
from lmperf.core.cell import free_memory, parse_job
from lmperf.core.dtypes import torch_dtype
from lmperf.core.record import Unsupported, is_out_of_memory
from lmperf.kernels.flash.products import dot_precision_for
from lmperf.kernels.flash.warm import default_workers
from lmperf.kinds.flash.common import KIND, tuned

TENSORS = ("O", "L", "dQ", "dK", "dV")
# Relative Frobenius error allowed, (O and L, gradients), by implementation and input dtype (the
# kernel tests' tolerances). Float32 inputs multiply in lmperf.kernels.flash.products' fp32 products.
TOLERANCES = {
    "pytorch": {"fp32": (1e-5, 1e-4), "bf16": (2e-2, 3e-2), "fp16": (5e-3, 5e-3)},
    "triton": {"fp32": (1e-5, 1e-4), "bf16": (2e-2, 3e-2), "fp16": (5e-3, 1e-2)},
}


def use_interpreter_without_cuda(device: torch.device, argv: list[str] | None) -> None:
    """On a CPU, turn Triton's interpreter on before Triton is imported (triton.jit reads TRITON_INTERPRET
    when a kernel is decorated; spawned workers inherit it); where the warm parent imported it already,
    restart this process in place with it on (os.execve: same pid, same stdio)."""
    if device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return
    if "triton" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", __name__, *argv], {**os.environ, "TRITON_INTERPRET": "1"})
    os.environ["TRITON_INTERPRET"] = "1"


def specs(s: dict, seed: int) -> list[dict]:
    """Every entry of the grid, each with its own seed (seed + its index)."""
    grid = itertools.product(s["precisions"], s["head_dims"], s["causal"], s["shapes"])
    return [
        {"precision": p, "head_dim": d, "causal": c, "batch": b, "n_queries": n_q, "n_keys": n_k, "seed": seed + i}
        for i, (p, d, c, (b, n_q, n_k)) in enumerate(grid)
    ]


def _function(implementation: str):
    if implementation == "pytorch":
        from lmperf.kernels.flash import FlashAttention2PyTorch

        return FlashAttention2PyTorch
    from lmperf.kernels.flash.autograd import FlashAttention2Triton

    return FlashAttention2Triton


def check(fn, spec: dict, device: torch.device, tolerance: tuple[float, float]) -> dict:
    """One entry: forward and backward through ``fn``; errors against float64 and the saved tensors."""
    from lmperf.kernels.flash.reference import reference_with_grads, relative_error

    entry = dict(spec, tolerance_o_l=tolerance[0], tolerance_grad=tolerance[1])
    dtype = torch_dtype(spec["precision"])
    batch, n_q, n_k, d = (spec[k] for k in ("batch", "n_queries", "n_keys", "head_dim"))
    gen = torch.Generator().manual_seed(spec["seed"])  # on the CPU: the same inputs on any device
    q, k, v, do = (torch.randn(batch, n, d, generator=gen).to(device, dtype) for n in (n_q, n_k, n_k, n_q))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    o = fn.apply(qg, kg, vg, spec["causal"])
    saved = o.grad_fn.saved_tensors
    o.backward(do)
    l_like = [t for t in saved if tuple(t.shape) == (batch, n_q)]
    entry["saved_contract_ok"] = len(l_like) == 1 and l_like[0].dtype == torch.float32
    got = (o.detach(), l_like[0] if len(l_like) == 1 else None, qg.grad, kg.grad, vg.grad)
    failed = []
    for name, g, r in zip(TENSORS, got, reference_with_grads(q, k, v, do, spec["causal"])):
        error = relative_error(g, r) if g is not None and g.shape == r.shape else None
        entry[f"{name}_rel_error"] = error
        limit = tolerance[0] if name in ("O", "L") else tolerance[1]
        if error is None or not math.isfinite(error) or error >= limit:
            failed.append(f"{name} error {'—' if error is None else f'{error:.2e}'} >= {limit:.0e}")
    if not (o.dtype == dtype and all(g.dtype == dtype for g in got[2:])):
        failed.append("O or a gradient is not in the input dtype")
    if not entry["saved_contract_ok"]:
        failed.append(f"saved {len(l_like)} tensor(s) of L's shape, want exactly one in float32")
    return entry | {"status": "fail" if failed else "ok", "failed_checks": failed}


def run_group(implementation: str, group: list[dict], device_type: str, tile_policy: str | None) -> list[dict]:
    """A task's entries, in this process (the pool's worker function)."""
    device = torch.device(device_type)
    if tile_policy is not None:
        from lmperf.kernels.flash import tuning

        tuning.set_policy(tile_policy)
    fn = _function(implementation)
    entries = []
    for spec in group:
        try:
            entry = check(fn, spec, device, TOLERANCES[implementation][spec["precision"]])
        except Exception as exc:  # noqa: BLE001 - recorded per entry; the grid goes on
            traceback.print_exc(file=sys.stderr)
            message = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            entry = dict(spec, status="oom" if is_out_of_memory(exc) else "error", message=message)
        free_memory(device)
        if implementation == "triton":
            entry["tiles"] = tuned()["tiles"]
        print(f"[flash correctness {implementation}] {spec}: {entry['status']}", file=sys.stderr, flush=True)
        entries.append(entry)
    return entries


def groups(implementation: str, entries: list[dict], device_type: str) -> list[list[dict]]:
    """The pool's tasks, slowest first: for ``triton``, the entries that run the same binaries
    (lmperf.kernels.flash.warm.binaries) form one task, whose first entry compiles them; ``pytorch``
    compiles nothing: one task per entry."""
    if implementation != "triton":
        return [[spec] for spec in entries]
    from lmperf.kernels.flash import tuning, warm

    def shape(spec: dict) -> dict:  # an entry as lmperf.kernels.flash.warm describes a shape
        return {k: spec[k] for k in ("batch", "n_queries", "n_keys", "head_dim", "causal")} | {
            "dtype": spec["precision"]
        }

    device = tuning.device_slug() if device_type == "cuda" else device_type  # the interpreter's tiles need none
    by_binaries: dict[tuple, list[dict]] = {}
    for spec in entries:
        by_binaries.setdefault(warm.binaries(shape(spec), device), []).append(spec)
    return sorted(by_binaries.values(), key=lambda group: warm.slowest_first(shape(group[0])))


def measure(s: dict, device: torch.device, seed: int) -> dict:
    implementation, mode = s["implementation"], "pytorch"
    if implementation == "triton":
        try:
            from lmperf.kernels.flash.triton_forward import INTERPRETED
        except ImportError:
            raise Unsupported("Triton is not installed") from None
        mode = "triton interpreter (TRITON_INTERPRET=1)" if INTERPRETED else "triton compiled"
    tasks = groups(implementation, specs(s, seed), device.type)
    workers = min(s["workers"] or default_workers(), len(tasks))
    policy = s["tune"] if implementation == "triton" else None
    run = functools.partial(run_group, implementation, device_type=device.type, tile_policy=policy)
    if workers > 1:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            entries = [e for task in pool.map(run, tasks) for e in task]
    else:
        entries = [e for task in map(run, tasks) for e in task]
    entries.sort(key=lambda e: e["seed"])  # the grid's order, whatever order the tasks ran in
    ok = sum(e["status"] == "ok" for e in entries)
    metrics = {"function": _function(implementation).__name__, "kernel_mode": mode, "seed": seed, "workers": workers}
    metrics |= {"tolerances": TOLERANCES[implementation], "entries": len(entries), "entries_ok": ok}
    if implementation == "triton":
        metrics["tile_policy"] = policy
        if device.type == "cuda":  # what compiled kernels multiply float32 inputs in
            metrics["dot_precision"] = dot_precision_for("fp32")
    return metrics | {"all_within_tolerance": ok == len(entries), "entries_detail": entries}


def run(job, argv: list[str]) -> int:
    """The cell; ``argv`` lets a CPU run restart itself with Triton's interpreter on."""
    s = job.settings
    device = devices.check_device(job.device)
    if s["implementation"] == "triton":
        use_interpreter_without_cuda(device, argv)
    seed = s["seed"] if s["seed"] is not None else int.from_bytes(os.urandom(4), "little")
    cell = {"test": "correctness", "implementation": s["implementation"]}
    job.write(KIND, cell, lambda: measure(s, device, seed))
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run(parse_job("flash_correctness", argv, __doc__.splitlines()[0]), argv)


if __name__ == "__main__":
    sys.exit(main())
