"""The flash_forward and flash_backward sections: do the implementations match float64 attention
(every entry within tolerance; the closest call), does the forward save what backward needs, the
largest errors, how each is built, what was tested. Facts → table → prose."""

from __future__ import annotations

import collections

from lmperf.report.common import blocks, details, link, listing, md_table, source_line, span, summary

CSV = "tables/flash_correctness.csv"
TENSORS = {"flash_forward": ("O", "L"), "flash_backward": ("dQ", "dK", "dV")}
MAX_LISTED = 8
PRECISION_ORDER = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3}
HOW = {
    "flash_forward": "How they are built: both loop over key tiles keeping the online-softmax state (running max "
    "and sum, unnormalised O) in float32 and save L = logsumexp; with `is_causal` the Triton kernel skips tiles "
    "above the diagonal and masks only diagonal (and ragged) ones: query i sees key j iff i ≥ j.",
    "flash_backward": "How it is built: both recompute P = exp(QKᵀ/√d − L) from the saved L: D = rowsum(O ∘ dO), "
    "dV = Pᵀ dO, dS = P ∘ (dO Vᵀ − D), dQ = dS K/√d, dK = dSᵀ Q/√d; the Triton kernels in two passes without "
    "atomics (dK and dV per key tile, dQ per query tile).",
}


# one implementation's entries of one precision: errors = {tensor: its largest relative error}
ErrorRow = collections.namedtuple("ErrorRow", "implementation precision errors tolerance ok entries")


def why(records: list[dict]) -> str:
    """' (unsupported: no CUDA device)': what stopped the records that are not ok, or ''."""
    reasons = "; ".join(sorted({f"{r['status']}: {r['reason']}" for r in records if r["status"] != "ok"}))
    return f" ({reasons})" if reasons else ""


def sci(x) -> str:
    return "—" if x is None else f"{x:.1e}"


def _max(values):
    return max((v for v in values if v is not None and v == v), default=None)  # v == v: not NaN


def _failure(impl: str, e: dict) -> str:
    why = "; ".join(e.get("failed_checks") or []) or e.get("message")
    shape, why = f"({e['batch']}, {e['n_queries']}, {e['n_keys']})", f" — {why}" if why else ""
    return f"{impl} {e['precision']} d={e['head_dim']} causal={e['causal']} {shape}: {e['status']}{why}"


class CorrectnessFacts:
    """The facts of flash_forward (O, L; the saved tensors) or flash_backward (dQ, dK, dV)."""

    def __init__(self, problem: str, records: list[dict]):
        self.problem = problem
        tensors, forward = TENSORS[problem], problem == "flash_forward"
        records = [r for r in records if r["metrics"].get("entries_detail")]
        rows, failures, checked, entries = [], [], [], []  # failures: a line per entry not ok
        for r in records:
            impl, es = r["cell"]["implementation"], r["metrics"]["entries_detail"]
            for p in sorted({e["precision"] for e in es}, key=PRECISION_ORDER.get):
                mine = [e for e in es if e["precision"] == p]
                errors = {t: _max(e.get(f"{t}_rel_error") for e in mine) for t in tensors}
                tolerance = _max(e.get("tolerance_o_l" if forward else "tolerance_grad") for e in mine)
                rows.append(ErrorRow(impl, p, errors, tolerance, sum(e["status"] == "ok" for e in mine), len(mine)))
            failures += [_failure(impl, e) for e in es if e["status"] != "ok"]
            checked += [e["saved_contract_ok"] for e in es if forward and e.get("saved_contract_ok") is not None]
            entries += es
        self.rows, self.entries, self.failures = tuple(rows), len(entries), tuple(failures)
        self.saved = (sum(checked), len(checked)) if checked else None  # (kept the contract, checked); forward only
        # per record: (function, kernel mode, base seed)
        self.functions = [tuple(r["metrics"][k] for k in ("function", "kernel_mode", "seed")) for r in records]
        # precision, head_dim, causal, shape -> the values the entries took
        self.covered = {k: sorted({e[k] for e in entries}) for k in ("precision", "head_dim", "causal")}
        self.covered["precision"].sort(key=PRECISION_ORDER.get)
        self.covered["shape"] = sorted({(e["batch"], e["n_queries"], e["n_keys"]) for e in entries})

    @property
    def within_tolerance(self) -> bool:
        return self.entries > 0 and not self.failures

    @property
    def closest(self) -> tuple[ErrorRow, str, float] | None:
        """The (row, tensor, error) that comes closest to (or furthest over) its tolerance."""
        found = [(e / r.tolerance, r, t, e) for r in self.rows if r.tolerance for t, e in r.errors.items() if e]
        return max(found, key=lambda x: x[0])[1:] if found else None


def answer(facts: CorrectnessFacts) -> str:
    names = listing(f"`{f}`" for f, _, _ in facts.functions)
    what = "outputs O and L" if facts.problem == "flash_forward" else "gradients dQ, dK and dV"
    if facts.within_tolerance:
        c = facts.covered
        causal = "causal and not" if len(c["causal"]) == 2 else "causal" if c["causal"] == [True] else "not causal"
        out = [f"Yes: the {what} of {names} match float64 attention within tolerance in all {facts.entries} entries"]
        out[0] += f" ({listing(c['precision'])}, head dims {span(c['head_dim'], '', 0)}, {causal})."
    else:
        more = len(facts.failures) - MAX_LISTED
        listed = "; ".join(facts.failures[:MAX_LISTED]) + (f"; and {more} more (see the CSV)" if more > 0 else "")
        out = [f"No: {len(facts.failures)} of {facts.entries} entries of {names} are not within tolerance or did not"]
        out[0] += f" run: {listed}."
    if facts.closest:
        row, tensor, error = facts.closest
        share = error / row.tolerance
        how = f"{100 * share:.2g}% of" if share < 1 else f"{share:.3g}× over"
        out.append(
            f"The closest to its tolerance is `{row.implementation}`'s {row.precision} {tensor}: relative error "
            f"{sci(error)}, {how} the tolerance {sci(row.tolerance)}."
        )
    if facts.saved:
        kept, checked = facts.saved
        shape = "float32 tensor of L's shape (batch, n_queries)"
        out.append(
            f"Every entry saves exactly one {shape} beside Q, K, V and O, as backward needs."
            if kept == checked
            else f"{checked - kept} of {checked} entries do not save exactly one {shape}."
        )
    return " ".join(out)


def one_line(facts: CorrectnessFacts) -> str:
    if not facts.within_tolerance:
        return f"No: {len(facts.failures)} of {facts.entries} entries are not within tolerance or did not run."
    text = f"Yes: all {facts.entries} entries match float64 attention within tolerance"
    if facts.closest:
        row, tensor, error = facts.closest
        text += f"; the closest, `{row.implementation}`'s {row.precision} {tensor}, at {100 * error / row.tolerance:.2g}% of it"
    return text + "."


def error_table(facts: CorrectnessFacts) -> list[dict]:
    return [
        {"implementation": r.implementation, "precision": r.precision}
        | {f"max {t} rel. error": sci(e) for t, e in r.errors.items()}
        | {"tolerance": sci(r.tolerance), "within tolerance": f"{r.ok} of {r.entries}"}
        for r in facts.rows
    ]


def section(problem: str, records: list[dict], device: str) -> str:
    facts = CorrectnessFacts(problem, records)
    if not facts.entries:
        return blocks(f"FlashAttention-2 correctness was not measured on `{device}`{why(records)}.")
    c, ran = facts.covered, listing(f"`{f}` ({mode}, base seed {seed})" for f, mode, seed in facts.functions)
    tested = (
        f"{ran}: every entry of precisions {', '.join(c['precision'])} × head dims {', '.join(map(str, c['head_dim']))}"
        f" × causal {', '.join(map(str, c['causal']))} × shapes (batch, n_queries, n_keys) "
        f"{', '.join(map(str, c['shape']))}, on fresh N(0, 1) inputs, runs forward and backward through the "
        "`autograd.Function` (dO random) and is compared with float64 attention on the same rounded inputs: relative "
        "Frobenius error ‖x − ref‖_F / ‖ref‖_F."
    )
    return blocks(
        summary(one_line(facts)),
        answer(facts),
        md_table(error_table(facts)),
        HOW[facts.problem],
        details(f"What was tested ({facts.entries} entries)", tested),
        f"Every entry, with its seed and errors: [full table]({link(device, CSV)}).",
        source_line(records, device),
    )
