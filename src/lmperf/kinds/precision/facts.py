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
    fp16_error_over_fp32: float | None
    cast_identical: bool  # the in-place add of an fp16 operand gives what the explicit cast to fp32 gives
    # an fp32 accumulator of fp16 increments lands nearer the exact sum of the stored increments than that
    # sum lies from the exact answer: its error is the increment's fp16 representation
    fp32_sum_is_representation: bool


def accumulation_facts(record: dict) -> AccumulationFacts:
    loops = {r["variant"]: r for r in record["metrics"]["results"]}
    fp32, mixed = loops["fp32 += fp32"]["abs_error"], loops["fp32 += fp16"]
    stored = mixed["exact_sum_of_stored_increment"]
    return AccumulationFacts(
        loops,
        loops["fp16 += fp16"]["abs_error"] / fp32 if fp32 else None,
        mixed["result"] == loops["fp32 += fp16 cast to fp32"]["result"],
        abs(mixed["result"] - stored) < abs(stored - mixed["exact"]),
    )


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


def toy_facts(record: dict) -> ToyFacts:
    return ToyFacts(record["metrics"].get("device_type", "?"), record["metrics"]["autocast"])


def kernel_close(row: dict) -> bool:
    """F.layer_norm is within CLOSE_ERROR_FACTOR of the fp32 computation from the same rounded inputs."""
    k, ref = row.get("output_kernel_err"), row.get("output_fp32_from_rounded_input_err")
    return not nonfinite(k) and not nonfinite(ref) and k <= CLOSE_ERROR_FACTOR * ref


@dataclass(frozen=True)
class LayerNormFacts:
    rows: tuple[dict, ...]
    overflowing: list[dict]  # fp16 rows whose Σx², accumulated in fp32, overflows stored in fp16 (smallest mean first)
    broken: list[tuple[str, float]]  # (column, mean): the variances and outputs of those rows that are inf/NaN
    bf16_overflows: bool | None
    bf16_coarser: bool | None  # bf16 rounds its inputs more coarsely than fp16 at the largest mean
    compared: list[dict]  # fp16 and bf16 at the largest mean whose running sum stays finite in both


def layer_norm_facts(record: dict) -> LayerNormFacts:
    rows = record["metrics"]["results"]
    of = {d: [r for r in rows if r["dtype"] == d] for d in ("fp16", "bf16")}
    over = sorted((r for r in of["fp16"] if r["sum_of_squares_fp32_accumulation_overflow"]), key=lambda r: r["mean"])
    largest = max(r["mean"] for r in rows)
    top = {r["dtype"]: r["input_rounding_err_std"] for r in rows if r["mean"] == largest}
    low = [r for r in rows if r["dtype"] in of]
    overflowed = {r["mean"] for r in low if nonfinite(r["mean_lowp_accumulation_err_std"])}  # overflow is apart
    means = [r["mean"] for r in low if r["mean"] not in overflowed]
    return LayerNormFacts(
        tuple(rows),
        over,
        [(k, r["mean"]) for r in over for k in VARIANCE_AND_OUTPUT if nonfinite(r.get(k))],
        any(r["sum_of_squares_fp32_accumulation_overflow"] for r in of["bf16"]) if of["bf16"] else None,
        top["bf16"] > top["fp16"] if {"bf16", "fp16"} <= set(top) else None,
        [r for r in low if means and r["mean"] == max(means)],
    )
