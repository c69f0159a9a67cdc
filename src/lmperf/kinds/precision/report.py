"""Report of the precision probes: mixed_precision_accumulation and benchmarking_mixed_precision (a)
autocast's dtypes, (b) layer norm in low precision; each a template filled from ``facts`` and a table."""

from __future__ import annotations

from pathlib import Path

from lmperf.kinds.precision import facts as F
from lmperf.report.common import blocks, md_table, report_cli, source_line, summary, write_csv, write_text

SECTIONS = ["mixed_precision_accumulation", "benchmarking_mixed_precision_ab"]
ALSO_READS: tuple[str, ...] = ()
NOT_MEASURED = "_The precision probes were not measured on this device._\n"
TOY_TENSORS = ("parameters", "fc1_output", "relu_output", "ln_output", "logits", "loss", "gradients")
LN_LABELS = {
    "input_rounding_err_std": "input rounding (σ)",
    "mean_lowp_accumulation_err_std": "mean, low-prec. accumulation (σ)",
    "mean_fp32_accumulation_err_std": "mean, fp32 accumulation (σ)",
    "sum_of_squares_fp32_accumulation_overflow": "Σx² overflows (fp32 acc., stored low-prec.)",
    "var_one_pass_rel_err": "var E[x²]−E[x]² (rel.)",
    "var_two_pass_rel_err": "var two-pass (rel.)",
    "output_lowp_err": "output in low prec. (σ)",
    "output_kernel_err": "output, F.layer_norm (σ)",
    "output_fp32_from_rounded_input_err": "output, fp32 from rounded input (σ)",
}


def outputs(grid: dict) -> list[str]:
    """Every table this report writes, relative to ``--out``: each probe's results, one row each."""
    return ["tables/precision_accumulation.csv", "tables/precision_layer_norm.csv"]


def g(x, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits (errors and sums, not times); a missing one overflowed."""
    return "inf (overflow)" if F.nonfinite(x) else f"{x:.{digits}g}"


def section_accumulation(records: list[dict], device: str) -> str:
    a = F.AccumulationFacts(F.by_probe(records)["accumulation"])
    fp16, mixed, times = a.loops["fp16 += fp16"], a.loops["fp32 += fp16"], a.fp16_error_over_fp32
    spacing, step = fp16["accumulator_spacing_at_result"], fp16["stored_increment"]
    # an addition adds the increment rounded to the sum's spacing: from spacing·2^10 on (fp16), and half that below
    near, below = (round(step / h) * h / step for h in (spacing, spacing / 2))
    drift = (fp16["result"] - fp16["exact_sum_of_stored_increment"]) / step
    why = (
        f"is the increment's fp16 representation ({mixed['steps']} × {g(mixed['stored_increment'], 10)} = "
        f"{g(mixed['exact_sum_of_stored_increment'], 10)}), not accumulation"
        if a.fp32_sum_is_representation
        else "comes from the accumulation as well as from the increment's fp16 representation"
    )
    same = ", and the in-place add promotes the fp16 operand exactly as the explicit cast does"
    answer = (
        f"The fp16 accumulator is what fails: **fp16 += fp16** ends at {g(fp16['result'], 10)}"
        + (f", {times:.0f}× fp32's error" if times else "")
        + f", because each addition adds the increment rounded to the spacing of fp16 numbers near the sum "
        f"({g(spacing)} from {g(spacing * 2**10)} on, where it adds {near:.2f}× the increment; half that from "
        f"{g(spacing * 2**9)} to {g(spacing * 2**10)}, where it adds {below:.2f}×): over the {fp16['steps']} additions "
        f"these errors add up to {drift:+.1f} increments. With an fp32 "
        f"accumulator the error {why}{same if a.cast_identical else ''}. The accumulator decides the accuracy: "
        "mixed precision keeps accumulations (matmul sums, reductions, optimizer state) in fp32."
    )
    columns = ["loop", "result", "error vs exact", "increment as stored", "accumulator spacing at result"]
    digits = {"result": 10, "abs_error": 3, "stored_increment": 10, "accumulator_spacing_at_result": 3}
    rows = [[f"`{x['variant']}`"] + [g(x[k], n) for k, n in digits.items()] for x in a.loops.values()]
    return blocks(
        summary(
            f"fp16 += fp16 ends at {g(fp16['result'], 10)} (exact {g(fp16['exact'])}); an fp32 accumulator ends at "
            f"{g(mixed['result'], 10)}, the increment's fp16 rounding: accumulate in fp32."
        ),
        answer,
        md_table(rows, columns),
        "Each loop adds the increment as the course writes it (`s += torch.tensor(0.01, dtype=…)`); the exact sum "
        f"is {g(fp16['exact'])}.",
        source_line(records, device),
    )


def toy_answer(t: F.ToyFacts) -> str:
    out = [
        f"Under {d} autocast the parameters stay {t.of(d, 'parameters')}, fc1's output and the logits are "
        f"{t.of(d, 'logits')}, the layer norm's output {t.of(d, 'ln_output')}, the loss {t.of(d, 'loss')} and the "
        f"gradients {t.of(d, 'gradients')}."
        for d in t.autocasts
    ]
    fp32 = [f"`{op}`" for op, k in (("layer_norm", "ln_output"), ("cross_entropy", "loss")) if t.all(k, "fp32")]
    out += [f"{' and '.join(fp32)} {'are' if len(fp32) > 1 else 'is'} on autocast's fp32 list."] if fp32 else []
    if all(t.of(d, "parameters") == t.of(d, "gradients") for d in t.autocasts):
        out.append("Autocast casts a copy for each matmul and never converts the parameters, nor their gradients.")
    return " ".join(out)


def layer_norm_answer(f: F.LayerNormFacts, autocast_ln_fp32: bool) -> str:
    over, fp16 = f.overflowing, any(r["dtype"] == "fp16" for r in f.rows)
    out = ["The sensitive parts are the reductions, above all the sum of squares behind the variance"]
    if over:
        out[0] += (
            f": in fp16 it overflows ({g(over[0]['dtype_max'], 5)} is fp16's largest value) from mean "
            f"{g(over[0]['mean'])} on (Σx² {g(over[0]['sum_of_squares_exact_max'])} over {over[0]['width']} "
            "features), even accumulated in fp32 once it is stored in fp16."
        )
    else:
        out[0] += ", and subtracting a large mean" + ("; Σx² does not overflow fp16 here." if fp16 else ".")
    for r in f.compared:
        close = F.kernel_close(r)
        out.append(
            f"At mean {g(r['mean'])} in {r['dtype']} the mean accumulated element by element is off by "
            f"{g(r['mean_lowp_accumulation_err_std'])} σ (in fp32: {g(r['mean_fp32_accumulation_err_std'])} σ) and "
            f"the one-pass variance E[x²] − E[x]² by {g(r['var_one_pass_rel_err'])} (two-pass: "
            f"{g(r['var_two_pass_rel_err'])}); `F.layer_norm` errs by {g(r['output_kernel_err'])} σ, "
            f"{'within' if close else 'more than'} {F.CLOSE_ERROR_FACTOR:g}× fp32's from the same rounded inputs "
            f"({g(r['output_fp32_from_rounded_input_err'])} σ)" + (": what remains is that rounding." if close else ".")
        )
    if f.bf16_overflows is not None:
        out.append(
            f"bf16 keeps fp32's exponent, so its Σx² {'overflows too' if f.bf16_overflows else 'never overflows'}, but "
            f"it rounds {'even more ' if f.bf16_coarser else ''}coarsely (8 significant bits against fp16's 11): layer "
            "norm needs its statistics in fp32"
            + (", which is why autocast runs it in fp32 (a)." if autocast_ln_fp32 else ".")
        )
    if f.broken:  # only where a row shows it: the one-pass variance is formed from the stored mean of x², not Σx²
        out.append(
            f"Where Σx² overflows, {'; '.join(f'“{LN_LABELS[k]}” at mean {g(m)}' for k, m in f.broken)} is inf/NaN."
        )
    return " ".join(out)


def section_ab(records: list[dict], device: str) -> str:
    """benchmarking_mixed_precision (a) the toy model's dtypes under autocast and (b) which parts of layer norm
    are sensitive to low precision, led by what autocast gives the matmuls and where layer norm's Σx² overflows."""
    by = F.by_probe(records)
    t, f = F.ToyFacts(by["toy_model"]), F.LayerNormFacts(by["layer_norm"])
    lead = f"Under autocast the matmul outputs are {'/'.join(t.of(d, 'logits') for d in t.autocasts)}"
    lead += ", parameters and gradients stay fp32" if t.all("parameters", "fp32") and t.all("gradients", "fp32") else ""
    ln_rows = [
        {"dtype": r["dtype"], "mean": g(float(r["mean"]), 4)}
        | {label: ("yes" if r[k] else "no") if "overflow" in k else g(r.get(k), 2) for k, label in LN_LABELS.items()}
        for r in f.rows
    ]
    toy = [{"tensor": k.replace("_", " ")} | {f"{d} autocast": t.of(d, k) for d in t.autocasts} for k in TOY_TENSORS]
    over = "reductions lose the most precision"
    if f.overflowing:
        over = f"Σx² overflows fp16 from mean {g(f.overflowing[0]['mean'])}"
    return blocks(
        summary(f"{lead}; layer norm's {over}: its statistics need fp32."),
        "### (a) The toy model's dtypes under autocast",
        toy_answer(t),
        f"Measured on `{t.device_type}` with fp32 parameters: outputs read by forward hooks inside `torch.autocast`, "
        "the gradients after `backward()`.",
        md_table(toy),
        "### (b) Which parts of layer normalisation are sensitive to low precision",
        layer_norm_answer(f, t.all("ln_output", "fp32")),
        f"{f.rows[0]['rows']} rows of {f.rows[0]['width']} features x = mean + N(0, 1) per mean, rounded to each type, "
        f"on `{by['layer_norm']['metrics'].get('device_type', '?')}`, against float64 (`lmperf.kinds.precision.probes."
        "layer_norm_errors` says how each part is computed); mean and output errors are the largest in standard "
        "deviations (σ), variance errors relative:",
        md_table(ln_rows),
        source_line(records, device),
    )


def write(records: list[dict], grid: dict, device: str, out: Path) -> None:
    records = [r for r in records if r["kind"] == "precision"]
    texts = [section_accumulation(records, device), section_ab(records, device)] if records else [NOT_MEASURED] * 2
    for name, text in zip(SECTIONS, texts):
        write_text(out / "sections" / f"{name}.md", text)
    by = F.by_probe(records)
    for probe in ("accumulation", "layer_norm"):
        write_csv(by[probe]["metrics"]["results"] if probe in by else [], out / "tables" / f"precision_{probe}.csv")


main = report_cli(__doc__, write)

if __name__ == "__main__":
    raise SystemExit(main())
