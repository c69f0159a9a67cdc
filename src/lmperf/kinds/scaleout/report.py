"""Report of the scale-out check: each cell on K GPUs against one GPU (``stats.compare``), the table,
the figure and a short template; without a record, how to run it (not part of ``all``).
"""

from __future__ import annotations

import collections
import statistics
from pathlib import Path

import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from lmperf.core import stats
from lmperf.core.stats import Estimate
from lmperf.report import common as C

SECTIONS = ["scale_out"]
ALSO_READS: tuple[str, ...] = ()
CSV = "tables/scaleout.csv"
FIGURE = "figures/scaleout_agreement.png"
STEP, INFERENCE = "training_step_ms_median", "inference_forward_ms_median"
COMPARED = {STEP: "training step", INFERENCE: "inference forward"}  # what each cell compares: metric -> words
HOW_TO_RUN = "`snakemake --cores 4 scaleout --resources gpu=2` on a host with two GPUs"


def outputs(grid: dict) -> list[str]:
    return [CSV, FIGURE]


# one cell's time on K GPUs (other) against the base run's, its change (other / base - 1) and verdict
CellDiff = collections.namedtuple("CellDiff", "cell metric base other verdict gpu change")


def estimate_of(row: dict, metric: str, gpus: int) -> Estimate | None:
    value, interval = row.get(f"{metric}_gpus{gpus}"), row.get(f"{metric}_interval_gpus{gpus}")
    if value is None or not interval:
        return None if value is None else Estimate(float(value))
    trials = row.get(f"{metric}_trials_gpus{gpus}") or 2
    return Estimate(float(value), float(interval[0]), float(interval[1]), trials, "range")


class Run:
    """The run on ``gpus`` GPUs against the run on ``base_gpus``: the wall times and each cell's CellDiff."""

    def __init__(self, metrics: dict, gpus: int):
        self.gpus, self.base_gpus = gpus, metrics["baseline_gpus"]
        walls = metrics["wall_s"]
        self.base_wall_s, self.wall_s = float(walls[str(self.base_gpus)]), float(walls[str(gpus)])
        self.speedup = self.base_wall_s / self.wall_s
        self.efficiency = self.speedup / (gpus / self.base_gpus)
        self.gpus_used = tuple(metrics["against_baseline"][str(gpus)]["gpus_used"])
        diffs = []
        for row in metrics["per_cell"]:
            for metric in COMPARED:
                a, b = estimate_of(row, metric, self.base_gpus), estimate_of(row, metric, gpus)
                if a is not None and b is not None and a.median > 0:
                    gpu = row.get(f"cuda_visible_devices_gpus{gpus}")
                    diffs.append(CellDiff(row["cell"], metric, a, b, stats.compare(b, a), gpu, b.median / a.median - 1))
        self.diffs = tuple(diffs)

    def of(self, metric: str) -> list[CellDiff]:
        return [d for d in self.diffs if d.metric == metric]

    def halves(self, metric: str) -> tuple[list[CellDiff], list[CellDiff]]:
        """The cells with the shorter and the longer base times (the longer half gets the odd one)."""
        ordered = sorted(self.of(metric), key=lambda d: d.base.median)
        return ordered[: len(ordered) // 2], ordered[len(ordered) // 2 :]


def runs_from(record: dict) -> tuple[Run, ...]:
    """An ok record's runs, fewest GPUs first (none for any other record)."""
    if record["status"] != "ok":
        return ()
    m = record["metrics"]
    return tuple(Run(m, int(k)) for k in sorted(m["against_baseline"], key=int))


def single_trials(runs: tuple[Run, ...]) -> bool:
    return all(d.base.low is None and d.other.low is None for run in runs for d in run.diffs)


def cell_table(run: Run) -> pd.DataFrame:
    rows: dict[str, dict] = {}
    for d in run.diffs:
        words, row = COMPARED[d.metric], rows.setdefault(d.cell, {"cell": d.cell})
        row |= {f"{words}, {run.base_gpus} GPU (ms)": C.est(d.base), f"{words}, {run.gpus} GPUs (ms)": C.est(d.other)}
        row |= {f"{words} change": f"{100 * d.change:+.1f}%", f"{words}: {run.gpus} GPUs": C.VERDICT_WORDS[d.verdict]}
    gpu = {d.cell: d.gpu or "—" for d in run.diffs}  # the last column
    return pd.DataFrame([row | {f"GPU ({run.gpus}-GPU run)": gpu[cell]} for cell, row in rows.items()])


def csv_frame(runs: tuple[Run, ...]) -> pd.DataFrame:
    columns = ["gpus", "cell", "metric", "base_gpus", "base_ms", "ms", "change", "verdict", "gpu"]
    rows = [
        [run.gpus, d.cell, d.metric, run.base_gpus, d.base.median, d.other.median, d.change, d.verdict, d.gpu]
        for run in runs
        for d in run.diffs
    ]
    return pd.DataFrame(rows, columns=columns)


def margin(runs: tuple[Run, ...]) -> float:
    """The share around 1 that stats.compare reads as the same (doubled for single trials)."""
    return stats.SAME_MARGIN * (2 if single_trials(runs) else 1)


def figure(runs: tuple[Run, ...], path: Path) -> None:
    if not runs:
        return C.empty_figure(path, "scale-out check: no record on this device")
    fig, axes = C.figure(figsize=(7, 3.6))
    ax, band = axes[0][0], margin(runs)
    ax.axhspan(-100 * band, 100 * band, color="#dddddd", label=f"within the noise (±{C.pct(band, 0)})")
    for run, color in zip(runs, ("#457b9d", "#e76f51", "#2a9d8f", "#6d597a")):
        for (metric, words), marker in zip(COMPARED.items(), ("o", "^")):
            if ds := run.of(metric):
                xs, ys = [d.base.median for d in ds], [100 * d.change for d in ds]
                ax.scatter(xs, ys, marker=marker, color=color, label=f"{words}, {run.gpus} GPUs")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel=f"the cell's time on {runs[0].base_gpus} GPU (ms, log scale)", ylabel="change on K GPUs (%)")
    ax.set_title("Each cell on K GPUs at once against one GPU (grey: within the noise)", fontsize=9)
    ax.legend(fontsize=7)
    C.save(fig, path)


def counts_text(run: Run, metric: str) -> str:
    ds, words = run.of(metric), COMPARED[metric]
    beyond = [d for d in ds if d.verdict != "within noise"]
    if not beyond:
        return f"The {words} of all {len(ds)} cells is within the noise of its {run.base_gpus}-GPU time"
    slower, short = sum(d.verdict == "slower" for d in beyond), run.halves(metric)[0]
    return (
        f"The {words} of {len(ds) - len(beyond)} of {len(ds)} cells is within the noise of its {run.base_gpus}-GPU "
        f"time and {len(beyond)} differ ({slower} slower, {len(beyond) - slower} faster on {run.gpus} GPUs; "
        f"{sum(d in short for d in beyond)} of them among the {len(short)} cells with the shortest times)"
    )


def run_text(run: Run) -> str:
    short, long = run.halves(STEP)
    split = ""
    if short and long:
        med = lambda ds: statistics.median(abs(d.change) for d in ds)  # noqa: E731
        split = (
            f" By step length, the {len(long)} cells with the longest training steps ({C.num(long[0].base.median)} ms "
            f"or more) change by {C.pct(med(long))} in the median, the {len(short)} shortest by {C.pct(med(short))}."
        )
    return (
        f"Running the cells {run.gpus} at a time took {C.num(run.wall_s, 1)} s against {C.num(run.base_wall_s, 1)} s "
        f"one at a time: {run.speedup:.2f}×, {C.pct(run.efficiency, 0)} of the ideal {run.gpus / run.base_gpus:.0f}×, "
        f"each cell on its own GPU ({', '.join(run.gpus_used)}, from each record's `CUDA_VISIBLE_DEVICES`). "
        f"{counts_text(run, STEP)}. {counts_text(run, INFERENCE)}.{split}"
    )


def section(records: list[dict], device: str) -> str:
    if not records or records[0]["status"] != "ok":
        why = f"{records[0]['reason'].rstrip('.')}. Run" if records else "run"  # its figure, empty, not linked
        return f"The scale-out check was not measured on `{device}`: {why} {HOW_TO_RUN}.\n"
    runs, full_table = runs_from(records[0]), f"[full table]({C.link(device, CSV)})"
    m, cell = records[0]["metrics"], records[0]["cell"]
    lengths = ", ".join(map(str, cell.get("context_lengths", [])))
    words = f"models {', '.join(cell.get('models', []))} × context {lengths} × {', '.join(cell.get('precisions', []))}"
    summary = "; ".join(
        f"On {run.gpus} GPUs {sum(d.verdict == 'within noise' for d in run.of(STEP))} of {len(run.of(STEP))} "
        f"{COMPARED[STEP]}s are within the noise of {run.base_gpus} GPU, and running {run.gpus} at a time finished "
        f"the {len(run.of(STEP))} cells {run.speedup:.2f}× as fast (wall time)"
        for run in runs
    )
    noise = (
        f"Each side ran once, so a cell differs only beyond ±{C.pct(margin(runs), 0)} (twice the margin of cells "
        "with intervals), and the same comparison between two runs on one GPU is not measured."
        if single_trials(runs)
        else f"A cell differs only where the interval of its ratio clears ±{C.pct(margin(runs), 0)}."
    )
    if device == "cpu":
        noise += " On a CPU the GPUs are simulated slots: this checks the pipeline, not GPU isolation."
    return C.blocks(
        C.summary(f"{summary}."),
        *(run_text(run) for run in runs),
        noise,
        f"![Each cell's change on K GPUs against one GPU]({C.link(device, FIGURE)})",
        *(
            C.details(f"Every cell, {run.gpus} GPUs against {run.base_gpus}", C.md_table(cell_table(run)), full_table)
            for run in runs
        ),
        f"The same {m['cells']} end-to-end cells ({words}; the e2e grid's warm-up and measured steps) ran "
        f"once per K as `snakemake --cores 2K --resources gpu=K` in fresh copies of the workflow, on one host with "
        f"{len(m.get('host_gpus', []))} GPUs.",
        C.source_line(records, device),
    )


def write(records: list[dict], grid: dict, device: str, out: Path) -> None:
    if len(records) > 1:
        raise SystemExit("one scale-out record per device")
    runs = runs_from(records[0]) if records else ()
    C.write_csv(csv_frame(runs), out / CSV)
    figure(runs, out / FIGURE)
    C.write_text(out / "sections" / "scale_out.md", section(records, device))


main = C.report_cli(__doc__, write)

if __name__ == "__main__":
    raise SystemExit(main())
