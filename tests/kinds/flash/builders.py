"""Small synthetic flash records that pass the record schema (lmperf.core.record.make_record)."""

from __future__ import annotations

from lmperf.core.record import make_record
from tests.kinds import records

PASSES = ("forward", "backward", "forward_backward")


def provenance(device: str = "h100", **settings) -> dict:
    name = "x86_64" if device == "cpu" else None
    return records.provenance(device, name, code_version="0123456789abcdef", matmul_allow_tf32=False, settings=settings)


def bench(impl, d, n, ms=1.0, *, precision="bf16", status="ok", spread=None, trials=None, device="h100", **metrics):
    """A benchmark record: forward+backward ``ms``, forward a third of it, backward two thirds; with
    ``spread`` an interval of ± that share and ``trials`` (5 by default) trials."""
    trials = trials or (5 if spread is not None else 1)
    if status == "ok":
        for p, share in zip(PASSES, (1 / 3, 2 / 3, 1.0)):
            metrics[f"{p}_ms_median"] = ms * share
            if spread is not None:
                metrics[f"{p}_ms_median_interval"] = [ms * share * (1 - spread), ms * share * (1 + spread)]
        if trials > 1:
            metrics["trials"] = [{"start_time": f"t{i}"} for i in range(trials)]
    cell = {"test": "benchmark", "implementation": impl, "precision": precision, "head_dim": d, "sequence_length": n}
    cell |= {"batch_size": 1, "causal": True}
    settings = {"precision": precision, "implementations": ["plain", "flash", "sdpa"], "warmup_ms": 10.0}
    settings |= {"rep_ms": 50.0, "batch_size": 1, "causal": True, "sdpa_backend": "EFFICIENT_ATTENTION"}
    reason = {"ok": None, "oom": "out of memory", "unsupported": "no CUDA device"}[status]
    return make_record("flash", cell, status, metrics, provenance(device, **settings), reason)


def entry(precision="bf16", d=64, causal=True, error=1e-3, tol=(2e-2, 3e-2), status="ok", saved_ok=True) -> dict:
    return {
        "precision": precision,
        "head_dim": d,
        "causal": causal,
        "batch": 2,
        "n_queries": 64,
        "n_keys": 64,
        "seed": 7,
        "tolerance_o_l": tol[0],
        "tolerance_grad": tol[1],
        "saved_contract_ok": saved_ok,
        **{f"{t}_rel_error": error for t in ("O", "L", "dQ", "dK", "dV")},
        "status": status,
        "failed_checks": [] if status == "ok" else ["O error 5.00e-01 >= 2e-02"],
    }


def correctness(impl: str, entries: list[dict], device: str = "h100") -> dict:
    function = {"pytorch": "FlashAttention2PyTorch", "triton": "FlashAttention2Triton"}[impl]
    metrics = {"function": function, "kernel_mode": impl, "seed": 7, "entries_detail": entries}
    return make_record("flash", {"test": "correctness", "implementation": impl}, "ok", metrics, provenance(device))


def leaderboard(ours=4.75, flash=7.02, cudnn=4.51, spread=None, trials=1, device="h100") -> dict:
    """A leaderboard record at d = 64; with ``spread`` the merged trials' intervals at the top level."""
    times = {"flash": ours, "sdpa_flash": flash, "sdpa_cudnn": cudnn}
    protocol = {impl: {"forward_backward_ms_median": ms, "status": "ok", "error": None} for impl, ms in times.items()}
    metrics = {
        "leaderboard_shape": {"batch": 16, "seq": 16384, "head_dim": 64, "dtype": "bf16", "causal": True},
        "protocol_by_head_dim": {"64": protocol},
        "side_by_side": [],
    }
    for impl, ms in times.items():
        metrics[f"{impl}_d64_forward_backward_ms_median"] = ms
        if spread is not None:
            metrics[f"{impl}_d64_forward_backward_ms_median_interval"] = [ms * (1 - spread), ms * (1 + spread)]
    if trials > 1:
        metrics["trials"] = [{} for _ in range(trials)]
    settings = {"compile": True, "warmup_ms": 1000.0, "rep_ms": 10000.0}
    return make_record("flash", {"test": "leaderboard"}, "ok", metrics, provenance(device, **settings))
