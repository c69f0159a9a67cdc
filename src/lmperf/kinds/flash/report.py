"""Report of the flash kind: flash_forward, flash_backward, flash_benchmarking and leaderboard, their CSVs
and the benchmark's figures. No torch."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lmperf.core import stats
from lmperf.kinds.flash import bench_report, correctness_report, leaderboard_report
from lmperf.kinds.flash.figures import figure
from lmperf.kinds.flash.render import PRECISION_ORDER
from lmperf.report.common import report_main, write_csv, write_text

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
            ends = (est.median, est.low, est.high) if (est := stats.metric(r, f"{p}_ms_median")) else (None,) * 3
            row |= dict(zip((f"{p}_ms", f"{p}_ms_low", f"{p}_ms_high"), ends))
            row |= {f"{p}_tflops": m.get(f"{p}_tflops"), f"speedup_vs_plain_{p}": m.get(f"speedup_vs_plain_{p}")}
        rows.append(row | {"peak_allocated_mib": m.get("peak_allocated_mib")})
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame(rows).assign(_p=lambda df: df.precision.map(PRECISION_ORDER))
    return df.sort_values(["_p", "head_dim", "sequence_length", "implementation"]).drop(columns="_p")


def write(records: list[dict], grid: dict, device: str, out: Path) -> None:
    parts = {t: [r for r in records if r["cell"]["test"] == t] for t in ("correctness", "benchmark", "leaderboard")}
    if "correctness" in grid:
        write_csv(correctness_frame(parts["correctness"]), out / correctness_report.CSV)
    if "benchmarking" in grid:
        frame = bench_frame(parts["benchmark"])
        write_csv(frame, out / bench_report.CSV)
        figure(frame, out / bench_report.FIGURE)
    # the four fragments; a part with no records says so in one line
    texts = {p: correctness_report.section(p, parts["correctness"], device) for p in correctness_report.TENSORS}
    texts["flash_benchmarking"] = bench_report.section(parts["benchmark"], device, "benchmarking" in grid)
    texts["leaderboard"] = leaderboard_report.section(parts["leaderboard"], device)
    for name, text in texts.items():
        write_text(out / "sections" / f"{name}.md", text)


def main(argv=None) -> int:
    return report_main(argv, __doc__, write)


if __name__ == "__main__":
    raise SystemExit(main())
