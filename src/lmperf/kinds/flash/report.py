"""Report of the flash kind: the sections flash_forward, flash_backward, flash_benchmarking and
leaderboard, the CSVs they link to (one row per correctness entry, per benchmark cell) and the
benchmark's two figures. No torch.

    python -m lmperf.kinds.flash.report --device h100 --out results/h100 --grid '{...}' --records …
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from lmperf.core import stats
from lmperf.core.record import load_record
from lmperf.kinds.flash import bench_report, correctness_report, leaderboard_report
from lmperf.kinds.flash.figures import figure
from lmperf.kinds.flash.render import PRECISION_ORDER

SECTIONS: list[str] = ["flash_forward", "flash_backward", "flash_benchmarking", "leaderboard"]
ALSO_READS: tuple[str, ...] = ()


def outputs(grid: dict) -> list[str]:
    """Every table and figure this report writes, relative to --out, for the parts the grid runs."""
    out = [correctness_report.CSV] if "correctness" in grid else []
    return out + ([bench_report.CSV, bench_report.FIGURE] if "benchmarking" in grid else [])


def correctness_frame(records: list[dict]) -> pd.DataFrame:
    """One row per correctness entry (its tiles left to the record)."""
    rows = [
        {"implementation": r["cell"]["implementation"], "kernel_mode": r["metrics"].get("kernel_mode")}
        | {k: "; ".join(v) if k == "failed_checks" else v for k, v in e.items() if k != "tiles"}
        for r in records
        for e in r["metrics"].get("entries_detail") or []
    ]
    return pd.DataFrame(rows)


def bench_frame(records: list[dict]) -> pd.DataFrame:
    """One row per benchmark cell: each pass's median (with its interval's ends), TFLOP/s, speed-up."""
    rows = []
    for r in records:
        m = r["metrics"]
        row = {k: r["cell"][k] for k in ("precision", "head_dim", "sequence_length", "implementation")}
        row |= {"status": r["status"], "reason": r["reason"], "trials": len(m.get("trials") or []) or 1}
        for p in bench_report.PASSES:
            est = stats.metric(r, f"{p}_ms_median")
            row |= dict(
                zip((f"{p}_ms", f"{p}_ms_low", f"{p}_ms_high"), (est.median, est.low, est.high) if est else [None] * 3)
            )
            row |= {f"{p}_tflops": m.get(f"{p}_tflops"), f"speedup_vs_plain_{p}": m.get(f"speedup_vs_plain_{p}")}
        rows.append(row | {"peak_allocated_mib": m.get("peak_allocated_mib")})
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows).assign(_p=lambda df: df.precision.map(PRECISION_ORDER))
    return df.sort_values(["_p", "head_dim", "sequence_length", "implementation"]).drop(columns="_p")


def sections(parts: dict[str, list[dict]], grid: dict, device: str) -> dict[str, str]:
    """The four fragments; a part with no records says so in one line."""
    out = {p: correctness_report.section(p, parts.get("correctness", []), device) for p in correctness_report.TENSORS}
    out["flash_benchmarking"] = bench_report.section(parts.get("benchmark", []), device, "benchmarking" in grid)
    return out | {"leaderboard": leaderboard_report.section(parts.get("leaderboard", []), device)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True)
    parser.add_argument("--out", required=True, type=Path, help="results/<device>: tables/, figures/, sections/")
    parser.add_argument("--grid", default="{}", help="the kind's config slice as JSON")
    parser.add_argument("--records", nargs="*", default=[])
    args = parser.parse_args(argv)
    grid = json.loads(args.grid or "{}") or {}
    parts: dict[str, list[dict]] = {}
    for path in sorted(args.records):
        record = load_record(path)
        parts.setdefault(record["cell"]["test"], []).append(record)
    for name in ("tables", "sections"):
        (args.out / name).mkdir(parents=True, exist_ok=True)
    if "correctness" in grid:
        correctness_frame(parts.get("correctness", [])).to_csv(args.out / correctness_report.CSV, index=False)
    if "benchmarking" in grid:
        frame = bench_frame(parts.get("benchmark", []))
        frame.to_csv(args.out / bench_report.CSV, index=False)
        figure(frame, args.out / bench_report.FIGURE)
    for name, text in sections(parts, grid, args.device).items():
        (args.out / "sections" / f"{name}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
