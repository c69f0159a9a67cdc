"""Small synthetic flash records that pass the record schema (lmperf.core.record.make_record)."""

from __future__ import annotations

from lmperf.core.record import make_record

PASSES = ("forward", "backward", "forward_backward")


def provenance(device: str = "h100", **settings) -> dict:
    return {
        "device_slug": device,
        "device_name": {"h100": "NVIDIA H100 80GB HBM3", "cpu": "x86_64"}.get(device, device),
        "torch_version": "2.11.0",
        "git_commit": "0123456789abcdef0123456789abcdef01234567",
        "git_dirty": False,
        "start_time": "2026-01-01T00:00:00+00:00",
        "code_version": "0123456789abcdef",
        "matmul_allow_tf32": False,
        "settings": settings,
    }


def bench(impl, d, n, ms=1.0, *, precision="bf16", status="ok", spread=None, trials=None, device="h100", **settings):
    """A benchmark record: forward+backward ``ms``, forward a third of it, backward two thirds."""
    trials = trials or (5 if spread is not None else 1)
    metrics: dict = {}
    if status == "ok":
        for p, share in zip(PASSES, (1 / 3, 2 / 3, 1.0)):
            metrics[f"{p}_ms_median"] = ms * share
            if spread is not None:
                metrics[f"{p}_ms_median_interval"] = [ms * share * (1 - spread), ms * share * (1 + spread)]
        if trials > 1:
            metrics["trials"] = [{"start_time": f"t{i}"} for i in range(trials)]
    cell = {
        "test": "benchmark",
        "implementation": impl,
        "precision": precision,
        "head_dim": d,
        "sequence_length": n,
        "batch_size": 1,
        "causal": True,
    }
    asked = {
        "precision": precision,
        "implementations": ["plain", "flash_triton"],
        "head_dims": [d],
        "sequence_lengths": [n],
        "warmup_ms": 10.0,
        "rep_ms": 50.0,
        "batch_size": 1,
        "causal": True,
        **settings,
    }
    reason = {"ok": None, "oom": "out of memory", "unsupported": "no CUDA device"}[status]
    return make_record("flash", cell, status, metrics, provenance(device, **asked), reason)


def entry(precision="bf16", d=64, causal=True, error=1e-3, tol=(2e-2, 3e-2), status="ok", saved_ok=True) -> dict:
    return {
        "precision": precision,
        "head_dim": d,
        "causal": causal,
        "batch": 2,
        "n_queries": 64,
        "n_keys": 64,
        "seed": 7,
        "course": True,
        "tolerance_o_l": tol[0],
        "tolerance_grad": tol[1],
        "saved_tensor_count": 5,
        "saved_l_shaped_count": 1 if saved_ok else 0,
        "saved_l_dtype": "float32",
        "saved_contract_ok": saved_ok,
        **{f"{t}_rel_error": error for t in ("O", "L", "dQ", "dK", "dV")},
        "output_dtype_ok": True,
        "status": status,
        "failed_checks": [] if status == "ok" else ["O_rel_error above tolerance"],
        "message": None,
    }


def correctness(impl: str, entries: list[dict], device: str = "h100") -> dict:
    metrics = {
        "function": {"pytorch": "FlashAttention2PyTorch", "triton": "FlashAttention2Triton"}[impl],
        "kernel_mode": "triton compiled" if impl == "triton" else "pytorch",
        "seed": 7,
        "entries_detail": entries,
    }
    return make_record("flash", {"test": "correctness", "implementation": impl}, "ok", metrics, provenance(device))


def protocol_result(ms: float, spread: float | None = None, trials: int = 1) -> dict:
    out = {"forward_backward_ms_median": ms, "status": "ok", "error": None}
    if spread is not None:
        out["forward_backward_ms_median_interval"] = [ms * (1 - spread), ms * (1 + spread)]
        out["trials"] = [{} for _ in range(trials)]
    return out


def leaderboard(ours=4.75, flash=7.02, cudnn=4.51, spread=None, trials=1, device="h100") -> dict:
    protocol = {
        "flash_triton": protocol_result(ours, spread, trials),
        "sdpa_flash": protocol_result(flash, spread, trials),
        "sdpa_cudnn": protocol_result(cudnn, spread, trials),
    }
    metrics = {
        "leaderboard_shape": {"batch": 16, "seq": 16384, "head_dim": 64, "dtype": "bf16", "causal": True},
        "protocol": protocol,
        "protocol_by_head_dim": {"64": protocol},
        "side_by_side": [],
    }
    settings = {"compile": True, "warmup_ms": 1000.0, "rep_ms": 10000.0}
    return make_record("flash", {"test": "leaderboard"}, "ok", metrics, provenance(device, **settings))
