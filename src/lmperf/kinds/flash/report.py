"""Report of the flash kind: flash_forward, flash_backward, flash_benchmarking and leaderboard, their CSVs
and the benchmark's figure. No torch."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd

from lmperf.core import stats
from lmperf.kinds.flash import bench_report, correctness_report, leaderboard_report
from lmperf.report.common import empty_figure, figure, report_cli, save, write_csv, write_text

SECTIONS: list[str] = ["flash_forward", "flash_backward", "flash_benchmarking", "leaderboard"]
ALSO_READS: tuple[str, ...] = ()
COLORS = {"flash": "C3", "sdpa": "C2"}  # the figure's, per implementation


def outputs(grid: dict) -> list[str]:
    """Every table and figure this report writes, relative to --out, for the parts the grid runs."""
    out = [correctness_report.CSV] if "correctness" in grid else []
    return out + ([bench_report.CSV, bench_report.FIGURE] if "benchmarking" in grid else [])


def correctness_frame(records: list[dict]) -> pd.DataFrame:
    """One row per correctness entry (its tiles left to the record)."""
    return pd.DataFrame(
        {"implementation": r["cell"]["implementation"], "kernel_mode": r["metrics"].get("kernel_mode")}
        | {k: "; ".join(v) if k == "failed_checks" else v for k, v in e.items() if k != "tiles"}
        for r in records
        for e in r["metrics"].get("entries_detail") or []
    )


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
    order = correctness_report.PRECISION_ORDER
    rows.sort(key=lambda x: (order.get(x["precision"], 9), x["head_dim"], x["sequence_length"], x["implementation"]))
    return pd.DataFrame(rows)


def speedup_figure(df: pd.DataFrame, path: Path) -> list[str]:
    """Each implementation's speed-up over plain (plain's time / its time) against sequence length: fwd+bwd and
    forward alone, with error bars where both ends are known, in one log-log panel per (precision, head dim),
    grey where plain runs out of memory (in the backward only, where its forward ran); a placeholder where
    there is nothing to draw. Returns the legend's labels."""
    if not len(df) or not (df.status == "ok").any():
        empty_figure(path, "no benchmark timings on this device")
        return []
    precisions = sorted(df.precision.unique(), key=lambda p: correctness_report.PRECISION_ORDER.get(p, 9))
    dims = sorted(df.head_dim.unique())
    fig, axes = figure(len(precisions), len(dims), sharex=True, figsize=(3.6 * len(dims), 2.9 * len(precisions)))
    fig.suptitle("Speed-up over plain attention (plain's time / the implementation's)")
    for (i, precision), (j, d) in itertools.product(enumerate(precisions), enumerate(dims)):
        ax, sub = axes[i][j], df[(df.precision == precision) & (df.head_dim == d)]
        ax.set_xscale("log", base=2)
        ax.set(yscale="log", xlabel="sequence length N" if i == len(precisions) - 1 else "")
        ax.set_ylabel("speed-up (×)" if j == 0 else "")
        ax.yaxis.set_major_formatter(lambda y, _: f"{y:g}")
        ax.yaxis.set_minor_formatter(lambda y, _: f"{y:g}" if f"{y:.0e}"[0] in "25" else "")
        ax.tick_params(axis="y", which="minor", labelsize=6)
        ax.set_title(f"{precision}, d = {d}", fontsize=8)
        plain = sub[sub.implementation == "plain"].set_index("sequence_length")
        for impl in sorted(set(sub.implementation) - {"plain"}, key=lambda x: x != "flash"):
            mine = sub[(sub.implementation == impl) & (sub.status == "ok")].set_index("sequence_length")
            for p, style, word in (("forward_backward", "o-", "fwd+bwd"), ("forward", "--", "fwd")):
                base = plain[[f"{p}_ms", f"{p}_ms_low", f"{p}_ms_high"]].reindex(mine.index)
                ok = mine[f"{p}_ms"].notna() & base[f"{p}_ms"].notna()
                if not ok.any():
                    continue
                b, m = base[ok], mine[ok]
                y = b[f"{p}_ms"] / m[f"{p}_ms"]
                low, high = b[f"{p}_ms_low"] / m[f"{p}_ms_high"], b[f"{p}_ms_high"] / m[f"{p}_ms_low"]
                known = low.notna() & high.notna()
                yerr = [(y - low).where(known, 0.0), (high - y).where(known, 0.0)] if known.any() else None
                color, label = COLORS.get(impl, "C4"), f"{impl} {word}"
                ax.errorbar(m.index, y, yerr=yerr, fmt=style, ms=3, capsize=2, color=color, label=label)
        oom = plain[plain.status == "oom"]
        if len(oom):  # a forward drawn in the band ran: plain's backward is what ran out of memory there
            whole = oom.forward_ms.isna().all()
            look = dict(color="0.9") if whole else dict(facecolor="0.95", edgecolor="0.75", hatch="//", lw=0)
            word = "plain out of memory" if whole else "plain's backward out of memory"
            ax.axvspan(oom.index.min() / 1.3, sub.sequence_length.max() * 1.3, label=word, **look)
        ax.axhline(1, color="0.5", lw=0.8)
    labels = {label: h for ax in fig.axes for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(list(labels.values()), list(labels), loc="lower center", ncol=max(1, len(labels)), fontsize=7)
    save(fig, path, rect=(0, 0.04, 1, 0.96))  # room for the figure's legend and title
    return list(labels)


def write(records: list[dict], grid: dict, device: str, out: Path) -> None:
    parts = {t: [r for r in records if r["cell"]["test"] == t] for t in ("correctness", "benchmark", "leaderboard")}
    if "correctness" in grid:
        write_csv(correctness_frame(parts["correctness"]), out / correctness_report.CSV)
    if "benchmarking" in grid:
        frame = bench_frame(parts["benchmark"])
        write_csv(frame, out / bench_report.CSV)
        speedup_figure(frame, out / bench_report.FIGURE)
    # the four fragments; a part with no records says so in one line
    texts = {p: correctness_report.section(p, parts["correctness"], device) for p in correctness_report.TENSORS}
    texts["flash_benchmarking"] = bench_report.section(parts["benchmark"], device)
    texts["leaderboard"] = leaderboard_report.section(parts["leaderboard"], device)
    for name, text in texts.items():
        write_text(out / "sections" / f"{name}.md", text)


main = report_cli(__doc__, write)

if __name__ == "__main__":
    raise SystemExit(main())
