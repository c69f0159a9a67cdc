"""What bounds a ladder's best rung: the measured GEMM ceilings and the profile of the best rung.

Pure functions from records (``gemm_peak``, ``ladder_profile``) and a ladder's facts to small frozen
dataclasses. The profile's step is split into parts that add up to the profiled step: the kernel
time of each class, the GPU's idle time, less any time counted twice where kernels overlapped.
"""

from __future__ import annotations

import dataclasses

from lmperf.kinds.ladder.facts import ADAMW_BYTES_PER_PARAM, PROFILE_RUN_TOLERANCE, UNFUSED_ATTENTION, Rung

# a kernel class the profile may give attention kernels (records before issue 51 count them as matmuls)
ATTENTION_CLASS = "attention"
MATMUL_CLASS = "matmul"
OVERLAP = "kernels overlapping (counted twice)"


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """The best rate a square GEMM reached here in one precision, beside the datasheet's."""

    precision: str
    tflops: float
    best_n: int | None
    datasheet_tflops: float | None

    @property
    def share_of_datasheet(self) -> float | None:
        return self.tflops / self.datasheet_tflops if self.datasheet_tflops else None


def ceilings_from(records: list[dict]) -> list[Ceiling]:
    out = []
    for r in records:
        if r["kind"] != "gemm_peak" or r["status"] != "ok":
            continue
        m = r["metrics"]
        for p in m.get("precisions", []):
            if m.get(f"{p}_tflops") is not None:
                out.append(Ceiling(p, float(m[f"{p}_tflops"]), m.get(f"{p}_best_n"), m.get(f"{p}_datasheet_tflops")))
    return out


@dataclasses.dataclass(frozen=True)
class Profile:
    """A ladder_profile record read against the ladder's best rung (per profiled step)."""

    model: str
    context_length: int
    status: str
    reason: str | None
    rung: str | None = None
    steps: int = 0
    step_ms: float | None = None  # the profiled window over its steps
    parts: tuple[tuple[str, float], ...] = ()  # kernel classes, idle, overlap: they add up to step_ms
    busy_fraction: float | None = None
    matmul_ms: float | None = None
    matmul_tflops: float | None = None
    attention_separate: bool = False
    attention_fused: bool = False
    attention_ms: float | None = None
    attention_tflops: float | None = None
    optimizer_ms: float | None = None
    optimizer_floor_ms: float | None = None
    ladder_step_ms_then: float | None = None
    ladder_step_ms_now: float | None = None
    best_rung: str | None = None
    same_config: bool = True  # the profiled configuration is the best rung's (batch included)
    commit: str = "unknown"
    top_kernels: tuple[dict, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.steps > 0

    @property
    def same_run(self) -> bool:
        """The profile replayed today's best rung, as the ladder records now time it."""
        if self.rung != self.best_rung or not self.same_config:
            return False
        then, now = self.ladder_step_ms_then, self.ladder_step_ms_now
        return not (then and now and abs(then - now) / now > PROFILE_RUN_TOLERANCE)


def step_parts(m: dict, steps: int) -> tuple[tuple[str, float], ...]:
    """Per step: each kernel class's time, the idle time, and minus what overlapping kernels add."""
    classes = sorted(m.get("class_ms", {}).items(), key=lambda kv: -kv[1])
    parts = [(name, ms / steps) for name, ms in classes] + [("idle", m.get("idle_ms", 0.0) / steps)]
    window = m["window_ms"] / steps
    overlap = window - sum(v for _, v in parts)
    if abs(overlap) > 1e-6 * window:
        parts.append((OVERLAP, overlap))
    return tuple(parts)


def matmul_rates(best: Rung, per_step: dict) -> dict:
    """TFLOP/s of the matmul class (and of attention, where the profile tells it apart), with the
    FLOPs the kernels compute: causal attention half for a fused kernel, in full for the unfused one."""
    full, half = best.step_flops, best.step_flops_causal_half
    matmul_ms, attention_ms = per_step.get(MATMUL_CLASS), per_step.get(ATTENTION_CLASS)
    fused = best.attention_kernel not in UNFUSED_ATTENTION
    out = {"attention_fused": fused, "attention_separate": attention_ms is not None, "attention_ms": attention_ms}
    if full is None or half is None or not matmul_ms:
        return out
    attention_full = 2 * (full - half)  # the causal half removed half of the attention FLOPs
    attention = attention_full / 2 if fused else attention_full
    if attention_ms:
        out["matmul_tflops"] = (full - attention_full) / (matmul_ms / 1e3) / 1e12
        out["attention_tflops"] = attention / (attention_ms / 1e3) / 1e12
    else:
        out["matmul_tflops"] = (full - attention_full + attention) / (matmul_ms / 1e3) / 1e12
    return out


def profile_from(record: dict, best: Rung | None) -> Profile:
    cell, m = record["cell"], record.get("metrics") or {}
    base = dict(model=cell["model"], context_length=int(cell["context_length"]))
    steps = int(m.get("profiled_steps") or 0)
    if record["status"] != "ok" or not steps or best is None:
        return Profile(**base, status=record["status"], reason=record.get("reason") or "no best rung to compare with")
    per_step = {name: ms / steps for name, ms in m.get("class_ms", {}).items()}
    floor = None
    if best.parameter_count and best.hbm_gbps:
        floor = best.parameter_count * ADAMW_BYTES_PER_PARAM / (best.hbm_gbps * 1e9) * 1e3
    return Profile(
        **base,
        status="ok",
        reason=None,
        rung=m.get("rung"),
        steps=steps,
        step_ms=m["window_ms"] / steps,
        parts=step_parts(m, steps),
        busy_fraction=m.get("busy_fraction"),
        matmul_ms=per_step.get(MATMUL_CLASS),
        optimizer_ms=per_step.get("optimizer"),
        optimizer_floor_ms=floor,
        ladder_step_ms_then=m.get("step_ms_ladder"),
        ladder_step_ms_now=best.step_ms.median if best.step_ms else None,
        best_rung=best.name,
        same_config=m.get("config") in (None, best.config),
        commit=(record.get("provenance", {}).get("git_commit") or "unknown")[:7],
        top_kernels=tuple(m.get("top_kernels", [])),
        **(matmul_rates(best, per_step) if m.get("rung") == best.name else {}),
    )
