"""Tile choices of the Triton FlashAttention-2 kernels: per bucket, remembered per device and Triton.

A bucket is ``kernel|precision|d<BLOCK_D>|causal/full|n<power of two>``. A choice comes from memory,
the user cache (``flash-<device>-triton<version>.json`` in ``$LMPERF_CACHE_DIR`` or ~/.cache/lmperf),
the committed ``tuned/<device>.json`` (same Triton only), tuning on the call's tensors (policy
``missing``: candidates compiled, checked against the heuristic's output, timed) or the heuristic
(``off``, the default). ``STATS`` counts where choices came from.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import tempfile
import time
from pathlib import Path

import torch
import triton

from .triton_common import INTERPRETED, block_d

KERNELS = ("fwd", "dkdv", "dq")
POLICIES = ("off", "missing")
MIN_BUCKET, MAX_BUCKET = 128, 65536
TUNED_DIR = Path(__file__).with_name("tuned")
CODE_DATA = ("tuned/*.json",)  # the committed tables are code: part of every version that imports this
SHARED_MEMORY_BYTES = 227 * 1024  # H100/H200 per block; a candidate above it is not compiled
HEURISTIC_SHARED_BYTES = 160 * 1024  # untested choices keep clear of the limit
TUNE_WARMUP_MS, TUNE_REP_MS = 5, 20
# agreement with the heuristic choice's output that a candidate must show (relative Frobenius)
AGREEMENT = {"fp32": 1e-4, "fp32ieee": 1e-4, "tf32": 1e-2, "bf16": 3e-2, "fp16": 1e-2}

INTERPRETER_CONFIGS = {  # BLOCK_M > BLOCK_N (or the reverse for dK/dV): the diagonal spans two tiles
    "fwd": {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
    "dkdv": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
    "dq": {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
}


def _c(bm, bn, w, s, **extra):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s, **extra}


def _cs(*tiles, **extra) -> list[dict]:
    return [_c(*tile, **extra) for tile in tiles]


# Candidates, best-guess first (the heuristic takes the first that fits). BLOCK_M: queries, BLOCK_N: keys.
CANDIDATES = {
    "fwd": _cs((128, 64, 8, 4), (128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 8, 2), (128, 128, 8, 3), (128, 64, 4, 3))
    + _cs((64, 64, 4, 3), (64, 64, 4, 2), (64, 32, 4, 2), (32, 32, 4, 2), (32, 32, 2, 1), (32, 16, 4, 1))
    + _cs((128, 64, 8, 3), (128, 128, 8, 2), WARP_SPECIALIZE=True)
    + _cs((128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), USE_TMA=True)
    + _cs((128, 64, 8, 3), (128, 128, 8, 2), USE_TMA=True, WARP_SPECIALIZE=True)
    # every batch element's longest causal tiles first (docs/decisions/flash-batch-first-grid.md: -5 % at d = 64 on an H100)
    + _cs((128, 64, 8, 4), (128, 64, 8, 3), BATCH_FIRST=True)
    + _cs((128, 64, 8, 3), USE_TMA=True, BATCH_FIRST=True)
    + _cs((64, 64, 4, 3), BATCH_FIRST=True),
    # the v2/v3 winners on an H200 (docs/decisions/flash-tile-tuning.md) first: dK/dV 64 x 64, 4 warps; dQ 128 x 64, 8 warps
    "dkdv": _cs((64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 4, 5), (64, 128, 8, 3), (32, 128, 4, 3), (32, 128, 4, 4))
    + _cs((32, 128, 8, 3), (64, 128, 8, 2), (64, 64, 4, 2), (32, 64, 4, 2), (32, 32, 4, 2), (16, 32, 4, 1))
    + _cs((16, 16, 1, 1))
    + _cs((64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 8, 3), (32, 128, 4, 3), USE_TMA=True)
    # dP before dV's matmul (docs/decisions/flash-dkdv-dp-first-and-lengths.md: faster at d = 64, slower at 128 on an H100)
    + _cs((64, 64, 4, 3), (64, 64, 4, 4), USE_TMA=True, DP_FIRST=True),
    "dq": _cs((128, 64, 8, 3), (128, 64, 8, 4), (128, 64, 8, 5), (128, 32, 4, 3), (128, 32, 4, 4), (128, 32, 8, 3))
    + _cs((128, 64, 8, 2), (64, 64, 4, 3), (64, 64, 4, 2), (64, 32, 4, 2), (32, 32, 4, 2), (32, 16, 4, 1))
    + _cs((32, 16, 2, 1))
    + _cs((128, 64, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3), USE_TMA=True)
    + _cs((128, 64, 8, 3), (64, 64, 4, 3), USE_TMA=True, BATCH_FIRST=True),
}

# float32 inputs with fp32 products (3xTF32 or IEEE) need small tiles: each product takes three
# tensor-core dots (or the FMA units), and big tiles spill registers. The H100 probe's tuned winners
# per padded head dim at the attention sweep's shape (docs/decisions/flash-fp32-products.md): d = 128 and 256 tuned
# with 3xTF32; d = 64 tuned with IEEE products and measured again with 3xTF32. Used for every bucket.
FP32_TILES = {
    64: {"fwd": _c(64, 64, 4, 3), "dkdv": _c(32, 32, 4, 2), "dq": _c(128, 64, 8, 2)},
    128: {"fwd": _c(32, 32, 2, 1), "dkdv": _c(32, 32, 4, 2), "dq": _c(32, 32, 4, 2)},
    256: {"fwd": _c(32, 32, 4, 2), "dkdv": _c(16, 16, 1, 1), "dq": _c(32, 16, 2, 1)},
}

STATS = dict(memory=0, user_cache=0, committed=0, heuristic=0, tuned=0, tuning_s=0.0, candidates_failed=0)
_memory: dict[str, dict] = {}
_loaded: set[str] = set()
_policy: str | None = None
LAST: dict[str, dict] = {}  # kernel -> {"key", "config", "source"} of its latest launch (for records)


def precision_name(dtype: torch.dtype, precision: str) -> str:
    """The key's precision: fp32 (float32 inputs, 3xTF32 products), fp32ieee (IEEE products), tf32,
    bf16 or fp16. `precision` is the kernels' tl.dot input_precision."""
    if dtype == torch.float32:
        return {"tf32": "tf32", "ieee": "fp32ieee"}.get(precision, "fp32")
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def length_bucket(n_queries: int, n_keys: int) -> int:
    return min(MAX_BUCKET, max(MIN_BUCKET, triton.next_power_of_2(max(n_queries, n_keys))))


def bucket_key(kernel: str, precision: str, head_dim: int, causal: bool, n_queries: int, n_keys: int) -> str:
    return (
        f"{kernel}|{precision}|d{block_d(head_dim)}|{'causal' if causal else 'full'}"
        f"|n{length_bucket(n_queries, n_keys)}"
    )


@functools.cache
def _slug(index: int | None) -> str:
    name = torch.cuda.get_device_name(index).lower()
    match = re.search(r"\b([a-z]{1,2}\d{2,4}[a-z]?)\b", name)
    return match.group(1) if match else re.sub(r"[^a-z0-9]+", "-", name).strip("-")


def device_slug(device=None) -> str:
    """'h100' for 'NVIDIA H100 80GB HBM3': the first model-number token of the device's name."""
    index = torch.device(device).index if device is not None else None
    return _slug(torch.cuda.current_device() if index is None else index)


def policy() -> str:
    value = _policy or os.environ.get("LMPERF_FLASH_TUNE", "off")
    if value not in POLICIES:
        raise ValueError(f"LMPERF_FLASH_TUNE must be one of {POLICIES}, got {value!r}")
    return value


def set_policy(value: str | None) -> None:
    """'missing': tune buckets with no remembered choice; 'off': heuristic; None: the environment's."""
    global _policy
    if value is not None and value not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {value!r}")
    _policy = value


def configure(policy: str | None = None, warmup_ms: float | None = None, rep_ms: float | None = None) -> dict:
    """Set the policy and the do_bench each candidate is timed with; returns the settings for a record."""
    global TUNE_WARMUP_MS, TUNE_REP_MS
    if policy is not None:
        set_policy(policy)
    TUNE_WARMUP_MS = TUNE_WARMUP_MS if warmup_ms is None else warmup_ms
    TUNE_REP_MS = TUNE_REP_MS if rep_ms is None else rep_ms
    return {
        "tuning_policy": globals()["policy"](),
        "tuning_do_bench": f"do_bench(warmup={TUNE_WARMUP_MS}, rep={TUNE_REP_MS})",
    }


@contextlib.contextmanager
def tuning_policy(value: str):
    global _policy
    before = _policy
    set_policy(value)
    try:
        yield
    finally:
        _policy = before


def shared_bytes(kernel: str, config: dict, head_dim: int, itemsize: int) -> int:
    """Shared memory the tiles need: the resident tiles plus num_stages buffers of the streamed ones."""
    bm, bn, s, bd = config["BLOCK_M"], config["BLOCK_N"], max(1, config["num_stages"]), block_d(head_dim)
    if kernel == "fwd":  # Q resident; K, V streamed
        tiles = bm * bd + s * 2 * bn * bd
    elif kernel == "dkdv":  # K, V resident; Q, dO streamed
        tiles = 2 * bn * bd + s * 2 * bm * bd
    else:  # Q, dO resident; K, V streamed
        tiles = 2 * bm * bd + s * 2 * bn * bd
    return tiles * itemsize


def _variant(config: dict) -> bool:
    return bool(config.get("WARP_SPECIALIZE") or config.get("USE_TMA") or config.get("BATCH_FIRST"))


def candidates(kernel: str, head_dim: int, dtype: torch.dtype, limit: int = SHARED_MEMORY_BYTES) -> list[dict]:
    itemsize = torch.empty((), dtype=dtype).element_size()
    out = []
    for config in CANDIDATES[kernel]:
        if _variant(config) and itemsize == 4:
            continue  # warp specialisation, TMA and batch-first launches: tried for 16-bit inputs only
        if config.get("WARP_SPECIALIZE") and os.environ.get("LMPERF_FLASH_WARP_SPECIALIZE") == "0":
            continue  # LMPERF_FLASH_WARP_SPECIALIZE=0 drops the warp-specialised candidates
        if config.get("USE_TMA") and os.environ.get("LMPERF_FLASH_TMA") == "0":
            continue  # LMPERF_FLASH_TMA=0 drops the tensor-descriptor candidates
        if shared_bytes(kernel, config, head_dim, itemsize) <= limit:
            out.append(dict(config))
    return out


def heuristic(kernel: str, head_dim: int, dtype: torch.dtype, bucket: int, precision: str | None = None) -> dict:
    """FP32_TILES for float32 inputs with fp32 products (`precision` "fp32"/"fp32ieee"); otherwise the
    first candidate that keeps clear of the shared-memory limit. The same for every bucket: one
    compilation per head dim and dtype serves all lengths (`bucket` is not used yet)."""
    if precision in ("fp32", "fp32ieee"):
        return dict(FP32_TILES[max(64, block_d(head_dim))][kernel])
    fitting = candidates(kernel, head_dim, dtype, HEURISTIC_SHARED_BYTES)
    fitting = [c for c in fitting if not _variant(c)]  # untested variants only where tuning measured them
    return dict(fitting[0] if fitting else CANDIDATES[kernel][-1])


def cache_dir() -> Path:
    return Path(os.environ.get("LMPERF_CACHE_DIR") or Path.home() / ".cache" / "lmperf")


def user_cache_path(device: str) -> Path:
    return cache_dir() / f"flash-{device}-triton{triton.__version__}.json"


def committed_path(device: str) -> Path:
    return TUNED_DIR / f"{device}.json"


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _load(device: str) -> None:
    """Fill memory from the committed table (same Triton only), then the user cache over it."""
    if device in _loaded:
        return
    _loaded.add(device)
    committed = _read(committed_path(device))
    if committed.get("triton") == triton.__version__:
        for key, entry in committed.get("choices", {}).items():
            _memory.setdefault(f"{device}:{key}", {"config": entry["config"], "source": "committed"})
    for key, entry in _read(user_cache_path(device)).get("choices", {}).items():
        _memory[f"{device}:{key}"] = {"config": entry["config"], "source": "user_cache"}


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(f.name, path)


def _remember(device: str, key: str, entry: dict) -> None:
    """Keep a tuned choice in memory and merge it into the user cache (best effort: a read-only home
    only loses the memory across processes)."""
    _memory[f"{device}:{key}"] = {"config": entry["config"], "source": "memory"}
    path = user_cache_path(device)
    data = _read(path) or {"device": device, "triton": triton.__version__, "choices": {}}
    data["choices"][key] = entry
    try:
        _write_json(path, data)
    except OSError:
        pass


def forget() -> None:
    """Drop every remembered choice of this process (tests; a changed cache directory)."""
    LAST.clear()
    _memory.clear()
    _loaded.clear()


def reset_stats() -> None:
    for key in STATS:
        STATS[key] = 0.0 if key == "tuning_s" else 0


def stats() -> dict:
    return dict(STATS)


def choose(
    kernel: str, q: torch.Tensor, k: torch.Tensor, is_causal: bool, precision: str, launch, outputs: tuple
) -> dict:
    """The tiles for one launch of `kernel` on (B, n, d) inputs q, k; `launch(config)` runs it once,
    writing `outputs` (used only to tune)."""
    if INTERPRETED:
        LAST[kernel] = {"key": None, "config": dict(INTERPRETER_CONFIGS[kernel]), "source": "interpreter"}
        return dict(INTERPRETER_CONFIGS[kernel])
    n_q, n_k, d = q.shape[1], k.shape[1], q.shape[2]
    prec = precision_name(q.dtype, precision)
    key = bucket_key(kernel, prec, d, bool(is_causal), n_q, n_k)
    device = device_slug(q.device)
    found = _remembered(device, key)
    # a heuristic choice made before tuning was switched on is tuned now
    if found is not None and not (found["source"] == "heuristic" and policy() == "missing"):
        source, config = found["source"], found["config"]
        STATS[source if source in STATS else "memory"] += 1
    elif policy() == "missing":
        entry = tune(kernel, q.dtype, d, length_bucket(n_q, n_k), prec, launch, outputs)
        _remember(device, key, entry)
        source, config = "tuned", entry["config"]
        STATS["tuned"] += 1
    else:
        source, config = "heuristic", heuristic(kernel, d, q.dtype, length_bucket(n_q, n_k), prec)
        _memory[f"{device}:{key}"] = {"config": config, "source": "heuristic"}
        STATS["heuristic"] += 1
    LAST[kernel] = {"key": key, "config": dict(config), "source": source}
    return dict(config)


def _remembered(device: str, key: str) -> dict | None:
    _load(device)
    return _memory.get(f"{device}:{key}")


def planned(
    kernel: str,
    dtype: torch.dtype,
    precision: str,
    head_dim: int,
    causal: bool,
    n_queries: int,
    n_keys: int,
    device: str,
) -> dict:
    """The tiles `choose` gives such a launch on `device` with the policy ``off``, without tensors or a
    launch: which launches share binaries, before compiling any (lmperf.kernels.flash.warm)."""
    if INTERPRETED:
        return dict(INTERPRETER_CONFIGS[kernel])
    prec = precision_name(dtype, precision)
    found = _remembered(device, bucket_key(kernel, prec, head_dim, bool(causal), n_queries, n_keys))
    if found is not None:
        return dict(found["config"])
    return heuristic(kernel, head_dim, dtype, length_bucket(n_queries, n_keys), prec)


def _relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    return float(torch.linalg.vector_norm(x.double() - ref) / max(torch.linalg.vector_norm(ref).item(), 1e-30))


def tune(kernel: str, dtype: torch.dtype, head_dim: int, bucket: int, precision: str, launch, outputs: tuple) -> dict:
    """Compile, check and time every candidate on this call's tensors; return the fastest's entry:
    {"config", "ms", "candidates": {str(config): ms or the error}, "tuning_s", "shape_tuned_on"}."""
    from triton.testing import do_bench

    start = time.perf_counter()
    default = heuristic(kernel, head_dim, dtype, bucket, precision)
    timings: dict[str, float | str] = {}
    reference = None
    best, best_ms = default, math.inf
    for config in [default] + [c for c in candidates(kernel, head_dim, dtype) if c != default]:
        name = json.dumps(config, sort_keys=True)
        try:
            launch(config)
            torch.cuda.synchronize()
            if reference is None:  # the first that runs (the heuristic choice, normally) is the reference
                reference = [t.clone() for t in outputs]
            error = max(_relative_error(o, r) for o, r in zip(outputs, reference))
            if not error < AGREEMENT[precision]:
                raise ValueError(f"output differs from the heuristic choice's by {error:.1e}")
            ms = do_bench(lambda c=config: launch(c), warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS, return_mode="median")
        except Exception as exc:  # noqa: BLE001 - out of resources, a miscompile: the candidate is skipped
            STATS["candidates_failed"] += 1
            timings[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
            continue
        timings[name] = ms
        if ms < best_ms:
            best, best_ms = config, ms
    elapsed = time.perf_counter() - start
    STATS["tuning_s"] += elapsed
    return {
        "config": best,
        "ms": best_ms if math.isfinite(best_ms) else None,
        "candidates": timings,
        "tuning_s": round(elapsed, 3),
        "shape_tuned_on": [tuple(t.shape) for t in outputs][0],
    }
