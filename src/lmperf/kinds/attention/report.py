"""Report of the attention cells: pytorch_attention and torch_compile (a): ``tables/attention.csv``,
``tables/attention_compile.csv``, two figures and the two sections (templates filled from ``facts``,
small pivots of lengths by head dimension). The fused implementations' times are compared in the flash
kind's report.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from lmperf.core.stats import SAME_MARGIN, Estimate
from lmperf.core.units import GIB, KIB, MIB
from lmperf.kinds.attention import facts as fx
from lmperf.kinds.attention import figures
from lmperf.kinds.attention import memory_model as memory
from lmperf.report import common
from lmperf.report.common import blocks, details, est, link, listing, md_table, num, report_cli, source_line, summary


def decimals(x: float) -> int:
    """The decimals that show x to about three significant digits: 0.167, 39.2, 1,703."""
    return max(0, 2 - math.floor(math.log10(abs(x)))) if x else 0


def sig(x: float | None) -> str:
    return "—" if pd.isna(x) else num(x, decimals(x))


def estimate_text(e: Estimate | None, missing: str = "—") -> str:
    """'39.2', '39.2 [38.9, 39.6]', with † where the estimate is unstable; ``missing`` for none."""
    return est(e, e and decimals(e.median), missing=missing)


def spread(estimates) -> str:
    """'39.1 [38.9, 39.3]–54.8 [54.7, 54.9]': the estimates of the smallest and the largest median, one if alike."""
    ends = [estimate_text(e) for e in sorted(estimates, key=lambda e: e.median)]
    return ends[0] if ends[0] == ends[-1] else f"{ends[0]}–{ends[-1]}"


def human_bytes(nbytes: float) -> str:
    """'32 GiB', '1.5 MiB', '8 KiB' (three significant digits)."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(nbytes) >= scale:
            value = nbytes / scale
            return f"{value:.3g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"
    return f"{nbytes:.0f} B"


def count(x: float) -> str:
    """3.00 -> '3', 2.5 -> '2.50'."""
    return f"{x:.0f}" if abs(x - round(x)) < 0.005 else f"{x:.2f}"


def pivot(df: pd.DataFrame, implementation: str, cell, unit: str) -> pd.DataFrame:
    """Lengths as rows, one column per head dim, each cell ``cell(row)`` ('—' where there is no record)."""
    sub = df[df.implementation == implementation]
    by_cell = {(int(r["head_dim"]), int(r["sequence_length"])): r for r in sub.to_dict("records")}
    dims = sorted({d for d, _ in by_cell})
    return pd.DataFrame(
        {"N": str(n), **{f"d = {d} ({unit})": cell(by_cell[d, n]) if (d, n) in by_cell else "—" for d in dims}}
        for n in sorted({n for _, n in by_cell})
    )


def time_cell(r: dict) -> str:
    """'forward / backward' ms per pass; a phase that ran out of memory says so."""
    oom = f"OOM ({r['oom_phase']})" if r["status"] == "oom" else "—"
    return f"{estimate_text(r['forward_est'])} / {estimate_text(r['backward_est'], oom)}" if r["forward_est"] else oom


def memory_cell(r: dict) -> str:
    """Memory before backward (MiB, the cell's own); where the forward never finished, the prediction."""
    if not pd.isna(r["before_backward_mib"]):
        return sig(r["before_backward_mib"])
    predicted = r["predicted_before_backward_mib"]
    return ("OOM" + ("" if pd.isna(predicted) else f" ({sig(predicted)} predicted)")) if r["status"] == "oom" else "—"


def growth_table(growths: dict) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "implementation": name,
            "exponent k (range over d)": common.span(g.exponents, ""),
            "N×N matrices kept": f"{g.n2_matrices_kept:.2f}" if round(g.n2_matrices_kept) else "none",  # fused: O, L
            "kept at the largest N (MiB)": f"{sig(g.kept_mib_at_largest)} (N = {g.largest_n}, d = {g.largest_n_head_dim})",
        }
        for name, g in growths.items()
    )


def speedup_cell(r: dict) -> str:
    """'2.44× [2.40, 2.47] / ≈1.01×': forward / backward, ≈ where within the noise."""
    out = []
    for phase in ("forward", "backward"):
        speed, low, high = (r[f"{phase}_speedup{x}"] for x in ("", "_low", "_high"))
        text = "—" if pd.isna(speed) else f"{speed:.2f}×" + ("" if pd.isna(low) else f" [{low:.2f}, {high:.2f}]")
        out.append((SAME_MARK if r[f"{phase}_verdict"] == "within noise" else "") + text)
    return " / ".join(out)


def compile_table(table: pd.DataFrame) -> pd.DataFrame:
    """Speed-up of compiled over plain, 'forward / backward', lengths as rows and head dims as columns."""
    compared = table.dropna(subset=["forward_speedup", "backward_speedup"], how="all")
    return pivot(compared.assign(implementation="compiled"), "compiled", speedup_cell, "speed-up")


SECTIONS = ["pytorch_attention", "torch_compile_a"]
ALSO_READS: tuple[str, ...] = ()
TABLES = ("attention", "attention_compile")
FIGURES = ("attention_time", "attention_memory")
NOT_MEASURED = "Attention was not measured on this device (no attention records).\n"
FUSED = "A fused kernel removes the N² term: it keeps only O and one log-sum-exp per row and recomputes P in backward"
REMOVAL = (
    "**What removes it.** The N×N matrices exist because unfused attention writes scores and probabilities to "
    "memory and autograd keeps them: plain attention's softmax is written out as max, subtract, exp, sum and "
    "divide, so autograd saves S for the max, E for exp and P for the division (`torch.softmax` is one node that "
    "saves only P). A fused kernel (FlashAttention-2; PyTorch's `scaled_dot_product_attention` with its flash or "
    "memory-efficient backend) tiles Q, K and V, keeps a running max and sum per row on chip, writes only O and one "
    "log-sum-exp L per row, and in backward recomputes each tile of P = exp(QKᵀ/√d − L) from Q, K and L. Memory "
    "kept for backward drops from O(N²) to O(N·d), at the price of recomputing QKᵀ. `torch.compile` alone cannot "
    "do this: it fuses the softmax's elementwise steps but still materialises the scores for the two matmuls."
)
METHOD = (
    "Random Q, K, V of shape ({batch_size}, N, d), {precision}, no head dimension; one process per implementation. "
    "Per cell: up to {warmup_passes} warm-up passes, then up to {measured_passes} forward passes timed one by one, "
    "then backward passes alike, each after a forward outside the timed region. What the forward keeps is the "
    "allocator's growth over a forward whose output is kept (on a CPU: autograd's saved tensors and the output). "
    "{beyond} phase stops after at least {min_measured_passes} passes before it would pass {max_phase_seconds} s. A "
    "time is the mean over one trial's passes; the median over trials, with a 95% interval, where the records have "
    "several."
)
SAME_MARK = "≈"
SAME_NOTE = (
    "Each cell: forward / backward speed-up (plain time / compiled time). ≈ marks a speed-up within the noise: its "
    f"interval reaches within {SAME_MARGIN:.0%} of 1, or, for a cell measured in a single trial (no interval), the "
    f"ratio lies within {2 * SAME_MARGIN:.0%} of 1."
)


def outputs(grid: dict) -> list[str]:
    """Every table and figure this report writes, relative to --out (the same whatever the grid)."""
    return [f"tables/{name}.csv" for name in TABLES] + [f"figures/{name}.png" for name in FIGURES]


def _reach(items: list[fx.Boundary], said: bool) -> str:
    """'ran in full up to N = 16384 and ran out of memory first at N = 32768 (in the forward warm-up), at every head
    dimension (d = 16, 64)', or one such clause per group of head dims that read the same; memory unsaid unless said."""
    groups: dict[str, list[int]] = {}
    for b in items:
        full = "no cell ran in full" if b.largest_ok is None else f"ran in full up to N = {b.largest_ok}"
        oom = f"ran out of memory first at N = {b.smallest_oom} (in the {b.oom_phase})" if b.smallest_oom else ""
        groups.setdefault(f"{full} and {oom or 'never ran out of memory'}" if said else full, []).append(b.head_dim)
    if len(groups) == 1:
        return f"{next(iter(groups))}, at every head dimension (d = {', '.join(str(b.head_dim) for b in items)})"
    return "; ".join(f"{what} at d = {', '.join(map(str, ds))}" for what, ds in groups.items())


def boundary_sentences(f: fx.AttentionFacts) -> str:
    """How far each implementation ran and where it ran out of memory, those that read the same together."""
    reach: dict[str, list[str]] = {}
    for impl, items in f.boundaries.items():
        reach.setdefault(_reach(items, f.ran_out), []).append(f"`{impl}`")
    out = [f"{listing(impls)} {what}." for what, impls in reach.items()]
    why = "; ".join(f"`{i}` ({reason.removeprefix(f'{i}: ')})" for i, reason in f.unsupported.items())
    return " ".join(out + ([f"Not measured on this device: {why}."] if why else []))


def attention_answer(f: fx.AttentionFacts, on_cpu: bool) -> str:
    """The summary line (where plain attention runs out of memory, its times, its growth), then answer first: how far
    plain attention ran and how fast, what it needs, how memory grows, what removes it."""
    plain, acc, g, fg = f.boundaries.get("plain", []), f.accounting, f.growth.get("plain"), f.fused_growth
    oom = min((b.smallest_oom for b in plain if b.smallest_oom), default=None)
    longest = max((b.largest_ok for b in plain if b.largest_ok), default=None)
    said = [f"Plain attention runs out of memory from N = {oom}" if oom else f"Plain attention ran up to N = {longest}"]
    out = [f"Plain attention {_reach(plain, f.ran_out)}"] if plain else []
    if f.plain_times:  # plain ran in full: it has boundaries
        ds, fwd, bwd = zip(*f.plain_times)
        said.append(f"at N = {f.plain_times_at}, d = {ds[-1]}: forward {estimate_text(fwd[-1])} ms")
        said[-1] += f", backward {estimate_text(bwd[-1])} ms"
        out[0] += f"; at N = {f.plain_times_at} a forward pass takes {spread(fwd)} ms and a backward {spread(bwd)} ms"
        out[0] += f" (d = {ds[0]}" + (f" to {ds[-1]})" if len(ds) > 1 else ")")
    out = [f"{s}." for s in out]
    if acc is not None and acc.ran_out:
        s, p = acc.shape, acc.predicted
        card = f", on a card of {human_bytes(acc.capacity_mib * MIB)}" if acc.capacity_mib else ""
        out.append(
            f"At d = {s.head_dim}, N = {s.seq_len} one N×N {acc.precision} matrix is {human_bytes(s.matrix_bytes)}: the "
            f"forward needs {human_bytes(p.forward_peak_bytes)} at its peak (four such matrices live at once) and "
            f"keeps {human_bytes(p.before_backward_bytes)} in use for backward{card}."
        )
    elif not f.ran_out:
        out.append(f"No cell ran out of memory on this {'CPU' if on_cpu else 'device'}.")
    if g is not None:
        said.append(f"the memory it keeps for backward grows as N^{g.exponent:.2f}")
        out.append(
            f"The forward keeps {count(g.n2_matrices_kept)} N×N matrices for backward (S, E and P), so that memory "
            f"grows as N^{g.exponent:.2f}, ×{2**g.exponent:.2f} per doubling of N: "
            f"{human_bytes(g.kept_mib_at_largest * MIB)} at N = {g.largest_n} (d = {g.largest_n_head_dim})."
        )
    out.append(FUSED + ("" if fg else " (no fused implementation measured here)"))
    if fg is not None:
        out[-1] += f"; `{fg.implementation}` keeps {human_bytes(fg.kept_mib_at_largest * MIB)} at N = {fg.largest_n} "
        out[-1] += f"(d = {fg.largest_n_head_dim}, memory ∝ N^{fg.exponent:.2f})"
        if kept := fg.plain_predicted_mib_at_largest:
            out[-1] += f" where plain attention would keep {human_bytes(kept * MIB)}"
    return blocks(summary("; ".join(said) + "."), " ".join(out) + ".")


def accounting_text(acc: fx.OomAccounting) -> str:
    """Plain attention's forward on a card, allocation by allocation (memory_model), then the prediction's first
    failing allocation against the allocator's words."""
    s, hb, fail = acc.shape, human_bytes, acc.first_failure
    what = "the smallest cell that ran out of memory" if acc.ran_out else "the largest cell (none ran out of memory)"
    lead = f"Plain attention at d = {s.head_dim}, N = {s.seq_len}, batch {s.batch}, {acc.precision} ({what}), "
    lead += f"allocation by allocation: Q, K, V and dO take {hb(acc.predicted.inputs_bytes)} before the forward."
    rows = []
    for p in memory.timeline(memory.plain_forward_steps(s), acc.predicted.inputs_bytes):
        saved = "yes" if p.step.saved else ("output" if p.step.tensor == "O" else "no")
        row = {"step": p.step.tensor, "what": p.step.what, "allocates": hb(p.step.nbytes)}
        row.update({"live once allocated": hb(p.live_peak), "kept for backward": saved})
        row["freed then"] = ", ".join(p.step.frees)
        row["fits the card"] = "yes" if p.live_peak <= acc.capacity_mib * MIB else "**no**"
        rows.append(row)
    said = "Predicted: the whole forward fits on the card; the backward's temporaries (gradients of the N×N matrices) "
    said += f"come on top of the {hb(acc.predicted.before_backward_bytes)} in use before backward."
    if fail is not None:
        said = f"Predicted: the first allocation that cannot fit is {fail.step.tensor} = {fail.step.what} "
        said += f"({hb(fail.step.nbytes)} with {hb(fail.live_before)} already live)."
    if acc.ran_out:
        numbers = {"asking for {}": acc.requested_mib, "with {} allocated by PyTorch": acc.allocated_mib}
        numbers |= {"{} reserved but unallocated": acc.reserved_unallocated_mib, "{} free on the device": acc.free_mib}
        measured = [f"out of memory in the {acc.oom_phase}"]
        measured += [w.format(hb(v * MIB)) for w, v in numbers.items() if v is not None]
        said += f" Measured: {', '.join(measured)} (the allocator's error message, in the record)."
    return blocks(lead, md_table(rows), said)


def compile_answer(c: fx.CompileFacts) -> str:
    """The summary line, then: 'Backward: compiled is faster in 20 (N = 256–16384) of 20 cells; median speed-up
    2.44× (1.17×–3.79×). …'"""
    out, said = [], []
    for phase in sorted(c.verdicts):  # backward first
        parts, by, (median, low, high) = [], c.verdicts[phase], c.speedups[phase]
        for verdict, word in common.VERDICT_WORDS.items():
            if ns := sorted({n for _, n in by.get(verdict, ())}):
                where = "" if verdict == "within noise" else f" (N = {ns[0]}" + (f"–{ns[-1]})" if len(ns) > 1 else ")")
                parts.append(f"{word} in {len(by[verdict])}{where}")
        cells = sum(map(len, by.values()))
        words = f"median speed-up {median:.2f}×" if median >= 1 else f"median slowdown {1 / median:.2f}×"
        said.append(f"{phase} faster in {len(by.get('faster', ()))} of {cells} cells ({words})")
        out.append(
            f"{phase.capitalize()}: compiled is {listing(parts)} of {cells} cells; "
            f"{words} ({'' if median >= 1 else 'plain / compiled time '}{low:.2f}×–{high:.2f}×)."
        )
    if c.n2_kept_compiled is not None:
        kept, plain = count(c.n2_kept_compiled), count(c.n2_kept_plain)
        out.append(f"Compiled attention keeps {kept} N×N matrices for backward where plain keeps {plain}.")
    if c.first_compile_s is not None:
        out.append(
            f"The first compiled call took {c.first_compile_s:.1f} s (tracing and compiling), outside every timed pass."
        )
    return blocks(summary(f"torch.compile of plain attention: {'; '.join(said)}."), " ".join(out))


def section_pytorch_attention(df, records: list[dict], f: fx.AttentionFacts, device: str) -> str:
    figs, on_cpu, settings = link(device, "figures"), device == "cpu", records[0]["provenance"]["settings"]
    beyond = f"Beyond N = {n} (the memory boundary's lengths) a" if (n := settings["full_passes_up_to"]) else "A"
    note = "Memory before backward counts this cell's own tensors: Q, K, V and dO, plus what the forward keeps"
    note += " (autograd's saved tensors and the output)" if on_cpu else ""
    if f.prediction_error is not None:
        note += f", within {max(f.prediction_error, 0.001):.1%} of the accounting's prediction (`memory_model`) in every cell that has one"
    return blocks(
        attention_answer(f, on_cpu),
        "Plain attention, forward / backward time per pass:\n\n" + md_table(pivot(df, "plain", time_cell, "ms")),
        "Memory before backward:\n\n" + md_table(pivot(df, "plain", memory_cell, "MiB")),
        note + "; not what the process held before the cell.",
        f"![{figures.TIME_TITLE}]({figs}/attention_time.png)",
        f"![{figures.MEMORY_TITLE}]({figs}/attention_memory.png)",
        "### Where memory runs out",
        boundary_sentences(f),
        accounting_text(f.accounting) if f.accounting and f.accounting.capacity_mib else "",
        "### How the memory kept for backward grows, and what removes it",
        md_table(growth_table(f.growth)) if f.growth else "_Too few lengths ran to fit an exponent._",
        f"k in kept ∝ N^k: a least-squares fit in log-log over each head dimension's {fx.FIT_POINTS} largest lengths "
        "that ran in full; N×N matrices kept = (kept − O) / (B·N²·bytes).",
        REMOVAL,
        details("Method", METHOD.format(**settings, beyond=beyond)),
        f"[Every cell, every column (CSV)]({link(device, 'tables/attention.csv')}).",
        source_line(records, device),
    )


def section_torch_compile(df, records: list[dict], device: str) -> str:
    c = fx.CompileFacts(df)
    if c.pairs == 0:
        return "No cell has both a plain and a compiled record on this device.\n"
    settings = next(r for r in records if r["cell"]["implementation"] == "compiled")["provenance"]["settings"]
    dynamic = "dynamic shapes, one compilation per process" if settings["compile_dynamic"] else "a compilation per cell"
    return blocks(
        compile_answer(c),
        md_table(compile_table(fx.compile_frame(df))),
        SAME_NOTE,
        f"`compiled` is `torch.compile(plain_attention)` ({dynamic}), timed exactly like plain (pytorch_attention's method).",
        f"[Every pair (CSV)]({link(device, 'tables/attention_compile.csv')}).",
        source_line(records, device),
    )


def write(records: list[dict], grid: dict, device: str, out: Path) -> None:
    records = [r for r in records if r["kind"] == "attention"]
    df = fx.frame(records)
    f = fx.AttentionFacts(df)
    common.write_csv(df.drop(columns=["forward_est", "backward_est"]), out / "tables" / "attention.csv")
    common.write_csv(fx.compile_frame(df), out / "tables" / "attention_compile.csv")
    for name, draw in zip(FIGURES, (figures.time_figure, figures.memory_figure)):
        draw(df, list(f.implementations), out / "figures" / f"{name}.png")
    texts = [NOT_MEASURED] * 2
    if records:
        texts = [section_pytorch_attention(df, records, f, device), section_torch_compile(df, records, device)]
    for name, text in zip(SECTIONS, texts):
        common.write_text(out / "sections" / f"{name}.md", text)


main = report_cli(__doc__, write)

if __name__ == "__main__":
    raise SystemExit(main())
