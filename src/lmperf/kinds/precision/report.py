"""Report of the precision probes: accumulation, autocast's dtypes and layer norm in low precision.

Writes the fragments ``mixed_precision_accumulation.md`` and ``benchmarking_mixed_precision_ab.md``,
the tables ``tables/precision_{accumulation,toy_model,layer_norm}.csv`` and the figure
``figures/precision_layer_norm.png``. Every number and dtype in the prose is read from the records.

    python -m lmperf.kinds.precision.report --device cpu --tables-dir … --sections-dir … --figures-dir … \
        --records results/cpu/precision/*.json
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from lmperf.report.common import (
    empty_figure,
    figure,
    figures_link,
    load,
    md_table,
    report_parser,
    save,
    source_line,
    write_text,
)


def _by_probe(records: list[dict]) -> dict[str, dict]:
    return {r["cell"]["probe"]: r for r in records}


def _num(x, digits: int = 6) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}g}"


def _err(x, digits: int = 3) -> str:
    """An error from a layer-norm record: null there means the computation overflowed."""
    return "inf (overflow)" if x is None or (isinstance(x, float) and not math.isfinite(x)) else _num(x, digits)


# -- mixed_precision_accumulation ----------------------------------------------------------------


def accumulation_table(rec: dict) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "loop": f"`{r['variant']}`",
                "result": _num(r["result"], 10),
                "error vs exact": _num(r["abs_error"], 3),
                "0.01 as stored": _num(r["stored_increment"], 10),
                "accumulator spacing at result": _num(r["accumulator_spacing_at_result"], 3),
            }
            for r in rec["metrics"]["results"]
        ]
    )


def section_accumulation(rec: dict | None) -> str:
    out = [
        "Each loop adds 0.01 to an accumulator 1000 times, written as in the course "
        "(`s += torch.tensor(0.01, dtype=…)`); exact answer 10.\n"
    ]
    if rec is None or rec["status"] != "ok":
        return "\n".join(out + ["_Not measured on this device._"]) + "\n"
    res = {r["variant"]: r for r in rec["metrics"]["results"]}
    steps = next(iter(res.values()))["steps"]
    out.append(md_table(accumulation_table(rec), as_written=True))  # its 10-digit results as the prose cites them
    s = []
    a = res.get("fp32 += fp32")
    if a:
        s.append(
            f"**fp32 += fp32** gives {_num(a['result'], 10)}: 0.01 has no finite binary expansion, so it is "
            f"stored as {_num(a['stored_increment'], 10)}, and each of the {steps} additions rounds the sum "
            f"to fp32's spacing ({_num(a['accumulator_spacing_at_result'], 3)} near {round(a['result'])}); the "
            f"rounding errors add up to {_num(a['abs_error'], 3)}."
        )
    b = res.get("fp16 += fp16")
    if b:
        ratio = b["accumulator_spacing_at_result"] / b["stored_increment"]
        s.append(
            f"**fp16 += fp16** gives {_num(b['result'], 10)} (error {_num(b['abs_error'], 3)}, "
            f"{b['abs_error'] / a['abs_error']:.0f}× fp32's): fp16 keeps 11 significant bits, so near the end "
            f"the accumulator's spacing is {_num(b['accumulator_spacing_at_result'], 3)}, {ratio:.2f}× the "
            "increment itself, and every addition rounds the new sum to that grid — the small addend loses "
            "most of its bits at each step."
            if a
            else ""
        )
    c, d = res.get("fp32 += fp16"), res.get("fp32 += fp16 cast to fp32")
    if c and d:
        same = c["result"] == d["result"]
        s.append(
            f"**fp32 += fp16** and **fp32 += fp16 cast to fp32** give {_num(c['result'], 10)} and "
            f"{_num(d['result'], 10)}"
            + (
                " — identical, because the in-place add promotes the fp16 operand "
                "to fp32 exactly as the explicit cast does"
                if same
                else ""
            )
            + f". The fp32 accumulator is accurate: the sum of {steps} copies of the increment as fp16 stores it "
            f"({_num(c['stored_increment'], 10)}) is {_num(c['exact_sum_of_stored_increment'], 10)}, and the "
            f"remaining error ({_num(c['abs_error'], 3)}) is the fp16 representation error of 0.01 times "
            f"{steps}, not accumulation."
        )
    s.append(
        "Accuracy is decided by the accumulator: low-precision inputs cost only their one-time "
        "representation error when they are summed in fp32, whereas a low-precision accumulator loses bits "
        "at every step — hence mixed precision keeps accumulations (matmul sums, reductions, optimizer "
        "state) in fp32."
    )
    out.append("\n\n".join(x for x in s if x))
    return "\n".join(out) + "\n"


# -- benchmarking_mixed_precision (a) --------------------------------------------------------------

TOY_ROWS = [
    ("parameters", "the model's parameters (inside autocast)"),
    ("fc1_output", "output of fc1"),
    ("relu_output", "output of ReLU"),
    ("ln_output", "output of the layer norm"),
    ("logits", "predicted logits (fc2)"),
    ("loss", "loss (cross-entropy)"),
    ("gradients", "gradients"),
]


def _dtype_text(value) -> str:
    if isinstance(value, dict):
        kinds = sorted(set(value.values()))
        return ", ".join(kinds)
    return value


def toy_table(rec: dict) -> pd.DataFrame:
    entries = rec["metrics"]["autocast"]
    rows = []
    for key, label in TOY_ROWS:
        row = {"tensor": label}
        for dtype, e in entries.items():
            row[f"{dtype} autocast"] = _dtype_text(e[key]) if e["status"] == "ok" else "unsupported"
        rows.append(row)
    return pd.DataFrame(rows)


def section_toy(rec: dict | None) -> str:
    out = [
        "### (a) The toy model's dtypes under autocast",
        "fp32 parameters; fc1 → ReLU → LayerNorm → fc2 run inside `torch.autocast`; each module's output "
        "dtype read by a forward hook, the loss from `cross_entropy` inside autocast, the gradients after "
        "`backward()` outside it.\n",
    ]
    if rec is None or rec["status"] != "ok":
        return "\n".join(out + ["_Not measured on this device._"]) + "\n"
    device_type = rec["metrics"]["device_type"]
    out.append(f"Measured on `{device_type}`:\n")
    out.append(md_table(toy_table(rec)))
    s = []
    for dtype, e in rec["metrics"]["autocast"].items():
        if e["status"] != "ok":
            s.append(f"{dtype} autocast is not supported on `{device_type}` here: {e['reason']}.")
            continue
        ln = e["ln_output"]
        s.append(
            f"Under {dtype} autocast the parameters stay {_dtype_text(e['parameters'])} (autocast casts copies "
            f"for each op, it never converts the parameters); fc1's output is {e['fc1_output']} "
            f"(matmuls run in {dtype}); the layer norm's output is {ln}"
            + (
                " — layer_norm is on autocast's fp32 list for this device, so it runs in fp32 whatever its input"
                if ln == "fp32"
                else f" — this device's autocast does not put layer_norm on its fp32 list, so it runs in {ln}"
            )
            + f"; the logits are {e['logits']} (fc2 is a matmul again); the loss is {e['loss']}"
            + (" (cross-entropy is on the fp32 list)" if e["loss"] == "fp32" else "")
            + f"; the gradients are {_dtype_text(e['gradients'])}, the dtype of the parameters they belong to."
        )
    out.append(" ".join(s))
    return "\n".join(out) + "\n"


# -- benchmarking_mixed_precision (b) --------------------------------------------------------------

# F.layer_norm's output error is "close to" the fp32 computation's from the same rounded inputs when it
# is at most this multiple of it: what remains is then the inputs' own rounding.
CLOSE_ERROR_FACTOR = 2.0

LN_COLUMNS = [
    ("input_rounding_err_std", "input rounding"),
    ("mean_lowp_accumulation_err_std", "mean, low-prec. accumulation"),
    ("mean_fp32_accumulation_err_std", "mean, fp32 accumulation"),
    ("sum_of_squares_lowp_accumulation_overflow", "Σx² overflows (low-prec. acc.)"),
    ("sum_of_squares_fp32_accumulation_overflow", "Σx² overflows (fp32 acc., stored low-prec.)"),
    ("var_one_pass_rel_err", "var E[x²]−E[x]² (rel.)"),
    ("var_two_pass_rel_err", "var two-pass (rel.)"),
    ("output_lowp_err", "output in low prec. (fp32-acc. mean)"),
    ("output_kernel_err", "output, F.layer_norm"),
    ("output_fp32_from_rounded_input_err", "output, fp32 from rounded input"),
]


def layer_norm_frame(rec: dict) -> pd.DataFrame:
    return pd.DataFrame(rec["metrics"]["results"])


def layer_norm_table(df: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in df.iterrows():
        row = {"dtype": r["dtype"], "mean": _num(float(r["mean"]), 4)}
        for key, label in LN_COLUMNS:
            v = r[key]
            row[label] = ("yes" if v else "no") if key.endswith("overflow") else _err(v, 2)
        rows.append(row)
    return pd.DataFrame(rows)


# The columns whose value is a variance or a normalised output: the parts that the overflow of Σx²
# would turn into inf/NaN if they were computed from a stored Σx².
LN_VARIANCE_AND_OUTPUT = (
    "var_one_pass_rel_err",
    "var_two_pass_rel_err",
    "output_lowp_err",
    "output_kernel_err",
    "output_fp32_from_rounded_input_err",
)


def _nonfinite(x) -> bool:
    """A record's error that says the computation overflowed: null, NaN or inf."""
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def inf_cells(df: pd.DataFrame) -> list[str]:
    """The layer-norm table's inf entries, as '“<column>” at <dtype>, mean <m>', in table order."""
    out = []
    for _, r in df.iterrows():
        for key, label in LN_COLUMNS:
            if not key.endswith("overflow") and _nonfinite(r[key]):
                out.append(f"“{label}” at {r['dtype']}, mean {_num(float(r['mean']), 4)}")
    return out


def overflow_consequence(over: pd.DataFrame, rows: pd.DataFrame) -> str:
    """What the rows where Σx² overflows (``over``) show for the variance and the output: inf/NaN only
    where a row says so, else why they stay finite (what the probe computes); then which entries of
    ``rows`` (the type's rows) are inf."""
    labels = dict(LN_COLUMNS)
    broken = [
        f"“{labels[k]}” at mean {_num(float(r['mean']), 4)}"
        for _, r in over.iterrows()
        for k in LN_VARIANCE_AND_OUTPUT
        if _nonfinite(r[k])
    ]
    if broken:
        text = "There the variance or output becomes inf/NaN: " + "; ".join(broken) + "."
    else:
        mean_sq = float(over.sum_of_squares_exact_max.max()) / float(over.width.iloc[0])
        text = (
            "No variance or output in these rows is inf/NaN: the one-pass variance is formed from the stored "
            f"mean of x² (Σx²/width, at most {_num(mean_sq, 3)} here), not from Σx²; the low-precision output's "
            "variance is two-pass, from the squares of centred values; `F.layer_norm` and the fp32 output keep "
            "their statistics in fp32."
        )
    cells = inf_cells(rows)
    if cells:
        text += " Where the table shows inf (overflow): " + "; ".join(cells) + "."
    return text


def section_layer_norm(rec: dict | None, toy: dict | None) -> str:
    out = [
        "### (b) Which parts of layer normalisation are sensitive to low precision",
        "Activations x = mean + N(0, 1) per feature, float64 reference. Each part of layer norm computed with "
        "the inputs in the low-precision type: the inputs' own rounding; the mean accumulated element by element "
        "in that type, or in fp32 (as PyTorch's reductions and the fused kernel do) and stored in that type; "
        "whether the sum of squares overflows; the variance one-pass (E[x²] − E[x]², statistics stored in that "
        "type) or two-pass; and the normalised output three ways: in that type from the fp32-accumulated mean "
        "stored in that type (the centred values, their squares, the two-pass variance — `mean` of the squares "
        "— and the quotient each held in that type), from `F.layer_norm` (fp32 statistics inside), and in fp32 "
        "from the same rounded inputs. Mean and output errors are max absolute errors in units of the standard "
        "deviation.\n",
    ]
    if rec is None or rec["status"] != "ok":
        return "\n".join(out + ["_Not measured on this device._"]) + "\n"
    df = layer_norm_frame(rec)
    out.append(
        f"Width {int(df.width.iloc[0])}, {int(df.rows.iloc[0])} rows per mean, on `{rec['metrics']['device_type']}`:\n"
    )
    out.append(md_table(layer_norm_table(df)))
    s = []
    width = int(df.width.iloc[0])
    fp16, bf16, fp32 = (df[df.dtype == d] for d in ("fp16", "bf16", "fp32"))
    if not fp16.empty:
        over = fp16[fp16.sum_of_squares_fp32_accumulation_overflow]
        if not over.empty:
            first = over.iloc[0]
            s.append(
                f"**Range (fp16).** The sum of squares over {width} features overflows fp16 (max "
                f"{_num(float(first.dtype_max))}) from mean {_num(float(first['mean']), 4)} on (Σx² reaches "
                f"{_num(float(first.sum_of_squares_exact_max), 3)} there and "
                f"{_num(float(over.sum_of_squares_exact_max.max()), 3)} at the largest mean) — even when accumulated in fp32, as soon as the "
                "result is stored in fp16. " + overflow_consequence(over, fp16)
            )
        else:
            s.append(
                f"The sum of squares did not overflow fp16 at these means (largest Σx² "
                f"{_num(float(fp16.sum_of_squares_exact_max.max()), 3)})."
            )
    if not bf16.empty:
        s.append(
            "bf16 keeps fp32's 8-bit exponent (max "
            f"{_num(float(bf16.dtype_max.iloc[0]), 3)}): its sum of squares "
            + (
                "never overflows here."
                if not bf16.sum_of_squares_lowp_accumulation_overflow.any()
                else "overflows too."
            )
        )
    top = df["mean"].max()
    # compare the types at the largest mean whose running sums stay finite in both (overflow is above)
    finite_means = [
        set(sub[sub.mean_lowp_accumulation_err_std.notna()]["mean"]) for sub in (fp16, bf16) if not sub.empty
    ]
    common = set.intersection(*finite_means) if finite_means else set()
    for name, sub in (("fp16", fp16), ("bf16", bf16)):
        finite = sub[sub.mean_lowp_accumulation_err_std.notna()]
        if finite.empty:
            continue
        chosen = max(common) if common else finite["mean"].max()
        r = finite[finite["mean"] == chosen].iloc[0]
        ref = fp32[fp32["mean"] == r["mean"]]
        kernel, fp32_ref = r.output_kernel_err, r.output_fp32_from_rounded_input_err
        close = (
            kernel is not None
            and fp32_ref is not None
            and not pd.isna(kernel)
            and not pd.isna(fp32_ref)
            and kernel <= CLOSE_ERROR_FACTOR * fp32_ref
        )
        s.append(
            f"**Precision ({name}, mean {_num(float(r['mean']), 4)}).** Accumulated element by element in {name}, "
            f"the mean is off by {_err(r.mean_lowp_accumulation_err_std)} standard deviations (fp32 "
            f"accumulation: {_err(r.mean_fp32_accumulation_err_std)}"
            + (f"; fp32 throughout: {_err(ref.iloc[0].mean_lowp_accumulation_err_std)}" if not ref.empty else "")
            + f"); the one-pass variance E[x²] − E[x]² is off by {_err(r.var_one_pass_rel_err)} "
            f"(relative; cancellation of two large, rounded numbers) against "
            f"{_err(r.var_two_pass_rel_err)} two-pass. Computed in {name} from the fp32-accumulated mean "
            f"(two-pass variance), the output errs by {_err(r.output_lowp_err)} σ; `F.layer_norm` (fp32 statistics) by {_err(kernel)} σ, "
            + (
                f"close to the {_err(fp32_ref)} σ of an fp32 computation from the same inputs (within "
                f"{CLOSE_ERROR_FACTOR:g}×, `CLOSE_ERROR_FACTOR`) — what remains is "
                f"the inputs' own rounding ({_err(r.input_rounding_err_std)} σ), which grows with the mean "
                "relative to the spread."
                if close
                else f"against {_err(fp32_ref)} σ for an fp32 computation from the same inputs (more than "
                f"{CLOSE_ERROR_FACTOR:g}× it, `CLOSE_ERROR_FACTOR`)."
            )
        )
    bf_top, fp_top = bf16[bf16["mean"] == top], fp16[fp16["mean"] == top]
    if not bf_top.empty and not fp_top.empty:
        worse = float(bf_top.iloc[0].input_rounding_err_std) > float(fp_top.iloc[0].input_rounding_err_std)
        s.append(
            "**So:** the sensitive parts are the reductions — the mean and, above all, the sum of squares / "
            "variance — and the subtraction of the mean from large activations. bf16 removes fp16's overflow, "
            "but with 8 significant bits against fp16's 11 it rounds "
            + ("even more coarsely" if worse else "coarsely")
            + ", so layer norm still needs special treatment under bf16: its statistics must be accumulated "
            "and held in fp32 (and its input kept in fp32 where the mean is large), which is what "
            "fused layer-norm kernels do"
            + (
                " and why autocast runs layer_norm in fp32 on this device (see (a))."
                if toy
                and toy["status"] == "ok"
                and any(e.get("ln_output") == "fp32" for e in toy["metrics"]["autocast"].values())
                else "."
            )
        )
    out.append("\n\n".join(s))
    return "\n".join(out) + "\n"


def layer_norm_figure(rec: dict | None, path: Path) -> None:
    if rec is None or rec["status"] != "ok":
        empty_figure(path, "no layer-norm probe on this device")
        return
    df = layer_norm_frame(rec)
    top = df["mean"].max()
    sub = df[df["mean"] == top]
    keys = [(k, l) for k, l in LN_COLUMNS if not k.endswith("overflow")]
    fig, axes = figure(figsize=(8, 3.6))
    ax = axes[0][0]
    dtypes = list(sub.dtype)
    width = 0.8 / len(dtypes)
    cap = 1e3
    for i, (_, r) in enumerate(sub.iterrows()):
        vals = [float("inf") if r[k] is None or pd.isna(r[k]) else float(r[k]) for k, _ in keys]
        shown = [min(v, cap) if math.isfinite(v) else cap for v in vals]
        shown = [max(v, 1e-8) for v in shown]
        xs = [j + (i - (len(dtypes) - 1) / 2) * width for j in range(len(keys))]
        bars = ax.bar(xs, shown, width=width, label=r["dtype"])
        for bar, v in zip(bars, vals):
            if not math.isfinite(v):
                bar.set_hatch("//")
                ax.text(bar.get_x() + bar.get_width() / 2, cap, "inf", ha="center", va="bottom", fontsize=6)
    ax.set_yscale("log")
    ax.set_xticks(range(len(keys)), [l for _, l in keys], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("error (σ units; variance relative)")
    ax.set_title(f"layer norm parts, activations with mean {top:g}", fontsize=9)
    ax.legend(fontsize=7)
    save(fig, path)


def main(argv=None) -> int:
    p = report_parser(__doc__.splitlines()[0])
    p.add_argument("--tables-dir", required=True)
    args = p.parse_args(argv)
    records = load(args.records)
    by = _by_probe(records)
    tables = Path(args.tables_dir)
    tables.mkdir(parents=True, exist_ok=True)
    acc, toy, ln = by.get("accumulation"), by.get("toy_model"), by.get("layer_norm")
    (accumulation_table(acc) if acc and acc["status"] == "ok" else pd.DataFrame()).to_csv(
        tables / "precision_accumulation.csv", index=False
    )
    (toy_table(toy) if toy and toy["status"] == "ok" else pd.DataFrame()).to_csv(
        tables / "precision_toy_model.csv", index=False
    )
    (layer_norm_frame(ln) if ln and ln["status"] == "ok" else pd.DataFrame()).to_csv(
        tables / "precision_layer_norm.csv", index=False
    )
    fig = figures_link(args.device)
    source = source_line(records, args.device, "precision")
    sections = Path(args.sections_dir)
    write_text(sections / "mixed_precision_accumulation.md", section_accumulation(acc) + source)
    write_text(
        sections / "benchmarking_mixed_precision_ab.md",
        section_toy(toy)
        + "\n"
        + section_layer_norm(ln, toy)
        + f"\n![layer norm errors]({fig}/precision_layer_norm.png)\n"
        + source,
    )
    layer_norm_figure(ln, Path(args.figures_dir) / "precision_layer_norm.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
