"""Report of the precision probes: mixed_precision_accumulation and benchmarking_mixed_precision
(a) autocast's dtypes in the toy model and (b) layer normalisation in low precision.

Each section is the answer first (a short template filled from ``facts``), then its table and figure.

    python -m lmperf.kinds.precision.report --device h100 --out results/h100 --grid '{}' \
        --records results/h100/precision/*.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmperf.core.record import load_record
from lmperf.kinds.precision import facts as F
from lmperf.kinds.precision import figures
from lmperf.kinds.precision import tables as T
from lmperf.kinds.precision.tables import g

SECTIONS = ["mixed_precision_accumulation", "benchmarking_mixed_precision_ab"]
ALSO_READS: tuple[str, ...] = ()
PROBES = ("accumulation", "toy_model", "layer_norm")
NOT_MEASURED = "_The precision probes were not measured on this device._\n"


def outputs(grid: dict) -> list[str]:
    """Every table and figure this report writes, relative to ``--out``."""
    return [f"tables/precision_{p}.csv" for p in PROBES] + [figures.LAYER_NORM]


def blocks(*parts: str) -> str:
    return "\n\n".join(p.strip("\n") for p in parts if p and p.strip("\n")) + "\n"


def source(records: list[dict], device: str) -> str:
    commits = sorted({r["provenance"]["git_commit"][:7] for r in records})
    at = ", measured at " + ("commits " if len(commits) > 1 else "commit ") + ", ".join(f"`{c}`" for c in commits)
    n = len(records)
    return f"_Source: {n} record{'s' if n != 1 else ''} in `results/{device}/precision/`{at if commits else ''}._"


# -- mixed_precision_accumulation -------------------------------------------------------------------


def accumulation_answer(a: F.AccumulationFacts) -> str:
    fp32, fp16 = a.get("fp32 += fp32"), a.get("fp16 += fp16")
    mixed, cast = a.get("fp32 += fp16"), a.get("fp32 += fp16 cast to fp32")
    out = []
    results = [f"**{x.variant}** gives {g(x.result, 10)} (error {g(x.abs_error)})" for x in (fp32, fp16) if x]
    if mixed and cast:
        both = (
            "both give " + g(mixed.result, 10)
            if a.cast_identical
            else f"give {g(mixed.result, 10)} and {g(cast.result, 10)}"
        )
        results.append(f"**{mixed.variant}** and **{cast.variant}** {both} (error {g(mixed.abs_error)})")
    out.append("; ".join(results) + "; the exact sum is 10.")
    if fp16:
        times = f" — {a.fp16_error_over_fp32:.0f}× fp32's error" if a.fp16_error_over_fp32 else ""
        out.append(
            f"The fp16 accumulator is what fails{times}: near 10 its spacing is {g(fp16.spacing)}, "
            f"{fp16.spacing / fp16.stored_increment:.2f}× the increment, so each of the {fp16.steps} additions "
            "rounds the sum to that grid and the small addend loses most of its bits."
        )
    if mixed:
        why = (
            f"is the fp16 rounding of 0.01 (stored as {g(mixed.stored_increment, 10)}; {mixed.steps} of them sum "
            f"to {g(mixed.exact_sum_of_stored, 10)}), not accumulation"
            if a.fp32_sum_is_representation
            else "comes from the accumulation as well as from 0.01's fp16 rounding"
        )
        same = (
            "; the in-place add promotes the fp16 operand to fp32 exactly as the explicit cast does"
            if a.cast_identical
            else ""
        )
        out.append(f"With an fp32 accumulator the error {why}{same}.")
    if fp32:
        out.append(
            f"**fp32 += fp32**'s small error is 0.01's own rounding (stored as {g(fp32.stored_increment, 10)}) plus "
            f"each sum's rounding to fp32's spacing ({g(fp32.spacing)} near 10): the accumulator decides the "
            "accuracy, which is why mixed precision keeps accumulations (matmul sums, reductions, optimizer state) "
            "in fp32."
        )
    return " ".join(out)


def section_accumulation(records: list[dict], device: str) -> str:
    rec = F.by_probe(records).get("accumulation")
    if rec is None:
        return "The accumulation probe has no record on this device.\n"
    a = F.accumulation_facts(rec)
    return blocks(
        accumulation_answer(a),
        T.md(T.accumulation_table(a)),
        "Each loop adds 0.01 to an accumulator 1000 times as the course writes it "
        "(`s += torch.tensor(0.01, dtype=…)`).",
        source(records, device),
    )


# -- benchmarking_mixed_precision (a) ---------------------------------------------------------------


def autocast_sentence(a: F.Autocast, device_type: str) -> str:
    if not a.supported:
        return f"{a.dtype} autocast is not supported on `{device_type}` here ({a.reason})."
    ln = a.of("ln_output")
    ln_why = (
        "layer_norm is on autocast's fp32 list" if a.ln_in_fp32 else f"this device's autocast runs layer_norm in {ln}"
    )
    return (
        f"Under {a.dtype} autocast the parameters stay {a.of('parameters')}, fc1's output is {a.of('fc1_output')}, "
        f"the layer norm's output {ln} ({ln_why}), the logits {a.of('logits')}, the loss {a.of('loss')}"
        + (" (cross-entropy is on the fp32 list too)" if a.loss_in_fp32 else "")
        + f" and the gradients {a.of('gradients')}."
    )


def uniform_sentence(ok: list[F.Autocast]) -> str:
    """One sentence for autocast types that differ only in the type the matmuls run in ('' where they differ more)."""
    shared = {(a.of("parameters"), a.of("ln_output"), a.of("loss"), a.of("gradients")) for a in ok}
    if (
        len(ok) < 2
        or len(shared) > 1
        or any({a.of("fc1_output"), a.of("relu_output"), a.of("logits")} != {a.dtype} for a in ok)
    ):
        return ""
    a = ok[0]
    types = " and ".join(x.dtype for x in ok)
    ln_why = (
        "layer_norm is on autocast's fp32 list"
        if a.ln_in_fp32
        else f"this device's autocast runs layer_norm in {a.of('ln_output')}"
    )
    return (
        f"Under {types} autocast alike the parameters stay {a.of('parameters')}, fc1's output, ReLU's and the logits "
        f"are in the autocast type ({types} respectively), the layer norm's output is {a.of('ln_output')} ({ln_why}), "
        f"the loss {a.of('loss')}"
        + (" (cross-entropy is on the fp32 list too)" if a.loss_in_fp32 else "")
        + f" and the gradients {a.of('gradients')}."
    )


def toy_answer(t: F.ToyFacts) -> str:
    ok = t.supported
    uniform = uniform_sentence(ok)
    out = [uniform] if uniform else [autocast_sentence(a, t.device_type) for a in ok]
    out += [autocast_sentence(a, t.device_type) for a in t.autocasts if not a.supported]
    if ok and all(a.of("parameters") == a.of("gradients") for a in ok):
        out.append(
            "Autocast runs each matmul (fc1, fc2) in the low-precision type on cast copies and never converts the "
            "parameters, so they and their gradients keep the parameters' dtype."
        )
    return " ".join(out)


def section_toy(rec: dict | None) -> str:
    head = "### (a) The toy model's dtypes under autocast"
    if rec is None:
        return blocks(head, "The toy-model probe has no record on this device.")
    t = F.toy_facts(rec)
    return blocks(
        head,
        toy_answer(t),
        f"Measured on `{t.device_type}` with fp32 parameters: each module's output dtype read by a forward hook "
        "inside `torch.autocast`, the loss from `cross_entropy` inside it, the gradients after `backward()`.",
        T.md(T.toy_table(t)),
    )


# -- benchmarking_mixed_precision (b) ---------------------------------------------------------------

LN_METHOD = (
    "Activations x = mean + N(0, 1) per feature, against a float64 reference, with the inputs rounded to the "
    "low-precision type: the mean accumulated element by element in that type, or in fp32 and stored in it; "
    "whether the sum of squares overflows; the variance one-pass (E[x²] − E[x]², statistics stored in that type) "
    "or two-pass; and the normalised output three ways — in that type from the fp32-accumulated mean stored in "
    "that type (centred values, their squares, the two-pass variance and the quotient each held in that type), "
    "from `F.layer_norm` (fp32 statistics inside), and in fp32 from the same rounded inputs. Mean and output "
    "errors are the largest absolute errors in standard deviations (σ); variance errors are relative."
)


def both(parts: list[F.LowPrecision], attr: str, unit: str = "") -> str:
    """'1.02 σ in fp16 and 8.64 σ in bf16' for one field of each compared type."""
    return " and ".join(f"{g(getattr(p, attr))}{unit} in {p.dtype}" for p in parts)


def range_sentence(f: F.LayerNormFacts) -> str:
    if f.fp16_overflow_from is None:
        return (
            ""
            if f.fp16_max is None
            else f"the sum of squares does not overflow fp16 at these means (largest Σx² {g(f.sum_of_squares_max)})."
        )
    return (
        f"in fp16 the sum of squares over {f.width} features overflows (fp16's largest value is {g(f.fp16_max, 5)}) "
        f"from mean {g(f.fp16_overflow_from)} on (Σx² {g(f.sum_of_squares_there)} there), even accumulated in fp32 "
        "once it is stored in fp16."
    )


def layer_norm_answer(f: F.LayerNormFacts, autocast_ln_fp32: bool) -> str:
    parts = list(f.compared)
    out = [
        "The sensitive parts are the reductions — the mean and, above all, the sum of squares behind the "
        "variance — and subtracting a large mean" + (": " + range_sentence(f) if range_sentence(f) else ".")
    ]
    if parts:
        out.append(
            f"At mean {g(parts[0].mean)} the mean accumulated element by element is off by {both(parts, 'mean_lowp', ' σ')} "
            f"(accumulated in fp32: {both(parts, 'mean_fp32', ' σ')}), and the one-pass variance E[x²] − E[x]² by "
            f"{both(parts, 'var_one_pass')} (relative) against {both(parts, 'var_two_pass')} two-pass."
        )
    if f.bf16_overflows is not None:
        out.append(
            "bf16 keeps fp32's 8-bit exponent, so its sum of squares "
            + ("overflows too" if f.bf16_overflows else "never overflows here")
            + ", but with 8 significant bits against fp16's 11 it rounds "
            + ("even more coarsely" if f.bf16_coarser else "coarsely")
            + ": layer norm still needs its statistics accumulated and held in fp32"
            + (", which is why autocast runs layer_norm in fp32 (see (a))." if autocast_ln_fp32 else ".")
        )
    close = [p for p in parts if p.kernel_close]
    far = [p for p in parts if not p.kernel_close]
    if close:
        out.append(
            f"So computed, `F.layer_norm` errs by {both(close, 'output_kernel', ' σ')}, within {F.CLOSE_ERROR_FACTOR:g}× "
            f"of an fp32 computation from the same rounded inputs ({both(close, 'output_fp32_ref', ' σ')}): what remains "
            "is the inputs' own rounding."
        )
    if far:
        out.append(
            f"`F.layer_norm` errs by {both(far, 'output_kernel', ' σ')}, more than {F.CLOSE_ERROR_FACTOR:g}× an fp32 "
            f"computation from the same rounded inputs ({both(far, 'output_fp32_ref', ' σ')})."
        )
    return " ".join(out)


def overflow_note(f: F.LayerNormFacts) -> str:
    """What the overflowing rows show for the variance and output (inf/NaN only where a row says so),
    then which entries the table shows as inf."""
    if f.fp16_overflow_from is None:
        text = ""
    elif f.broken:
        text = (
            "Where Σx² overflows, the variance or output becomes inf/NaN: "
            + "; ".join(f"“{T.LN_LABELS[k]}” at mean {g(m)}" for k, m in f.broken)
            + "."
        )
    else:
        text = (
            "No variance or output of the overflowing rows is inf/NaN: the one-pass variance is formed from the "
            f"stored mean of x² (at most {g(f.mean_square_max)} here), not from Σx²; the low-precision output's "
            "variance is two-pass; `F.layer_norm` and the fp32 output keep fp32 statistics."
        )
    if f.inf_entries:
        text += (
            " Where the table shows inf (overflow): "
            + "; ".join(f"“{T.LN_LABELS[k]}” at {d}, mean {g(m)}" for k, d, m in f.inf_entries)
            + "."
        )
    return text.strip()


def section_layer_norm(rec: dict | None, toy: dict | None, device: str) -> str:
    head = "### (b) Which parts of layer normalisation are sensitive to low precision"
    if rec is None:
        return blocks(head, "The layer-norm probe has no record on this device.")
    f = F.layer_norm_facts(rec)
    ln_fp32 = bool(toy) and any(a.ln_in_fp32 for a in F.toy_facts(toy).supported)
    return blocks(
        head,
        layer_norm_answer(f, ln_fp32),
        f"Width {f.width}, {f.rows_per_mean} rows per mean, on `{f.device_type}`:",
        T.md(T.layer_norm_table(rec)),
        overflow_note(f),
        f"![layer norm's error per part and dtype](../../results/{device}/{figures.LAYER_NORM})",
        f"<details><summary>How each part is computed</summary>\n\n{LN_METHOD}\n\n</details>",
    )


# -- main -------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", required=True)
    p.add_argument("--out", required=True, help="results/<device>: tables/, figures/ and sections/ go under it")
    p.add_argument("--grid", default="{}", help="the kind's config slice as JSON (not read: the records hold it)")
    p.add_argument("--records", nargs="*", default=[])
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    json.loads(args.grid)  # a malformed grid fails here, as in every kind's report
    records = [r for r in (load_record(p) for p in sorted(args.records)) if r["kind"] == "precision"]
    out = Path(args.out)
    by = F.by_probe(records)
    texts = dict.fromkeys(SECTIONS, NOT_MEASURED)
    if records:
        texts["mixed_precision_accumulation"] = section_accumulation(records, args.device)
        texts["benchmarking_mixed_precision_ab"] = blocks(
            section_toy(by.get("toy_model")),
            section_layer_norm(by.get("layer_norm"), by.get("toy_model"), args.device),
            source(records, args.device),
        )
    (out / "sections").mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (out / "sections" / f"{name}.md").write_text(text)
    (out / "tables").mkdir(parents=True, exist_ok=True)
    for probe, table in T.csv_tables(by).items():
        table.to_csv(out / "tables" / f"precision_{probe}.csv", index=False)
    figures.layer_norm(by.get("layer_norm"), out / figures.LAYER_NORM)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
