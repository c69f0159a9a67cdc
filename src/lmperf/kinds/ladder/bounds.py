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


def step_parts(m: dict, steps: int) -> tuple[tuple[str, float], ...]:
    """Per step: each kernel class's time, the idle time, and minus what overlapping kernels add."""
    classes = sorted(m.get("class_ms", {}).items(), key=lambda kv: -kv[1])
    parts = [(name, ms / steps) for name, ms in classes] + [("idle", m.get("idle_ms", 0.0) / steps)]
    window = m["window_ms"] / steps
    overlap = window - sum(v for _, v in parts)
    return tuple(parts + ([(OVERLAP, overlap)] if abs(overlap) > 1e-6 * window else []))


class Profile:
    """A ladder_profile record read against the ladder's best rung (times per profiled step). Its ``parts``
    (kernel classes, idle, overlap) add up to the step; the rates and MFU only where it profiled the best rung."""

    matmul_tflops = attention_ms = attention_tflops = None
    attention_separate = attention_fused = False

    def __init__(self, record: dict, best: Rung | None):
        cell, m = record["cell"], record.get("metrics") or {}
        self.model, self.context_length = cell["model"], int(cell["context_length"])
        self.steps = steps = int(m.get("profiled_steps") or 0)
        self.ok = record["status"] == "ok" and steps > 0 and best is not None
        if not self.ok:
            self.reason = record.get("reason") or "no best rung to compare with"
            return
        self.rung, self.busy_fraction = m.get("rung"), m.get("busy_fraction")
        self.parts = step_parts(m, steps)
        # the profiled rung's matmul precision (its GEMM ceiling)
        self.precision = "fp8" if (m.get("config") or {}).get("fp8") else "bf16"
        per_step = {name: ms / steps for name, ms in m.get("class_ms", {}).items()}
        self.matmul_ms, self.optimizer_ms = per_step.get(MATMUL_CLASS), per_step.get("optimizer")
        self.optimizer_floor_ms = None
        if best.parameter_count and best.hbm_gbps:
            self.optimizer_floor_ms = best.parameter_count * ADAMW_BYTES_PER_PARAM / (best.hbm_gbps * 1e9) * 1e3
        self.top_kernels, self.mfu = tuple(m.get("top_kernels", [])), {}
        if self.rung == best.name:
            self.mfu, self.attention_ms = best.mfu, per_step.get(ATTENTION_CLASS)
            self.matmul_rates(best)

    def matmul_rates(self, best: Rung) -> None:
        """TFLOP/s of the matmul class (and of attention, where the profile tells it apart), with the
        FLOPs the kernels compute: causal attention half for a fused kernel, in full for the unfused one."""
        full, half = best.step_flops, best.step_flops_causal_half
        self.attention_fused = best.attention_kernel not in UNFUSED_ATTENTION
        self.attention_separate = self.attention_ms is not None
        if full is None or half is None or not self.matmul_ms:
            return
        attention_full = 2 * (full - half)  # the causal half removed half of the attention FLOPs
        attention = attention_full / 2 if self.attention_fused else attention_full
        # attention the profile does not tell apart runs among the matmul kernels
        flops = full - attention_full + (0 if self.attention_ms else attention)
        self.matmul_tflops = flops / (self.matmul_ms / 1e3) / 1e12
        if self.attention_ms:
            self.attention_tflops = attention / (self.attention_ms / 1e3) / 1e12


def at_ceiling_ms(p: Profile, ceiling: Ceiling) -> float | None:
    """The profiled step with its matmul kernels at ``ceiling``'s rate and every other part as profiled;
    None where the profile gives no matmul rate, or its matmuls already run at the ceiling or above."""
    if p.matmul_tflops is None or not p.matmul_ms or p.matmul_tflops >= ceiling.tflops:
        return None
    return sum(v for _, v in p.parts) - p.matmul_ms * (1 - p.matmul_tflops / ceiling.tflops)
