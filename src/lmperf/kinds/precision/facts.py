"""What the precision probes' records say: small frozen dataclasses, verdicts included, from pure
functions. One record per probe (``cell.probe``): ``accumulation``, ``toy_model``, ``layer_norm``."""

from __future__ import annotations

import math
from dataclasses import dataclass

# F.layer_norm's output error is "close to" the fp32 computation's from the same rounded inputs when
# it is at most this multiple of it: what remains is then the inputs' own rounding.
CLOSE_ERROR_FACTOR = 2.0
LOW_PRECISIONS = ("fp16", "bf16")
# The layer-norm columns holding a variance or a normalised output: what an overflowed Σx² would turn
# into inf/NaN if they were computed from it.
VARIANCE_AND_OUTPUT = (
    "var_one_pass_rel_err",
    "var_two_pass_rel_err",
    "output_lowp_err",
    "output_kernel_err",
    "output_fp32_from_rounded_input_err",
)


# Every error column of a layer-norm row, in the table's order.
ERROR_COLUMNS = (
    "input_rounding_err_std",
    "mean_lowp_accumulation_err_std",
    "mean_fp32_accumulation_err_std",
    *VARIANCE_AND_OUTPUT,
)


def by_probe(records: list[dict]) -> dict[str, dict]:
    """The ok records by probe."""
    return {r["cell"]["probe"]: r for r in records if r["kind"] == "precision" and r["status"] == "ok"}


def nonfinite(x) -> bool:
    """A record's value that says the computation overflowed: null, NaN or inf."""
    return x is None or (isinstance(x, float) and not math.isfinite(x))


# -- mixed_precision_accumulation -------------------------------------------------------------------


@dataclass(frozen=True)
class Loop:
    variant: str
    steps: int
    result: float
    exact: float
    abs_error: float
    stored_increment: float  # 0.01 as the increment's dtype stores it
    exact_sum_of_stored: float  # steps × the stored increment, exactly
    spacing: float  # the accumulator's spacing at the result


@dataclass(frozen=True)
class AccumulationFacts:
    loops: tuple[Loop, ...]

    def get(self, variant: str) -> Loop | None:
        return next((x for x in self.loops if x.variant == variant), None)

    @property
    def fp16_error_over_fp32(self) -> float | None:
        a, b = self.get("fp32 += fp32"), self.get("fp16 += fp16")
        return b.abs_error / a.abs_error if a and b and a.abs_error else None

    @property
    def cast_identical(self) -> bool | None:
        """The in-place add of an fp16 operand gives what the explicit cast to fp32 gives."""
        c, d = self.get("fp32 += fp16"), self.get("fp32 += fp16 cast to fp32")
        return None if c is None or d is None else c.result == d.result

    @property
    def fp32_sum_is_representation(self) -> bool | None:
        """An fp32 accumulator of fp16 increments lands nearer the sum of the stored increments than
        that sum lies from the exact answer: its error is 0.01's fp16 representation, not accumulation."""
        c = self.get("fp32 += fp16")
        if c is None:
            return None
        return abs(c.result - c.exact_sum_of_stored) < abs(c.exact_sum_of_stored - c.exact)


def accumulation_facts(record: dict) -> AccumulationFacts:
    return AccumulationFacts(
        tuple(
            Loop(
                variant=r["variant"],
                steps=r["steps"],
                result=r["result"],
                exact=r["exact"],
                abs_error=r["abs_error"],
                stored_increment=r["stored_increment"],
                exact_sum_of_stored=r["exact_sum_of_stored_increment"],
                spacing=r["accumulator_spacing_at_result"],
            )
            for r in record["metrics"]["results"]
        )
    )


# -- benchmarking_mixed_precision (a) ---------------------------------------------------------------

TOY_TENSORS = ("parameters", "fc1_output", "relu_output", "ln_output", "logits", "loss", "gradients")


def dtype_text(value) -> str:
    """A dtype, or the dtypes of a {name: dtype} mapping (parameters, gradients)."""
    return ", ".join(sorted(set(value.values()))) if isinstance(value, dict) else str(value)


@dataclass(frozen=True)
class Autocast:
    """What one autocast dtype did to the toy model's tensors (``dtypes`` empty where unsupported)."""

    dtype: str
    supported: bool
    reason: str | None
    dtypes: tuple[tuple[str, str], ...]  # (tensor, dtype) in TOY_TENSORS order

    def of(self, tensor: str) -> str | None:
        return dict(self.dtypes).get(tensor)

    @property
    def ln_in_fp32(self) -> bool:
        return self.of("ln_output") == "fp32"

    @property
    def loss_in_fp32(self) -> bool:
        return self.of("loss") == "fp32"


@dataclass(frozen=True)
class ToyFacts:
    device_type: str
    autocasts: tuple[Autocast, ...]

    @property
    def supported(self) -> list[Autocast]:
        return [a for a in self.autocasts if a.supported]


def toy_facts(record: dict) -> ToyFacts:
    autocasts = []
    for dtype, entry in record["metrics"]["autocast"].items():
        ok = entry.get("status") == "ok"
        dtypes = tuple((t, dtype_text(entry[t])) for t in TOY_TENSORS if t in entry) if ok else ()
        autocasts.append(Autocast(dtype, ok, None if ok else entry.get("reason"), dtypes))
    return ToyFacts(record["metrics"].get("device_type", "?"), tuple(autocasts))


# -- benchmarking_mixed_precision (b) ---------------------------------------------------------------


@dataclass(frozen=True)
class LowPrecision:
    """One low-precision type's layer-norm errors at one mean (σ units; variances relative)."""

    dtype: str
    mean: float
    input_rounding: float | None
    mean_lowp: float | None  # the mean accumulated element by element in this type
    mean_fp32: float | None  # accumulated in fp32, stored in this type
    mean_fp32_throughout: float | None  # the fp32 row's element-by-element mean
    var_one_pass: float | None
    var_two_pass: float | None
    output_lowp: float | None
    output_kernel: float | None  # F.layer_norm
    output_fp32_ref: float | None  # fp32 from the same rounded inputs

    @property
    def kernel_close(self) -> bool:
        """F.layer_norm is within CLOSE_ERROR_FACTOR of the fp32 computation from the same inputs."""
        k, ref = self.output_kernel, self.output_fp32_ref
        return not nonfinite(k) and not nonfinite(ref) and k <= CLOSE_ERROR_FACTOR * ref


@dataclass(frozen=True)
class LayerNormFacts:
    width: int
    rows_per_mean: int
    device_type: str
    fp16_max: float | None
    fp16_overflow_from: float | None  # the smallest mean whose Σx², stored in fp16, overflows
    sum_of_squares_there: float | None
    sum_of_squares_max: float | None
    bf16_overflows: bool | None
    mean_square_max: float | None  # Σx²/width at the largest overflowing mean: what one-pass variance stores
    broken: tuple[
        tuple[str, float], ...
    ]  # (column key, mean): variance/output entries of overflowing fp16 rows that are inf/NaN
    inf_entries: tuple[tuple[str, str, float], ...]  # (column key, dtype, mean) shown as inf
    compared: tuple[LowPrecision, ...]  # each low type at the largest mean finite in both
    bf16_coarser: bool | None  # bf16 rounds its inputs more coarsely than fp16 at the largest mean


def _low(row: dict, fp32_rows: dict[float, dict]) -> LowPrecision:
    ref = fp32_rows.get(row["mean"])
    return LowPrecision(
        dtype=row["dtype"],
        mean=float(row["mean"]),
        input_rounding=row.get("input_rounding_err_std"),
        mean_lowp=row.get("mean_lowp_accumulation_err_std"),
        mean_fp32=row.get("mean_fp32_accumulation_err_std"),
        mean_fp32_throughout=ref.get("mean_lowp_accumulation_err_std") if ref else None,
        var_one_pass=row.get("var_one_pass_rel_err"),
        var_two_pass=row.get("var_two_pass_rel_err"),
        output_lowp=row.get("output_lowp_err"),
        output_kernel=row.get("output_kernel_err"),
        output_fp32_ref=row.get("output_fp32_from_rounded_input_err"),
    )


def _compared(by: dict[str, list[dict]]) -> tuple[LowPrecision, ...]:
    """Each low type at the largest mean whose running sum stays finite in both (overflow is apart)."""
    finite = [
        {r["mean"] for r in by[d] if not nonfinite(r.get("mean_lowp_accumulation_err_std"))}
        for d in LOW_PRECISIONS
        if by.get(d)
    ]
    common = set.intersection(*finite) if finite else set()
    fp32_rows = {r["mean"]: r for r in by.get("fp32", [])}
    out = []
    for d in LOW_PRECISIONS:
        rows = [r for r in by.get(d, []) if not nonfinite(r.get("mean_lowp_accumulation_err_std"))]
        if rows:
            mean = max(common) if common else max(r["mean"] for r in rows)
            out.append(_low(next(r for r in rows if r["mean"] == mean), fp32_rows))
    return tuple(out)


def layer_norm_facts(record: dict) -> LayerNormFacts:
    results = record["metrics"]["results"]
    by: dict[str, list[dict]] = {}
    for r in results:
        by.setdefault(r["dtype"], []).append(r)
    fp16, bf16 = by.get("fp16", []), by.get("bf16", [])
    over = [r for r in fp16 if r.get("sum_of_squares_fp32_accumulation_overflow")]
    top = max(r["mean"] for r in results)
    at_top = {r["dtype"]: r for r in results if r["mean"] == top}
    coarser = None
    if "bf16" in at_top and "fp16" in at_top:
        coarser = at_top["bf16"]["input_rounding_err_std"] > at_top["fp16"]["input_rounding_err_std"]
    return LayerNormFacts(
        width=int(results[0]["width"]),
        rows_per_mean=int(results[0]["rows"]),
        device_type=record["metrics"].get("device_type", "?"),
        fp16_max=fp16[0]["dtype_max"] if fp16 else None,
        fp16_overflow_from=float(over[0]["mean"]) if over else None,
        sum_of_squares_there=over[0]["sum_of_squares_exact_max"] if over else None,
        sum_of_squares_max=max((r["sum_of_squares_exact_max"] for r in fp16), default=None),
        bf16_overflows=any(r["sum_of_squares_lowp_accumulation_overflow"] for r in bf16) if bf16 else None,
        mean_square_max=max(r["sum_of_squares_exact_max"] for r in over) / over[0]["width"] if over else None,
        broken=tuple((k, float(r["mean"])) for r in over for k in VARIANCE_AND_OUTPUT if nonfinite(r.get(k))),
        inf_entries=tuple(
            (k, r["dtype"], float(r["mean"])) for r in results for k in ERROR_COLUMNS if nonfinite(r.get(k))
        ),
        compared=_compared(by),
        bf16_coarser=coarser,
    )
