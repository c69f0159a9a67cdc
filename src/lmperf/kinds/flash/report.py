"""Report of the flash cells: flash_forward, flash_backward, flash_benchmarking and leaderboard.

Each section is facts (computed from the records by the ``*_facts`` modules) → a table → a short
template (the ``*_report`` modules). Writes the CSVs the sections link to, the benchmark's two
figures and four section fragments. Every number comes from the records; the one figure cited from
outside (the course's best leaderboard entry) is labelled as the course's and is no verdict.

    python -m lmperf.kinds.flash.report --device h100 --out results/h100 --grid '{...}' \
        --records results/h100/flash/*.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmperf.core.record import load_record
from lmperf.kinds.flash import bench_report, correctness_report, leaderboard_report
from lmperf.kinds.flash.bench_facts import bench_facts
from lmperf.kinds.flash.correctness_facts import correctness_facts
from lmperf.kinds.flash.figures import figures
from lmperf.kinds.flash.frames import bench_frame, correctness_frame, leaderboard_frame, split
from lmperf.kinds.flash.leaderboard_facts import leaderboard_facts
from lmperf.kinds.flash.render import blocks, source_line, write_csv, write_text

SECTIONS: list[str] = ["flash_forward", "flash_backward", "flash_benchmarking", "leaderboard"]
ALSO_READS: tuple[str, ...] = ()

TABLES = {
    "correctness": "tables/" + correctness_report.CSV,
    "benchmarking": "tables/" + bench_report.CSV,
    "leaderboard": "tables/" + leaderboard_report.CSV,
}
FIGURES = tuple(f"figures/{name}" for name in bench_report.FIGURES)


def outputs(grid: dict) -> list[str]:
    """Every table and figure this report writes, relative to --out, for the parts the grid runs."""
    out = [path for part, path in TABLES.items() if part in grid]
    return out + (list(FIGURES) if "benchmarking" in grid else [])


def _not_measured(device: str) -> str:
    return blocks(f"FlashAttention-2 was not measured on `{device}`.")


def write_sections(parts: dict[str, list[dict]], grid: dict, device: str, sections: Path) -> None:
    """The four fragments; a part with no records says so in one line."""
    correctness = parts["correctness"]
    for problem in ("flash_forward", "flash_backward"):
        text = (
            correctness_report.section(
                correctness_facts(problem, correctness), device, source_line(correctness, device)
            )
            if correctness
            else _not_measured(device)
        )
        write_text(sections / f"{problem}.md", text)
    bench = parts["benchmark"]
    if bench:
        text = bench_report.section(bench_facts(bench, grid.get("benchmarking")), device, source_line(bench, device))
    else:  # the figures, when declared, say there is nothing to draw
        text = blocks(_not_measured(device), bench_report.figures_markdown(device) if "benchmarking" in grid else "")
    write_text(sections / "flash_benchmarking.md", text)
    board = parts["leaderboard"]
    ok = [r for r in board if r["status"] == "ok"]
    why = "; ".join(sorted({f"{r['status']}: {r.get('reason')}" for r in board}))
    facts = leaderboard_facts(ok[0], device) if ok else None
    text = leaderboard_report.section(facts, device, source_line(board, device), f" ({why})" if why else "")
    write_text(sections / "leaderboard.md", text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", required=True)
    p.add_argument("--out", required=True, type=Path, help="results/<device>: tables/, figures/, sections/")
    p.add_argument("--grid", default="{}", help="the kind's config slice as JSON")
    p.add_argument("--records", nargs="*", default=[])
    args = p.parse_args(argv)
    grid = json.loads(args.grid or "{}") or {}
    parts = split([load_record(path) for path in sorted(args.records) if path])
    wanted = set(outputs(grid))
    frames = {
        "correctness": lambda: correctness_frame(parts["correctness"]),
        "benchmarking": lambda: bench_frame(parts["benchmark"]),
        "leaderboard": lambda: leaderboard_frame(parts["leaderboard"]),
    }
    for part, path in TABLES.items():
        if path in wanted:
            write_csv(frames[part](), args.out / path)
    if set(FIGURES) <= wanted:
        figures(bench_frame(parts["benchmark"]), *(args.out / f for f in FIGURES))
    write_sections(parts, grid, args.device, args.out / "sections")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
