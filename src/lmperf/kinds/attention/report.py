"""Report of the attention cells: pytorch_attention and torch_compile (a).

    python -m lmperf.kinds.attention.report --device h100 --out results/h100 --grid '{}' \
        --records results/h100/attention/*.json

Writes ``tables/attention.csv`` (every cell) and ``tables/attention_compile.csv`` (compiled against
plain), three figures and the two section fragments. Facts come from ``facts`` and ``compiled``,
tables from ``tables``, figures from ``figures``, sentences from ``sections``; this module only
assembles them. Product labels of fp32 rows (what the matmuls multiplied in) are the flash kind's
(``lmperf.kinds.flash.products``, pure), the one home of that fact.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from lmperf.core.record import load_record
from lmperf.core.stats import UNSTABLE_WIDTH
from lmperf.kinds.attention import figures, sections
from lmperf.kinds.attention import tables as tab
from lmperf.kinds.attention.compiled import compile_facts, compile_frame
from lmperf.kinds.attention.facts import FIT_POINTS, AttentionFacts, attention_facts, frame
from lmperf.kinds.flash.products import (
    PRODUCT_SENTENCES,
    PRODUCT_WORDS,
    SDPA_FP32_WHY,
    record_products,
    sdpa_backend,
    sdpa_products,
)

KIND = "attention"
SECTIONS = ["pytorch_attention", "torch_compile_a"]
ALSO_READS: tuple[str, ...] = ()
TABLES = ("attention", "attention_compile")
FIGURES = ("time", "memory", "compile")


def outputs(grid: dict) -> list[str]:
    """Every table and figure this report writes, relative to --out (the same whatever the grid)."""
    return [f"tables/{name}.csv" for name in TABLES] + [f"figures/{KIND}_{name}.png" for name in FIGURES]


def _links(device: str) -> tuple[str, str]:
    """Figures and tables as linked from report/<device>/answers.md."""
    return f"../../results/{device}/figures", f"../../results/{device}/tables"


def _blocks(*parts: str) -> str:
    """Markdown blocks separated by one blank line, ending in one newline; empty parts dropped."""
    return "\n\n".join(p.strip("\n") for p in parts if p and p.strip("\n")) + "\n"


def source_line(records: list[dict], device: str) -> str:
    names = sorted({r["provenance"]["device_name"] for r in records})
    commits = sorted({str(r["provenance"]["git_commit"])[:7] for r in records})
    count = f"{len(records)} record" + ("s" if len(records) != 1 else "")
    where = f"commit{'s' if len(commits) != 1 else ''} " + ", ".join(f"`{c}`" for c in commits)
    return f"_Source: {count} in `results/{device}/{KIND}/`, {', '.join(names)}, measured at {where}._"


def _impl_records(records: list[dict], implementation: str) -> list[dict]:
    return [r for r in records if r["cell"]["implementation"] == implementation]


def products_note(records: list[dict], implementation: str) -> tuple[str, str] | None:
    """(heading suffix, sentence): what an implementation's fp32 rows multiplied in, where that is not
    PyTorch's matmul settings (our Triton kernels, SDPA's fused kernels); None otherwise."""
    sdpa = sdpa_products(records, implementation)
    if sdpa:
        backend = sdpa_backend(records, implementation)
        return (
            f"fp32 inputs, {PRODUCT_WORDS.get(sdpa, sdpa + ' products')}",
            f"`{implementation}` ran on SDPA's {backend} backend; {SDPA_FP32_WHY}, so these rows are "
            "fp32-accurate, not IEEE float32 arithmetic.",
        )
    if not implementation.startswith("flash"):
        return None
    found = [p for p in map(record_products, _impl_records(records, implementation)) if p]
    labels = sorted({label for label, _ in found})
    if not labels:
        return None
    sources = "; ".join(sorted({src for _, src in found}))
    if len(labels) == 1:
        what = PRODUCT_SENTENCES.get(labels[0], f"{labels[0]} products")
        return (
            f"fp32 inputs, {PRODUCT_WORDS.get(labels[0], labels[0] + ' products')}",
            f"Our Triton kernels' `tl.dot` multiplied these fp32 inputs with {what} ({sources}).",
        )
    counts = ", ".join(f"{label} in {sum(1 for x, _ in found if x == label)}" for label in labels)
    return (
        f"fp32 inputs, {' or '.join(labels)} products by record",
        f"The records differ in what our Triton kernels' `tl.dot` multiplied fp32 inputs in: {counts} records.",
    )


def _implementation_fold(df: pd.DataFrame, records: list[dict], impls: list[str]) -> str:
    parts = []
    for impl in impls:
        note = products_note(records, impl)
        parts.append(f"#### `{impl}`" + (f" ({note[0]})" if note else ""))
        parts.append(note[1] if note else "")
        parts.append("Forward / backward time per pass:\n\n" + tab.md_table(tab.time_table(df, impl)))
        parts.append("Memory before backward:\n\n" + tab.md_table(tab.memory_table(df, impl)))
    if not parts:
        return ""
    names = ", ".join(f"`{i}`" for i in impls)
    return _blocks(f"<details><summary>Other implementations: {names}</summary>", *parts, "</details>")


def method_text(records: list[dict], f: AttentionFacts) -> str:
    s = records[0]["provenance"]["settings"]
    memory = (
        "there is no CUDA allocator on a CPU, so what the forward keeps is autograd's saved tensors plus the "
        "output (`saved_tensors_hooks`)"
        if f.on_cpu
        else "what the forward keeps is `torch.cuda.memory_allocated()` after a forward whose output is kept, minus "
        "what was allocated just before it"
    )
    capped = s.get("full_passes_up_to") and s.get("max_phase_seconds") is not None
    return _blocks(
        "<details><summary>Method</summary>",
        f"Random Q, K, V of shape ({s['batch_size']}, N, d), {s['precision']}, no head dimension; one process per "
        f"implementation. Per cell: up to {s['warmup_passes']} warm-up passes, then up to {s['measured_passes']} "
        "forward passes timed one by one (`timeit.default_timer`"
        + ("" if f.on_cpu else ", synchronize before and after each")
        + "), then backward "
        f"passes timed the same way, each re-running its forward outside the timed region. {memory[0].upper()}"
        f"{memory[1:]}. Times are per pass: the mean over the passes of one trial, with a 95% interval over trials "
        "where the records have several."
        + (
            ""
            if f.on_cpu
            else " An out-of-memory error inside backward can leave memory allocated that no cleanup frees "
            "(pytorch/pytorch#82218), so after such a cell the process restarts for the cells left."
        )
        + (
            f" Beyond N = {s['full_passes_up_to']} (only the memory boundary is sought there) a phase stops "
            f"after at least {s.get('min_measured_passes')} passes before it would exceed {s['max_phase_seconds']} s."
            if capped
            else ""
        ),
        "</details>",
    )


def section_pytorch_attention(df, records, f: AttentionFacts, device: str) -> str:
    figs, tabs = _links(device)
    unstable = df.forward_unstable.any() or df.backward_unstable.any()
    plain = f.boundaries.get("plain") is not None and not df[df.implementation == "plain"].empty
    others = [i for i in f.implementations if i not in ("plain", "compiled") and i not in f.unsupported]
    acc = f.accounting
    show_steps = acc is not None and acc.capacity_mib is not None
    return _blocks(
        sections.attention_answer(f),
        ("Plain attention, forward / backward time per pass:\n\n" + tab.md_table(tab.time_table(df, "plain")))
        if plain
        else "",
        f"{tab.UNSTABLE_MARK} unstable: its interval is wider than {UNSTABLE_WIDTH:.0%} of its median."
        if unstable
        else "",
        ("Memory before backward:\n\n" + tab.md_table(tab.memory_table(df, "plain"))) if plain else "",
        sections.memory_note(f),
        sections.mismatch_note(f),
        f"![{figures.TIME_TITLE}]({figs}/attention_time.png)",
        f"![{figures.MEMORY_TITLE}]({figs}/attention_memory.png)",
        "### Where memory runs out",
        sections.boundary_sentences(f),
        sections.accounting_lead(acc) if show_steps else "",
        tab.md_table(tab.accounting_table(acc)) if show_steps else "",
        sections.accounting_measured(acc) if show_steps else "",
        "### How the memory kept for backward grows, and what removes it",
        tab.md_table(tab.growth_table(f.growth)) if f.growth else "_Too few lengths ran to fit an exponent._",
        f"k in kept ∝ N^k: a least-squares fit in log-log over each head dimension's {FIT_POINTS} largest lengths that ran "
        "in full; N×N matrices kept = (kept − O) / (B·N²·bytes).",
        sections.growth_sentences(f),
        sections.REMOVAL,
        _implementation_fold(df, records, others),
        method_text(records, f),
        f"[Every cell, every column (CSV)]({tabs}/attention.csv). " + source_line(records, device),
    )


def section_torch_compile(df, records, grid: dict, device: str) -> str:
    figs, tabs = _links(device)
    c = compile_facts(df, records, grid)
    if c.pairs == 0:
        return _blocks(
            "No cell has both a plain and a compiled record on this device.",
            f"![{figures.COMPILE_TITLE}]({figs}/attention_compile.png)",
        )
    settings = (_impl_records(records, "compiled") or records)[0]["provenance"]["settings"]
    dynamic = (
        "dynamic shapes, one compilation per process" if settings.get("compile_dynamic") else "a compilation per cell"
    )
    return _blocks(
        sections.compile_answer(c),
        tab.md_table(tab.compile_table(compile_frame(df))),
        sections.SAME_NOTE,
        f"![{figures.COMPILE_TITLE}]({figs}/attention_compile.png)",
        f"`compiled` is `torch.compile(plain_attention)` ({dynamic}), timed exactly like plain "
        "(pytorch_attention's method).",
        f"[Every pair (CSV)]({tabs}/attention_compile.csv). " + source_line(records, device),
    )


NOT_MEASURED = "Attention was not measured on this device (no attention records).\n"


def write(out: Path, device: str, records: list[dict], grid: dict) -> None:
    df = frame(records)
    for name, table in (("attention", tab.csv_frame(df)), ("attention_compile", compile_frame(df))):
        (out / "tables").mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "tables" / f"{name}.csv", index=False)
    f = attention_facts(df, records, grid, device)
    impls = list(f.implementations)
    figures.time_figure(df, impls, out / "figures" / f"{KIND}_time.png")
    figures.memory_figure(df, impls, out / "figures" / f"{KIND}_memory.png")
    figures.compile_figure(compile_frame(df), out / "figures" / f"{KIND}_compile.png")
    texts = {
        "pytorch_attention": section_pytorch_attention(df, records, f, device) if records else NOT_MEASURED,
        "torch_compile_a": section_torch_compile(df, records, grid, device) if records else NOT_MEASURED,
    }
    (out / "sections").mkdir(parents=True, exist_ok=True)
    for name in SECTIONS:
        (out / "sections" / f"{name}.md").write_text(texts[name])


def _grid(text: str) -> dict:
    """The grid as JSON text, or the path of a JSON file."""
    text = text.strip()
    return json.loads(text) if text.startswith("{") else json.loads(Path(text).read_text())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", required=True)
    p.add_argument("--out", required=True, help="results/<device>: tables/, figures/ and sections/ go under it")
    p.add_argument("--grid", default="{}", help="the kind's config slice as JSON (may be {})")
    p.add_argument("--records", nargs="*", default=[])
    args = p.parse_args(argv)
    records = [r for r in (load_record(path) for path in sorted(args.records)) if r["kind"] == KIND]
    write(Path(args.out), args.device, records, _grid(args.grid))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
