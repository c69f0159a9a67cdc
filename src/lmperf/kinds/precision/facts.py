"""What the precision probes' records say, with their verdicts: pure functions of the records, one per
probe (``cell.probe``: accumulation, toy_model, layer_norm). Rows are the probes' own result dicts."""

from __future__ import annotations

import math
from dataclasses import dataclass

# F.layer_norm's output error is "close to" the fp32 computation's from the same rounded inputs when it
# is at most this multiple of it: what remains is then the inputs' own rounding.
CLOSE_ERROR_FACTOR = 2.0
# A variance or a normalised output: what an overflowed Σx² would turn into inf/NaN if computed from it.
VARIANCE_AND_OUTPUT = ("var_one_pass_rel_err", "var_two_pass_rel_err", "output_lowp_err", "output_kernel_err")


def by_probe(records: list[dict]) -> dict[str, dict]:
    """The ok records by probe."""
    return {r["cell"]["probe"]: r for r in records if r["kind"] == "precision" and r["status"] == "ok"}


def nonfinite(x) -> bool:
    """A record's value that says the computation overflowed: null, NaN or inf."""
    return x is None or (isinstance(x, float) and not math.isfinite(x))


@dataclass(frozen=True)
class AccumulationFacts:
    loops: dict[str, dict]  # variant -> its result

    @property
    def fp16_error_over_fp32(self) -> float | None:
        fp32 = self.loops["fp32 += fp32"]["abs_error"]
        return self.loops["fp16 += fp16"]["abs_error"] / fp32 if fp32 else None

    @property
    def cast_identical(self) -> bool:
        """The in-place add of an fp16 operand gives what the explicit cast to fp32 gives."""
        return self.loops["fp32 += fp16"]["result"] == self.loops["fp32 += fp16 cast to fp32"]["result"]

    @property
    def fp32_sum_is_representation(self) -> bool:
        """An fp32 accumulator of fp16 increments lands nearer the exact sum of the stored increments than
        that sum lies from the exact answer: its error is the increment's fp16 representation."""
        c = self.loops["fp32 += fp16"]
        stored = c["exact_sum_of_stored_increment"]
        return abs(c["result"] - stored) < abs(stored - c["exact"])


@dataclass(frozen=True)
class ToyFacts:
    device_type: str
    autocasts: dict[str, dict]  # autocast dtype -> {tensor: dtype (or {name: dtype}), …}

    def of(self, dtype: str, tensor: str) -> str | None:
        """A tensor's dtype under one autocast type; the dtypes of a {name: dtype} mapping, joined."""
        value = self.autocasts[dtype].get(tensor)
        return ", ".join(sorted(set(value.values()))) if isinstance(value, dict) else value

    def all(self, tensor: str, dtype: str) -> bool:
        """Under every autocast type, ``tensor`` is ``dtype``."""
        return bool(self.autocasts) and all(self.of(d, tensor) == dtype for d in self.autocasts)


def kernel_close(row: dict) -> bool:
    """F.layer_norm is within CLOSE_ERROR_FACTOR of the fp32 computation from the same rounded inputs."""
    k, ref = row.get("output_kernel_err"), row.get("output_fp32_from_rounded_input_err")
    return not nonfinite(k) and not nonfinite(ref) and k <= CLOSE_ERROR_FACTOR * ref


@dataclass(frozen=True)
class LayerNormFacts:
    rows: tuple[dict, ...]

    def of(self, dtype: str) -> list[dict]:
        return [r for r in self.rows if r["dtype"] == dtype]

    @property
    def overflowing(self) -> list[dict]:
        """fp16 rows whose Σx², accumulated in fp32, overflows once stored in fp16 (smallest mean first)."""
        return sorted(
            (r for r in self.of("fp16") if r["sum_of_squares_fp32_accumulation_overflow"]), key=lambda r: r["mean"]
        )

    @property
    def broken(self) -> list[tuple[str, float]]:
        """(column, mean): the variances and outputs of the overflowing rows that are inf/NaN."""
        return [(k, r["mean"]) for r in self.overflowing for k in VARIANCE_AND_OUTPUT if nonfinite(r.get(k))]

    @property
    def bf16_overflows(self) -> bool | None:
        return any(r["sum_of_squares_fp32_accumulation_overflow"] for r in self.of("bf16")) if self.of("bf16") else None

    @property
    def bf16_coarser(self) -> bool | None:
        """bf16 rounds its inputs more coarsely than fp16 at the largest mean."""
        largest = max(r["mean"] for r in self.rows)
        top = {r["dtype"]: r["input_rounding_err_std"] for r in self.rows if r["mean"] == largest}
        return top["bf16"] > top["fp16"] if {"bf16", "fp16"} <= set(top) else None

    @property
    def compared(self) -> list[dict]:
        """fp16 and bf16 at the largest mean whose running sum stays finite in both (overflow is apart)."""
        low = [r for r in self.rows if r["dtype"] in ("fp16", "bf16")]
        overflowed = {r["mean"] for r in low if nonfinite(r["mean_lowp_accumulation_err_std"])}
        means = [r["mean"] for r in low if r["mean"] not in overflowed]
        return [r for r in low if means and r["mean"] == max(means)]


def accumulation_facts(record: dict) -> AccumulationFacts:
    return AccumulationFacts({r["variant"]: r for r in record["metrics"]["results"]})


def toy_facts(record: dict) -> ToyFacts:
    return ToyFacts(record["metrics"].get("device_type", "?"), record["metrics"]["autocast"])


def layer_norm_facts(record: dict) -> LayerNormFacts:
    return LayerNormFacts(tuple(record["metrics"]["results"]))
