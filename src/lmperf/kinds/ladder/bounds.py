"""What bounds a ladder's best rung: the measured GEMM ceilings and the profile of the best rung.

The profile's step is split into parts that add up to the profiled step: the kernel time of each
class (lmperf.profiling.kernels: GEMMs ``matmul``, fused attention ``attention``, …), the GPU's idle
time, less any time counted twice where kernels overlapped.
"""

from __future__ import annotations

import dataclasses

from lmperf.kinds.ladder.facts import ADAMW_BYTES_PER_PARAM, UNFUSED_ATTENTION, Rung

ATTENTION_CLASS, MATMUL_CLASS = "attention", "matmul"
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
        m = r["metrics"] if r["kind"] == "gemm_peak" and r["status"] == "ok" else {}
        for p in m.get("precisions", []):
            out.append(Ceiling(p, float(m[f"{p}_tflops"]), m.get(f"{p}_best_n"), m.get(f"{p}_datasheet_tflops")))
    return out


@dataclasses.dataclass(frozen=True)
class Profile:
    """A ladder_profile record read against the ladder's best rung (times per profiled step)."""

    model: str
    context_length: int
    status: str = "ok"
    reason: str | None = None
    rung: str | None = None
    precision: str = "bf16"  # the profiled rung's matmul precision (its GEMM ceiling)
    steps: int = 0
    parts: tuple[tuple[str, float], ...] = ()  # kernel classes, idle, overlap: they add up to the step
    busy_fraction: float | None = None
    matmul_ms: float | None = None  # the matmul class's kernel time per step
    matmul_tflops: float | None = None
    attention_separate: bool = False
    attention_fused: bool = False
    attention_ms: float | None = None
    attention_tflops: float | None = None
    optimizer_ms: float | None = None
    optimizer_floor_ms: float | None = None
    top_kernels: tuple[dict, ...] = ()
    mfu: dict = dataclasses.field(default_factory=dict)  # the profiled rung's, where it is the best rung

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.steps > 0


def step_parts(m: dict, steps: int) -> tuple[tuple[str, float], ...]:
    """Per step: each kernel class's time, the idle time, and minus what overlapping kernels add."""
    classes = sorted(m.get("class_ms", {}).items(), key=lambda kv: -kv[1])
    parts = [(name, ms / steps) for name, ms in classes] + [("idle", m.get("idle_ms", 0.0) / steps)]
    window = m["window_ms"] / steps
    overlap = window - sum(v for _, v in parts)
    return tuple(parts + ([(OVERLAP, overlap)] if abs(overlap) > 1e-6 * window else []))


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
    # attention the profile does not tell apart runs among the matmul kernels
    out["matmul_tflops"] = (full - attention_full + (0 if attention_ms else attention)) / (matmul_ms / 1e3) / 1e12
    if attention_ms:
        out["attention_tflops"] = attention / (attention_ms / 1e3) / 1e12
    return out


def at_ceiling_ms(p: Profile, ceiling: Ceiling) -> float | None:
    """The profiled step with its matmul kernels at ``ceiling``'s rate and every other part as profiled;
    None where the profile gives no matmul rate, or its matmuls already run at the ceiling or above."""
    if p.matmul_tflops is None or not p.matmul_ms or p.matmul_tflops >= ceiling.tflops:
        return None
    return sum(v for _, v in p.parts) - p.matmul_ms * (1 - p.matmul_tflops / ceiling.tflops)


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
        rung=m.get("rung"),
        precision="fp8" if (m.get("config") or {}).get("fp8") else "bf16",
        steps=steps,
        parts=step_parts(m, steps),
        busy_fraction=m.get("busy_fraction"),
        matmul_ms=per_step.get(MATMUL_CLASS),
        optimizer_ms=per_step.get("optimizer"),
        optimizer_floor_ms=floor,
        top_kernels=tuple(m.get("top_kernels", [])),
        **(matmul_rates(best, per_step) | {"mfu": best.mfu} if m.get("rung") == best.name else {}),
    )
