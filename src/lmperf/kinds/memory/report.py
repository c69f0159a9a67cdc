"""Report of the memory cells: the memory_profiling answers (a)-(e), their tables and figures.

    python -m lmperf.kinds.memory.report --device h100 --out results/h100 \
        --grid '{"models": ["2.7B"], "context_lengths": [128, 256, 512], "precisions": ["fp32", "bf16"], …}' \
        --records results/h100/memory/*.json

Writes ``outputs(grid)`` under ``--out`` (``tables/memory.csv``, one row per cell;
``tables/memory_top_allocations.csv``; ``figures/memory_peaks.png``; one
``figures/memory_timeline_<model>_ctx<ctx>_<precision>_<mode>.png`` per cell of the grid) and
``sections/memory_profiling.md``. Everything is read from the records (the snapshot pickles are not
needed): facts (``facts``, ``allocations``) → tables (``tables``) → templates (``text``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmperf.core.record import load_record
from lmperf.core.sizes import config_from_name, parameter_count
from lmperf.core.units import MIB
from lmperf.kinds.memory import facts as F
from lmperf.kinds.memory import figures, tables, text
from lmperf.kinds.memory.allocations import residual_facts, top_facts

SECTIONS = ["memory_profiling"]
ALSO_READS: tuple[str, ...] = ()
TABLES = ("memory", "memory_top_allocations")
PEAKS_FIGURE = "memory_peaks.png"
PEAKS_TITLE = "Memory, fp32 against bf16"


def grid_cells(grid: dict) -> list[dict]:
    """The cells of the grid, one per (model, context, precision, mode)."""
    return [
        {"model": m, "context_length": c, "precision": p, "mode": mode}
        for m in grid.get("models", [])
        for c in grid.get("context_lengths", [])
        for p in grid.get("precisions", [])
        for mode in F.MODES
    ]


def outputs(grid: dict) -> list[str]:
    """Every table and figure this report writes for ``grid``, relative to ``--out`` (none for an empty grid)."""
    if not grid:
        return []
    return [
        *(f"tables/{name}.csv" for name in TABLES),
        f"figures/{PEAKS_FIGURE}",
        *(f"figures/{figures.timeline_name(c)}" for c in grid_cells(grid)),
    ]


def subject(records: list[dict], grid: dict) -> list[dict]:
    """The records of the model the answers are about: the grid's reference model where it was
    measured, else the model with the most records (one model per answer table)."""
    models = [r["cell"]["model"] for r in records]
    if not models:
        return []
    model = grid.get("reference_model") if grid.get("reference_model") in models else max(set(models), key=models.count)
    return [r for r in records if r["cell"]["model"] == model]


def _cell_title(cell: dict) -> str:
    what = "full training step" if cell["mode"] == "training" else "forward only"
    return f"{cell['model']}, context {cell['context_length']}, {cell['precision']}: {what}"


def write_outputs(records: list[dict], grid: dict, out: Path, missing: str) -> None:
    """Write exactly ``outputs(grid)``: tables, the peaks figure and one timeline per grid cell
    (a note in place of a plot where its record holds nothing to draw)."""
    wanted = set(outputs(grid))
    if "tables/memory.csv" in wanted:
        for name, frame in (
            ("memory", tables.cells_frame(records)),
            ("memory_top_allocations", tables.top_frame(records)),
        ):
            path = out / "tables" / f"{name}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            frame.to_csv(path, index=False)
    if f"figures/{PEAKS_FIGURE}" in wanted:
        figures.peaks_figure(subject(records, grid), out / "figures" / PEAKS_FIGURE, PEAKS_TITLE, missing)
    by_cell = {figures.timeline_name(r["cell"]): r for r in records}
    for cell in grid_cells(grid):
        name = figures.timeline_name(cell)
        figures.timeline_figure(by_cell.get(name), out / "figures" / name, _cell_title(cell), missing)


def not_measured_line(records: list[dict], device: str) -> str:
    """One line saying what is not measured here (no records, or none with metrics)."""
    if not records:
        return f"Memory was not measured on this device (`{device}`): there are no memory records."
    if device == "cpu":
        return (
            f"Not measured on a CPU: PyTorch records allocator history only on a CUDA device. The "
            f"{text.plural(len(records), 'cell')} ran their forward-only and training steps on the CPU without it, "
            "which shows the pipeline runs; only (d), which needs no history, is answered."
        )
    return f"Not measured on this device (`{device}`): {records[0].get('reason')}. Only (d), which needs no history, is answered."


def placeholder_fold(device: str, names: list[str]) -> str:
    """The figures the workflow expects that hold only a note here, referenced once."""
    shown = " ".join(text.image(device, n.removesuffix(".png"), n) for n in names)
    return text.fold("Figures (each holds only a note on this device)", shown) if names else ""


def source_line(records: list[dict], device: str) -> str:
    names = sorted({r["provenance"]["device_name"] for r in records})
    commits = sorted({r["provenance"]["git_commit"][:7] for r in records})
    return (
        f"_Source: {text.plural(len(records), 'record')} in `results/{device}/memory/`, {', '.join(names)}, "
        f"{'commit' if len(commits) == 1 else 'commits'} {', '.join(f'`{c}`' for c in commits)}._"
    )


def _residual(records: list[dict], grid: dict, device: str) -> str:
    model = grid.get("reference_model")
    if not model or not grid.get("batch_size") or not grid.get("reference_context_length"):
        return ""
    return text.section_d(residual_facts(records, model, grid["batch_size"], grid["reference_context_length"]), device)


def section(records: list[dict], grid: dict, device: str) -> str:
    """The memory_profiling fragment."""
    names = [Path(p).name for p in outputs(grid) if p.startswith("figures/")]
    if not F.measured(records):
        return text.blocks(
            not_measured_line(records, device),
            _residual(records, grid, device) if records else "",
            placeholder_fold(device, names),
        )
    mine = subject(records, grid)
    cells = grid_cells(grid)
    parameters = None
    if mine:
        c = mine[0]["cell"]
        parameters = 4 * parameter_count(config_from_name(c["model"], vocab_size=c.get("vocab_size", 10_000))) / MIB
    tops = [t for t in (top_facts(mine, mode) for mode in ("training", "inference")) if t is not None]
    return text.blocks(
        text.section_a(mine, device, cells, parameters),
        text.section_b(mine, device, grid.get("batch_size")),
        text.section_c(mine, device, f"figures/{PEAKS_FIGURE}" in outputs(grid)),
        _residual(records, grid, device),
        text.section_e(tops, device),
        source_line(records, device),
    )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", required=True)
    p.add_argument("--out", required=True, type=Path, help="results/<device>: tables/, figures/, sections/ go here")
    p.add_argument("--grid", default="{}", help="the kind's config slice as JSON (may be {})")
    p.add_argument("--records", nargs="*", default=[])
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    grid = json.loads(args.grid) or {}
    records = F.memory_records([load_record(p) for p in sorted(args.records)])
    missing = "not measured on a CPU (no allocator history)" if args.device == "cpu" else "no record to draw"
    write_outputs(records, grid, args.out, missing)
    path = args.out / "sections" / f"{SECTIONS[0]}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(section(records, grid, args.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
