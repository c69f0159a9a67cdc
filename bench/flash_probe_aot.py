"""The flash probes' variant kernels compiled for Hopper (sm_90) on a machine without a GPU.

Triton lowers a kernel to a cubin without a device (ptxas and cuobjdump ship in its wheel), so a CPU
machine can screen the variants of bench/flash_bwd_probe.py and bench/flash_fwd_probe.py before
they take device time: which configs build, their shared memory, registers per thread and stack
bytes per thread (spilled registers: stack > 0), and how long each takes to compile. It says nothing
about speed.

    python bench/flash_probe_aot.py                  # every variant the two sweeps would time
    python bench/flash_probe_aot.py --kernel fwd     # one probe's
Run it with the Triton version of the GPU machine (3.6) for its verdicts; TRITON_INTERPRET unset.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_BF16_POINTERS = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}
_FP32_POINTERS = {"L", "Delta"}
_I32_POINTERS = {"Counter"}  # bench/flash_sched_probe.py's work counter
_FLOATS = {"qk_scale", "sm_scale"}


def compile_sm90(kernel, constexprs: dict, num_warps: int, num_stages: int, maxnreg: int | None = None):
    """Compile `kernel` for sm_90 with bf16 tensors, float32 statistics, 16-byte aligned arguments;
    `maxnreg` caps the registers per thread."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in _BF16_POINTERS:
            signature[name] = "*bf16"
        elif name in _FP32_POINTERS:
            signature[name] = "*fp32"
        elif name in _I32_POINTERS:
            signature[name] = "*i32"
        elif name in _FLOATS:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
        if signature[name] not in ("constexpr", "fp32"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(
        source,
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=num_warps, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {})),
    )


def cuobjdump() -> str:
    found = glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
    if not found:
        raise SystemExit("no cuobjdump in this Triton wheel")
    return found[0]


def resources(compiled) -> dict:
    """Registers per thread and stack bytes per thread (register spills land there) from cuobjdump
    -res-usage; shared memory from Triton's metadata (dynamic shared memory, which cuobjdump's
    SHARED, the static part, leaves out)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([cuobjdump(), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    usage = dict(re.findall(r"\b(REG|STACK):(\d+)", out))
    return dict(regs=int(usage["REG"]), stack_bytes=int(usage["STACK"]), shared_bytes=compiled.metadata.shared)


def bwd_configs(d: int) -> list[dict]:
    import flash_bwd_probe as bwd

    out = []
    for bm, bn, warps, stages in bwd.SWEEP_TILES[d]:
        for swap in (False, True):
            for dp_first in (False, True):
                for ws in (False, True):
                    out.append(
                        dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, KV_TMA=True,
                             DP_FIRST=dp_first, SWAP=swap, WS=ws)
                    )  # fmt: skip
    return out


def fwd_configs(d: int) -> list[dict]:
    import flash_fwd_probe as fwd

    out = []
    for bm, bn, warps, stages in fwd.TILES[d]:
        for split in (1, 2):
            if (bm // split) % bn == 0:
                for ws in (False, True):
                    out.append(dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, SPLIT=split, WS=ws))
    return out


def compile_variant(kind: str, d: int, cfg: dict) -> dict:
    import flash_bwd_probe as bwd
    import flash_fwd_probe as fwd

    cfg = dict(cfg)
    warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    if kind == "bwd":
        kernel = bwd.dkdv_variant_kernel
        constexprs = dict(HEAD_DIM=d, NT=False, BATCH_MAJOR=False, **cfg)
        constexprs["DIAG"] = triton.cdiv(cfg["BLOCK_N"], cfg["BLOCK_M"]) * cfg["BLOCK_M"]
    else:
        kernel = fwd.fwd_variant_kernel
        constexprs = dict(HEAD_DIM=d, BATCH_MAJOR=False, HALF=cfg["BLOCK_M"] // cfg["SPLIT"], **cfg)
    row = dict(kernel=kind, d=d, config={**cfg, "num_warps": warps, "num_stages": stages})
    start = time.perf_counter()
    try:
        compiled = compile_sm90(kernel, constexprs, warps, stages)
        row.update(resources(compiled), compile_s=round(time.perf_counter() - start, 2))
    except Exception as exc:  # noqa: BLE001 - a config that does not build is a result
        row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"[:300]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel", choices=("bwd", "fwd", "both"), default="both")
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    print(f"triton {triton.__version__}, sm_90", flush=True)
    rows = []
    kinds = ("bwd", "fwd") if args.kernel == "both" else (args.kernel,)
    for kind in kinds:
        for d in args.head_dims:
            for cfg in (bwd_configs if kind == "bwd" else fwd_configs)(d):
                rows.append(compile_variant(kind, d, cfg))
                r = rows[-1]
                flags = [k for k, v in r["config"].items() if v is True]
                if r["config"].get("SPLIT", 1) > 1:
                    flags.append(f"SPLIT{r['config']['SPLIT']}")
                tiles = "x".join(str(r["config"][k]) for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"))
                what = (
                    r["error"]
                    if "error" in r
                    else f"{r['regs']} regs, {r['stack_bytes']} B stack, {r['shared_bytes'] // 1024} KiB shared"
                    f" ({r['compile_s']} s)"
                )
                print(f"{kind} d{d} {tiles:14s} {','.join(flags) or '-':28s} {what}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
