"""The flash_forward and flash_backward sections: the answer (do the implementations match float64
attention?), the table of largest errors, how each is built, and what was tested (folded)."""

from __future__ import annotations

import pandas as pd

from lmperf.kinds.flash.correctness_facts import MAX_LISTED, CorrectnessFacts, ErrorRow, Implementation
from lmperf.kinds.flash.render import blocks, count, details, listing, md_table, sci, table_link

CSV = "flash_correctness.csv"

HOW_FORWARD = (
    "How they are built: (a) `FlashAttention2PyTorch` runs the tiled forward in PyTorch (query and key tiles of 32 "
    "rows; running max, running sum and unnormalised output in float32) and saves L = logsumexp with Q, K, V, O. "
    "(b) `FlashAttention2Triton`'s forward kernel has the launch grid (query tiles, batch) and one loop over key "
    "tiles with the online-softmax state in float32; P is cast to V's dtype before the second matmul, O back to "
    "the input dtype. (c) `is_causal` is a `tl.constexpr`: key tiles above the diagonal are skipped, tiles below "
    "it run unmasked, only diagonal (and ragged) tiles are masked; query i sees key j iff i ≥ j."
)
HOW_BACKWARD = (
    "How it is built: both recompute P = exp(QKᵀ/√d − L) from the saved log-sum-exp instead of storing it: "
    "D = rowsum(O ∘ dO), dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − D), dQ = dS K/√d, dK = dSᵀ Q/√d. "
    "`FlashAttention2PyTorch` runs these tile by tile in PyTorch; `FlashAttention2Triton` in two Triton passes "
    "without atomics (one program per key tile accumulates dK and dV over query tiles, one per query tile "
    "accumulates dQ over key tiles), after a small kernel computing D."
)


def _span(values) -> str:
    values = list(values)
    return str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}"


def _coverage(impls: tuple[Implementation, ...]) -> str:
    """'fp32, bf16 and fp16, head dims 16–256, causal and not, 3 shapes (aligned and ragged)'."""
    precisions = list(dict.fromkeys(p for i in impls for p in i.precisions))
    dims = sorted({d for i in impls for d in i.head_dims})
    causal = sorted({c for i in impls for c in i.causal})
    shapes = sorted({s for i in impls for s in i.shapes})
    ragged = any(q != k for _, q, k in shapes)
    return (
        f"{listing(precisions)}, {'head dim' if len(dims) == 1 else 'head dims'} {_span(dims)}, "
        + ("causal and not" if len(causal) == 2 else "causal" if causal == [True] else "not causal")
        + f", {count(len(shapes), 'shape')}"
        + (", aligned and ragged" if ragged else "")
    )


def _closest(facts: CorrectnessFacts) -> str:
    found = facts.closest
    if found is None:
        return ""
    row, tensor, error = found
    share = error / row.tolerance
    how = f"{100 * share:.2g}% of" if share < 1 else f"{share:.3g}× over"
    return (
        f"The closest to its tolerance is `{row.implementation}`'s {row.precision} {tensor}: relative error "
        f"{sci(error)}, {how} the tolerance {sci(row.tolerance)}."
    )


def answer(facts: CorrectnessFacts) -> str:
    """The answer: whether every entry is within tolerance, the closest call, the saved tensors."""
    ran = [i for i in facts.implementations if i.entries]
    names = listing(f"`{i.function or i.name}`" for i in ran)
    what = "outputs O and L" if facts.problem == "flash_forward" else "gradients dQ, dK and dV"
    if facts.within_tolerance:
        first = (
            f"Yes: the {what} of {names} match float64 attention within tolerance in all {facts.entries} "
            f"entries ({_coverage(facts.implementations)})."
        )
    else:
        listed = "; ".join(facts.failures[:MAX_LISTED])
        more = (
            f"; and {len(facts.failures) - MAX_LISTED} more (see the CSV)" if len(facts.failures) > MAX_LISTED else ""
        )
        first = (
            f"No: {len(facts.failures)} of {facts.entries} entries of {names} are not within tolerance "
            f"or did not run: {listed}{more}."
        )
    out = [first, _closest(facts)]
    if facts.contract_kept is True:
        out.append(
            "Every entry saves exactly one float32 tensor of L's shape (batch, n_queries) beside Q, K, V and O, "
            "as backward needs."
        )
    elif facts.contract_kept is False:
        out.append(
            f"{facts.saved_checked - facts.saved_ok} of {facts.saved_checked} entries do not save exactly one "
            "float32 tensor of L's shape (batch, n_queries)."
        )
    return " ".join(s for s in out if s)


def error_table(rows: tuple[ErrorRow, ...]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "implementation": r.implementation,
                "precision": r.precision,
                **{f"max {t} rel. error": sci(e) for t, e in r.errors},
                "tolerance": sci(r.tolerance),
                "within tolerance": f"{r.ok} of {r.entries}",
            }
            for r in rows
        ]
    )


def tested(facts: CorrectnessFacts) -> str:
    """What each record ran: one list item per implementation."""
    lines = []
    for i in facts.implementations:
        if not i.entries:
            lines.append(f"- `{i.name}`: {i.status} ({i.reason}).")
            continue
        shapes = ", ".join(f"({b}, {q}, {k})" for b, q, k in i.shapes)
        course = f" {i.course_entries} of them are the course's, checked first." if i.course_entries else ""
        tiles = f"; {i.tiles}" if i.tiles else ""
        lines.append(
            f"- `{i.function or i.name}` ({i.kernel_mode}{tiles}): {i.entries} entries — precisions "
            f"{', '.join(i.precisions)} × head dims {', '.join(map(str, i.head_dims))} × causal "
            f"{', '.join(map(str, i.causal))} × shapes (batch, n_queries, n_keys) {shapes}; fresh N(0, 1) inputs, "
            f"base seed {i.seed}.{course}"
        )
    lines.append(
        "\nEach entry runs forward and backward through the `autograd.Function` (dO random) and compares with "
        "float64 attention on the same rounded inputs: relative Frobenius error ‖x − ref‖_F / ‖ref‖_F."
    )
    return "\n".join(lines)


def section(facts: CorrectnessFacts, device: str, source: str) -> str:
    if not any(i.entries for i in facts.implementations):
        reasons = sorted({f"{i.status}: {i.reason}" for i in facts.implementations})
        why = f" ({'; '.join(reasons)})" if reasons else ""
        return blocks(f"FlashAttention-2 correctness was not measured on `{device}`{why}.")
    return blocks(
        answer(facts),
        md_table(error_table(facts.rows)),
        HOW_FORWARD if facts.problem == "flash_forward" else HOW_BACKWARD,
        details(f"What was tested ({count(facts.entries, 'entry', 'entries')})", tested(facts)),
        f"Every entry, with its seed and errors: [full table]({table_link(device, CSV)}).",
        source,
    )
