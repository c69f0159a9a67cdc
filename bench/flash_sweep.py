"""Random shapes forward+backward through FlashAttention2Triton, as a user with varying shapes would run them.

Mixed head dims (16..256, powers of two or not), lengths 1..4096 (n_q and n_k drawn apart), batch
1..4, fp32/bf16/fp16, causal or not. The wall time of the whole sweep covers every compilation
(and any tuning the policy allows); each shape's time and source of tiles are recorded, and each
result is checked against float64 attention (outside the timed region).

With ``--workers N`` (default: this machine's CPUs - 1, at most 15; 0: off) the kernels of every
(head dim, dtype, causal) combination of the sweep are first compiled side by side in N spawned
processes (lmperf.flash.warm); that phase counts in the sweep's wall time.

    LMPERF_FLASH_TUNE=off TRITON_CACHE_DIR=$(mktemp -d) python bench/flash_sweep.py --shapes 200 --output sweep.json
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

HEAD_DIMS = (16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TOLERANCE = {"fp32": (1e-5, 1e-4), "bf16": (2e-2, 3e-2), "fp16": (5e-3, 1e-2)}  # (O and L, gradients)


def shapes(count: int, seed: int, max_len: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        dict(
            head_dim=rng.choice(HEAD_DIMS),
            precision=rng.choice(list(DTYPES)),
            causal=rng.random() < 0.5,
            batch=rng.randint(1, 4),
            n_queries=rng.randint(1, max_len),
            n_keys=rng.randint(1, max_len),
        )
        for _ in range(count)
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--workers", type=int, default=None, help="compile in parallel first (0: off)")
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 0:
        parser.error("--workers must be 0 (off) or more")

    from lmperf.flash import tuning
    from lmperf.flash.autograd import FlashAttention2Triton
    from lmperf.flash.reference import reference_with_grads, relative_error

    tuning.reset_stats()
    rows, flash_s, warmed = [], 0.0, None
    specs = shapes(args.shapes, args.seed, args.max_len)
    start = time.perf_counter()
    if args.workers != 0:
        from lmperf.flash.warm import warm

        warmed = warm([dict(s, dtype=s["precision"]) for s in specs], args.workers)
        print(json.dumps({k: v for k, v in warmed.items() if k != "tasks"}), flush=True)
    for i, spec in enumerate(specs):
        gen = torch.Generator(device="cuda").manual_seed(args.seed * 1000 + i)
        dtype = DTYPES[spec["precision"]]
        b, d = spec["batch"], spec["head_dim"]
        q, k, v, do = (
            torch.randn(b, n, d, device="cuda", dtype=dtype, generator=gen)
            for n in (spec["n_queries"], spec["n_keys"], spec["n_keys"], spec["n_queries"])
        )
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        o = FlashAttention2Triton.apply(qg, kg, vg, spec["causal"])
        lse = o.grad_fn.saved_tensors[0]  # L, read before backward frees the saved tensors
        o.backward(do)
        torch.cuda.synchronize()
        row = dict(spec, seconds=time.perf_counter() - t0)
        flash_s += row["seconds"]
        if args.check:
            ref = reference_with_grads(q, k, v, do, spec["causal"])
            got = (o.detach(), lse, qg.grad, kg.grad, vg.grad)
            errors = {
                name: relative_error(g, r)
                for name, g, r in zip(("O", "L", "dQ", "dK", "dV"), got, ref)
                if g is not None
            }
            tol_o, tol_g = TOLERANCE[spec["precision"]]
            # one key: dQ, dK are exactly zero in exact arithmetic, a relative error is undefined
            checked = {n: e for n, e in errors.items() if spec["n_keys"] > 1 or n not in ("dQ", "dK")}
            row["errors"] = errors
            row["ok"] = all(e < (tol_o if n in ("O", "L") else tol_g) for n, e in checked.items())
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "errors"}), flush=True)
    total_s = time.perf_counter() - start
    summary = {
        "shapes": len(rows),
        "sweep_wall_s_including_checks": total_s,
        "flash_forward_backward_s": flash_s,
        "parallel_compile": warmed,
        "tuning": tuning.stats(),
        "policy": tuning.policy(),
        "failed": [r for r in rows if r.get("ok") is False],
        "triton": __import__("triton").__version__,
        "device": torch.cuda.get_device_name(),
    }
    with open(args.output, "w") as f:
        json.dump({"summary": summary, "rows": rows}, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "failed"} | {"failed": len(summary["failed"])}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
