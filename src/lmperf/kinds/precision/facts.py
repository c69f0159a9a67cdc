"""What the precision probes' records say, with their verdicts: computed from the records, a class per
probe (``cell.probe``: accumulation, toy_model, layer_norm). Rows are the probes' own result dicts."""

from __future__ import annotations

import math

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


class AccumulationFacts:
    def __init__(self, record: dict):
        self.loops = loops = {r["variant"]: r for r in record["metrics"]["results"]}  # variant -> its result
        fp32, mixed = loops["fp32 += fp32"]["abs_error"], loops["fp32 += fp16"]
        self.fp16_error_over_fp32 = loops["fp16 += fp16"]["abs_error"] / fp32 if fp32 else None
        # the in-place add of an fp16 operand gives what the explicit cast to fp32 gives
        self.cast_identical = mixed["result"] == loops["fp32 += fp16 cast to fp32"]["result"]
        # an fp32 accumulator of fp16 increments lands nearer the exact sum of the stored increments than that
        # sum lies from the exact answer: its error is the increment's fp16 representation
        stored = mixed["exact_sum_of_stored_increment"]
        self.fp32_sum_is_representation = abs(mixed["result"] - stored) < abs(stored - mixed["exact"])


class ToyFacts:
    def __init__(self, record: dict):
        self.device_type = record["metrics"].get("device_type", "?")
        self.autocasts = record["metrics"]["autocast"]  # autocast dtype -> {tensor: dtype (or {name: dtype}), …}

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


class LayerNormFacts:
    def __init__(self, record: dict):
        self.rows = rows = tuple(record["metrics"]["results"])
        of = {d: [r for r in rows if r["dtype"] == d] for d in ("fp16", "bf16")}
        # fp16 rows whose Σx², accumulated in fp32, overflows stored in fp16 (smallest mean first)
        over = [r for r in of["fp16"] if r["sum_of_squares_fp32_accumulation_overflow"]]
        self.overflowing = sorted(over, key=lambda r: r["mean"])
        # (column, mean): the variances and outputs of those rows that are inf/NaN
        self.broken = [(k, r["mean"]) for r in self.overflowing for k in VARIANCE_AND_OUTPUT if nonfinite(r.get(k))]
        bf16_over = [r["sum_of_squares_fp32_accumulation_overflow"] for r in of["bf16"]]
        self.bf16_overflows = any(bf16_over) if bf16_over else None
        # bf16 rounds its inputs more coarsely than fp16 at the largest mean
        largest = max(r["mean"] for r in rows)
        top = {r["dtype"]: r["input_rounding_err_std"] for r in rows if r["mean"] == largest}
        self.bf16_coarser = top["bf16"] > top["fp16"] if {"bf16", "fp16"} <= set(top) else None
        # fp16 and bf16 at the largest mean whose running sum stays finite in both
        low = [r for r in rows if r["dtype"] in of]
        overflowed = {r["mean"] for r in low if nonfinite(r["mean_lowp_accumulation_err_std"])}  # overflow is apart
        means = [r["mean"] for r in low if r["mean"] not in overflowed]
        self.compared = [r for r in low if means and r["mean"] == max(means)]
