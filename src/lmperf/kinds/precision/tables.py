"""Tables of the precision report: the facts as DataFrames (markdown and CSV) and the number format
its prose shares (significant digits: these are errors and sums, not times)."""

from __future__ import annotations

import pandas as pd

from lmperf.kinds.precision import facts as F

DASH = "—"

TOY_LABELS = {
    "parameters": "the model's parameters (inside autocast)",
    "fc1_output": "output of fc1",
    "relu_output": "output of ReLU",
    "ln_output": "output of the layer norm",
    "logits": "predicted logits (fc2)",
    "loss": "loss (cross-entropy)",
    "gradients": "gradients",
}

LN_LABELS = {
    "input_rounding_err_std": "input rounding (σ)",
    "mean_lowp_accumulation_err_std": "mean, low-prec. accumulation (σ)",
    "mean_fp32_accumulation_err_std": "mean, fp32 accumulation (σ)",
    "sum_of_squares_lowp_accumulation_overflow": "Σx² overflows (low-prec. acc.)",
    "sum_of_squares_fp32_accumulation_overflow": "Σx² overflows (fp32 acc., stored low-prec.)",
    "var_one_pass_rel_err": "var E[x²]−E[x]² (rel.)",
    "var_two_pass_rel_err": "var two-pass (rel.)",
    "output_lowp_err": "output in low prec. (σ)",
    "output_kernel_err": "output, F.layer_norm (σ)",
    "output_fp32_from_rounded_input_err": "output, fp32 from rounded input (σ)",
}


def g(x, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits; a missing or non-finite error reads as an overflow."""
    if F.nonfinite(x):
        return "inf (overflow)"
    return f"{x:.{digits}g}"


def md(df: pd.DataFrame) -> str:
    """A markdown table of the cells as given (numbers keep the digits the prose cites)."""
    if df.empty:
        return "_(no records)_"
    return df.astype(str).to_markdown(index=False, disable_numparse=True)


def accumulation_table(a: F.AccumulationFacts) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "loop": f"`{x.variant}`",
                "result": g(x.result, 10),
                "error vs exact": g(x.abs_error),
                "0.01 as stored": g(x.stored_increment, 10),
                "accumulator spacing at result": g(x.spacing),
            }
            for x in a.loops
        ]
    )


def toy_table(t: F.ToyFacts) -> pd.DataFrame:
    rows = []
    for tensor, label in TOY_LABELS.items():
        row = {"tensor": label}
        for a in t.autocasts:
            row[f"{a.dtype} autocast"] = (a.of(tensor) or DASH) if a.supported else "unsupported"
        rows.append(row)
    return pd.DataFrame(rows)


def layer_norm_table(record: dict) -> pd.DataFrame:
    rows = []
    for r in record["metrics"]["results"]:
        row = {"dtype": r["dtype"], "mean": g(float(r["mean"]), 4)}
        for key, label in LN_LABELS.items():
            row[label] = ("yes" if r.get(key) else "no") if "overflow" in key else g(r.get(key), 2)
        rows.append(row)
    return pd.DataFrame(rows)


def csv_tables(by: dict[str, dict]) -> dict[str, pd.DataFrame]:
    """Each probe's CSV (``tables/precision_<probe>.csv``): empty where the probe has no ok record."""
    acc, toy, ln = (by.get(p) for p in ("accumulation", "toy_model", "layer_norm"))
    return {
        "accumulation": accumulation_table(F.accumulation_facts(acc)) if acc else pd.DataFrame(),
        "toy_model": toy_table(F.toy_facts(toy)) if toy else pd.DataFrame(),
        "layer_norm": pd.DataFrame(ln["metrics"]["results"]) if ln else pd.DataFrame(),
    }
