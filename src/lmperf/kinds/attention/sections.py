"""The two answers of the attention report as short templates filled from the facts.

pytorch_attention: plain attention's times, where memory runs out and why, how what the forward
keeps grows with N and what removes it. torch_compile (a): compiled against plain. Every number
comes from ``lmperf.kinds.attention.facts`` / ``compiled``; nothing here reads a record.
"""

from __future__ import annotations

from lmperf.core.stats import SAME_MARGIN
from lmperf.core.units import MIB
from lmperf.kinds.attention.compiled import CompileFacts, PhaseComparison
from lmperf.kinds.attention.facts import KEPT_MISMATCH_SHARE, AttentionFacts, Boundary, OomAccounting
from lmperf.kinds.attention.tables import dims_text, estimate_text, human_bytes, sig


def _count(x: float) -> str:
    """3.00 -> '3', 2.5 -> '2.50'."""
    return f"{x:.0f}" if abs(x - round(x)) < 0.005 else f"{x:.2f}"


def _spread(values: list[str]) -> str:
    """'39.2 ms' or '39.2–54.6 ms' (first and last of values already ordered)."""
    return values[0] if values[0] == values[-1] else f"{values[0]}–{values[-1]}"


def _grouped(items: list[Boundary], describe, every: list[int]) -> str:
    """Head dims grouped by what `describe` says of them: '… at every head dimension (d = …)' or
    '… at d = 16, 32; … at d = 64'."""
    groups: dict[str, list[int]] = {}
    for b in items:
        groups.setdefault(describe(b), []).append(b.head_dim)
    if len(groups) == 1 and sorted(next(iter(groups.values()))) == sorted(every):
        return f"{next(iter(groups))}, at every head dimension ({dims_text(sorted(every))})"
    return "; ".join(f"{what} at {dims_text(ds)}" for what, ds in groups.items())


def _reach(b: Boundary) -> str:
    """'ran in full up to N = 16384 and ran out of memory first at N = 32768 (in the forward warm-up)'."""
    full = f"ran in full up to N = {b.largest_ok}" if b.largest_ok is not None else "no cell ran in full"
    if b.smallest_oom is not None:
        return f"{full} and ran out of memory first at N = {b.smallest_oom} (in the {b.oom_phase})"
    return f"{full} and never ran out of memory"


def _names(impls: list[str]) -> str:
    names = [f"`{i}`" for i in impls]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def boundary_sentences(f: AttentionFacts) -> str:
    """Per implementation (those that read the same grouped): how far it ran, where it ran out of
    memory, which cells have no record (not measured, never counted as out of memory)."""
    reach: dict[str, list[str]] = {}
    notes = []
    for impl, items in f.boundaries.items():
        measured = [b for b in items if b.largest_ok is not None or b.smallest_oom is not None]
        if not measured:
            notes.append(f"`{impl}` has no record yet (not measured).")
            continue
        reach.setdefault(_grouped(measured, _reach, [b.head_dim for b in items]), []).append(impl)
        missing = [(b.head_dim, b.missing) for b in measured if b.missing]
        if missing:
            cells = "; ".join(f"d = {d}, N = {', '.join(map(str, ns))}" for d, ns in missing)
            notes.append(f"`{impl}` has no record yet at {cells} (not measured, so not counted as out of memory).")
        odd = [f"d = {b.head_dim}, N = {n}: {status}" for b in items for n, status in b.other]
        if odd:
            notes.append(f"`{impl}` also has {'; '.join(odd)} (not out of memory).")
    out = [f"{_names(impls)} {what}." for what, impls in reach.items()] + notes
    if f.unsupported:
        reasons = "; ".join(f"`{i}` ({why.removeprefix(f'{i}: ')})" for i, why in f.unsupported.items())
        out.append(f"Not measured on this device: {reasons}.")
    return " ".join(out)


def _plain_reach(f: AttentionFacts) -> str:
    items = [b for b in f.boundaries.get("plain", []) if b.largest_ok is not None or b.smallest_oom is not None]
    if not items:
        return "Plain attention has no records here."
    text = "Plain attention " + _grouped(items, _reach, [b.head_dim for b in f.boundaries["plain"]])
    if f.plain_times:
        dims = [d for d, _, _ in f.plain_times]
        fwd = _spread([estimate_text(e) for _, e, _ in sorted(f.plain_times, key=lambda t: t[1].median)])
        bwd = _spread([estimate_text(e) for _, _, e in sorted(f.plain_times, key=lambda t: t[2].median)])
        where = f"d = {dims[0]}" if len(dims) == 1 else f"d = {dims[0]} to {dims[-1]}"
        text += f"; at N = {f.plain_times_at} a forward pass takes {fwd} ms and a backward {bwd} ms ({where})"
    return text + "."


def _accounting_sentence(acc: OomAccounting | None, on_cpu: bool) -> str:
    if acc is None:
        return ""
    s, peak = acc.shape, human_bytes(acc.predicted.forward_peak_bytes)
    card = human_bytes(acc.capacity_mib * MIB) if acc.capacity_mib is not None else None
    if not acc.ran_out:
        if card is None:
            return f"No cell ran out of memory on this {'CPU' if on_cpu else 'device'}."
        return (
            f"No plain cell ran out of memory here; the largest (d = {s.head_dim}, N = {s.seq_len}) needs {peak} at "
            f"the forward's peak, of the card's {card}."
        )
    text = f"At d = {s.head_dim}, N = {s.seq_len} one N×N {acc.precision} matrix is {human_bytes(s.matrix_bytes)}"
    if card is not None and acc.first_failure is None:
        text += (
            f"; the forward fits the card's {card} ({peak} at its peak) but keeps "
            f"{human_bytes(acc.predicted.before_backward_bytes)} in use for backward, whose N×N temporaries come on top"
        )
    else:
        text += f", and the forward needs {peak} at its peak (four such matrices live at once)"
        text += f" against the card's {card}" if card is not None else ""
    if acc.requested_mib is not None and acc.allocated_mib is not None:
        text += (
            f"; the allocator refused a {human_bytes(acc.requested_mib * MIB)} request in the {acc.oom_phase} with "
            f"{human_bytes(acc.allocated_mib * MIB)} already allocated"
        )
    return text + "."


def _growth_sentence(f: AttentionFacts) -> str:
    g = f.growth.get("plain")
    if g is None:
        return ""
    return (
        f"The forward keeps {_count(g.n2_matrices_kept)} N×N matrices for backward (S, E and P), so that memory "
        f"grows as N^{g.exponent:.2f}, ×{2**g.exponent:.2f} per doubling of N: "
        f"{human_bytes(g.kept_mib_at_largest * MIB)} at N = {g.largest_n} (d = {g.largest_n_head_dim})."
    )


def _removal_sentence(f: AttentionFacts) -> str:
    fg = f.fused_growth
    text = (
        "A fused kernel removes the N² term: it keeps only O and one log-sum-exp per row and recomputes P in backward"
    )
    if fg is None:
        return text + " (no fused implementation measured here)."
    plain = fg.plain_predicted_mib_at_largest
    return (
        text + f"; `{fg.implementation}` keeps {human_bytes(fg.kept_mib_at_largest * MIB)} at N = {fg.largest_n} "
        f"(d = {fg.largest_n_head_dim}, memory ∝ N^{fg.exponent:.2f})"
        + (f" where plain attention would keep {human_bytes(plain * MIB)}" if plain else "")
        + "."
    )


def attention_answer(f: AttentionFacts) -> str:
    """Two to four sentences, answer first."""
    parts = [_plain_reach(f), _accounting_sentence(f.accounting, f.on_cpu), _growth_sentence(f)]
    parts.append(_removal_sentence(f))
    return " ".join(p for p in parts if p)


def memory_note(f: AttentionFacts) -> str:
    """What the memory figures count (the cell's own tensors), and what the process held before."""
    text = (
        "Memory before backward counts this cell's own tensors: Q, K, V and dO, plus what the forward keeps "
        + ("(autograd's saved tensors and the output, through `saved_tensors_hooks`)" if f.on_cpu else "")
    ).rstrip()
    held = f.held_before_cell
    if held is not None:
        amount = f"{held[0]:,.0f} MiB" if held[0] == held[1] else f"up to {held[1]:,.0f} MiB"
        text += (
            f"; the process already held {amount} before each cell (library workspaces and buffers of earlier "
            "cells), left out"
        )
    if f.prediction_error is not None:
        text += (
            ". What the forward keeps matches the accounting's prediction (`memory_model`) within "
            f"{max(f.prediction_error, 0.001):.1%} in every cell that has one"
        )
    return text + "."


def mismatch_note(f: AttentionFacts) -> str:
    if not f.mismatches:
        return ""
    cells = "; ".join(
        f"`{impl}` d = {d}, N = {n}: allocator {sig(alloc)} MiB, autograd {sig(hooks)} MiB"
        for impl, d, n, alloc, hooks in f.mismatches
    )
    return (
        f"Where the allocator's difference and autograd's saved tensors differ by more than "
        f"{KEPT_MISMATCH_SHARE:.0%} ({cells}), a buffer live before the forward was freed during it, so the "
        "allocator undercounts; autograd's figure is what the forward keeps."
    )


def accounting_lead(acc: OomAccounting) -> str:
    s = acc.shape
    what = "the smallest cell that ran out of memory" if acc.ran_out else "the largest cell (none ran out of memory)"
    return (
        f"Plain attention at d = {s.head_dim}, N = {s.seq_len}, batch {s.batch}, {acc.precision} ({what}), "
        f"allocation by allocation: Q, K, V and dO take {human_bytes(acc.base_bytes)} before the forward."
    )


def accounting_measured(acc: OomAccounting) -> str:
    """The prediction's first failing allocation against what the allocator's error message said."""
    out = []
    fail = acc.first_failure
    if fail is not None:
        out.append(
            f"Predicted: the first allocation that cannot fit is {fail.step.tensor} = {fail.step.what} "
            f"({human_bytes(fail.step.nbytes)} with {human_bytes(fail.live_before)} already live)."
        )
    elif acc.capacity_mib is not None:
        out.append(
            "Predicted: the whole forward fits on the card; the backward's temporaries (gradients of the N×N "
            f"matrices) come on top of the {human_bytes(acc.predicted.before_backward_bytes)} in use before backward."
        )
    if acc.ran_out:
        measured = [f"Measured: out of memory in the {acc.oom_phase}"]
        if acc.requested_mib is not None:
            measured.append(f"asking for {human_bytes(acc.requested_mib * MIB)}")
        if acc.allocated_mib is not None:
            measured.append(f"with {human_bytes(acc.allocated_mib * MIB)} allocated by PyTorch")
        if acc.reserved_unallocated_mib is not None:
            measured.append(f"{human_bytes(acc.reserved_unallocated_mib * MIB)} reserved but unallocated")
        if acc.free_mib is not None:
            measured.append(f"{human_bytes(acc.free_mib * MIB)} free on the device")
        out.append(", ".join(measured) + " (the allocator's error message, in the record).")
    return " ".join(out)


def growth_sentences(f: AttentionFacts) -> str:
    out = []
    if f.left_out:
        cells = "; ".join(f"`{i}` at N = {n} for {dims_text(ds)} ({why})" for i, n, why, ds in f.left_out)
        out.append(f"Left out of the fits although the forward's kept memory was measured: {cells}.")
    g = f.growth.get("plain")
    if g is not None:
        out.append(
            "Plain attention keeps S, E and P because its softmax is written out as max, subtract, exp, sum and "
            "divide: autograd saves S for the max, E for exp and P for the division (`torch.softmax` is one node "
            "that saves only P: one matrix)."
        )
    if f.head_dim_ratio is not None:
        n, lo, hi, ratio = f.head_dim_ratio
        out.append(
            f"At N = {n}, d = {hi} keeps {ratio:.2f}× what d = {lo} keeps: of what is kept, only O scales with d."
        )
    c = f.growth.get("compiled")
    if c is not None:
        out.append(
            f"`torch.compile` keeps {_count(c.n2_matrices_kept)} N×N matrices: fewer than plain, growing the same way (N^{c.exponent:.2f})."
        )
    return " ".join(out)


REMOVAL = (
    "**What removes it.** The N×N matrices exist because unfused attention writes scores and probabilities to "
    "memory and autograd keeps them. A fused kernel (FlashAttention-2; PyTorch's `scaled_dot_product_attention` "
    "with its flash or memory-efficient backend) tiles Q, K and V, keeps a running max and sum per row on chip, "
    "writes only O and one log-sum-exp L per row, and in backward recomputes each tile of P = exp(QKᵀ/√d − L) "
    "from Q, K and L. Memory kept for backward drops from O(N²) to O(N·d), at the price of recomputing QKᵀ. "
    "`torch.compile` alone cannot do this: it fuses the softmax's elementwise steps but still materialises the "
    "scores for the two matmuls."
)


# -- torch_compile (a) ------------------------------------------------------------------------------


def _lengths(cells) -> str:
    ns = sorted({n for _, n in cells})
    return f"N = {ns[0]}" if len(ns) == 1 else f"N = {ns[0]}–{ns[-1]}"


def phase_sentence(p: PhaseComparison) -> str:
    """'Backward: compiled is faster in 20 of 20 cells (N = 256–16,384); median speed-up 2.44× (1.17×–3.79×).'"""
    parts = []
    for word, cells in (("faster", p.faster), ("slower", p.slower), ("within the noise", p.same)):
        if cells:
            parts.append(f"{word} in {len(cells)}" + ("" if word == "within the noise" else f" ({_lengths(cells)})"))
    head = f"{p.phase.capitalize()}: compiled is " + ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "")
    return (
        head + parts[-1] + f" of {len(p.cells)} cells; median speed-up {p.speedup_median:.2f}× "
        f"({p.speedup_min:.2f}×–{p.speedup_max:.2f}×)."
    )


def _fails(b: Boundary) -> str:
    return f"at N = {b.smallest_oom} ({b.oom_phase})" if b.smallest_oom else f"never, up to N = {b.largest_ok}"


def _oom_clause(c: CompileFacts) -> str:
    if not c.oom_differs:
        return "."
    if c.same_oom_length:
        p, comp = c.oom_differs[0]
        return (
            f", yet runs out of memory at the same length (N = {p.smallest_oom}), only in the {comp.oom_phase} "
            f"instead of the {p.oom_phase}."
        )
    groups: dict[str, list[int]] = {}
    for p, comp in c.oom_differs:
        groups.setdefault(f"plain runs out {_fails(p)}, compiled {_fails(comp)}", []).append(p.head_dim)
    return (
        ", and runs out of memory at a different length: "
        + "; ".join(f"at {dims_text(ds)}, {what}" for what, ds in groups.items())
        + "."
    )


def compile_answer(c: CompileFacts) -> str:
    out = [phase_sentence(p) for p in (c.backward, c.forward) if p is not None]
    if c.n2_kept_plain is not None and c.n2_kept_compiled is not None:
        out.append(
            f"Compiled attention keeps {_count(c.n2_kept_compiled)} N×N matrices for backward where plain keeps "
            f"{_count(c.n2_kept_plain)}" + _oom_clause(c)
        )
    if c.first_compile_s is not None:
        out.append(
            f"The first compiled call took {c.first_compile_s:.1f} s (tracing and compiling), outside every timed pass."
        )
    return " ".join(out)


SAME_NOTE = (
    "Each cell: forward / backward speed-up (plain time / compiled time). ≈ marks a speed-up within the noise: "
    f"its interval reaches within {SAME_MARGIN:.0%} of 1, or, for a cell measured in a single trial (no "
    f"interval), the ratio lies within {2 * SAME_MARGIN:.0%} of 1."
)
