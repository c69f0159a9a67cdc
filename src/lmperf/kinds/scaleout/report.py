"""Report of the scale-out check: the e2e cells on one GPU against several GPUs of one host.

Not a course question: the pipeline's own check that K cells at once, each on its own GPU, measure
what one cell at a time does. Facts (a frozen dataclass per run of K GPUs, each cell's verdict from
``lmperf.core.stats.compare``) → the per-cell table (``tables/scaleout.csv``) and figure → a short
template. The check is not part of ``all``: without its record the section says how to run it.

    python -m lmperf.kinds.scaleout.report --device h200 --out results/h200 --grid '{"gpus": [1, 2], …}' \
        --records results/h200/scaleout/e2e.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from lmperf.core import stats  # noqa: E402
from lmperf.core.record import load_record  # noqa: E402
from lmperf.core.stats import Estimate  # noqa: E402

SECTIONS = ["scale_out"]
ALSO_READS: tuple[str, ...] = ()
CSV = "tables/scaleout.csv"
FIGURE = "figures/scaleout_agreement.png"
# what each cell compares: (the e2e record's metric, words)
COMPARED = (("training_step_ms_median", "training step"), ("inference_forward_ms_median", "inference forward"))
HOW_TO_RUN = "`snakemake --cores 4 scaleout --resources gpu=2` on a host with two GPUs"
VERDICT_WORDS = {"faster": "faster", "slower": "slower", "within noise": "within the noise"}


def outputs(grid: dict) -> list[str]:
    return [CSV, FIGURE]


# -- facts -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CellDiff:
    """One cell's time on K GPUs against the base run; ``verdict`` from the intervals (or single trials)."""

    cell: str
    metric: str
    base: Estimate
    other: Estimate
    verdict: str  # faster | slower | within noise: the K-GPU run against the base run
    gpu: str | None

    @property
    def change(self) -> float:
        return self.other.median / self.base.median - 1


@dataclasses.dataclass(frozen=True)
class Run:
    """The run on ``gpus`` GPUs against the run on ``base_gpus``."""

    gpus: int
    base_gpus: int
    base_wall_s: float
    wall_s: float
    gpus_used: tuple[str, ...]
    diffs: tuple[CellDiff, ...]

    @property
    def speedup(self) -> float:
        return self.base_wall_s / self.wall_s

    @property
    def efficiency(self) -> float:
        return self.speedup / (self.gpus / self.base_gpus)

    def of(self, metric: str) -> list[CellDiff]:
        return [d for d in self.diffs if d.metric == metric]

    def beyond_noise(self, metric: str) -> list[CellDiff]:
        return [d for d in self.of(metric) if d.verdict != "within noise"]

    def halves(self, metric: str) -> tuple[list[CellDiff], list[CellDiff]]:
        """The cells with the shorter and the longer base times (the longer half gets the odd one)."""
        ordered = sorted(self.of(metric), key=lambda d: d.base.median)
        return ordered[: len(ordered) // 2], ordered[len(ordered) // 2 :]


@dataclasses.dataclass(frozen=True)
class ScaleOut:
    status: str
    reason: str | None
    cells: int = 0
    grid_words: str = ""
    host_gpus: int = 0
    single_trials: bool = True
    runs: tuple[Run, ...] = ()


def estimate_of(row: dict, metric: str, gpus: int) -> Estimate | None:
    value = row.get(f"{metric}_gpus{gpus}")
    if value is None:
        return None
    interval = row.get(f"{metric}_interval_gpus{gpus}")
    if not interval:
        return Estimate(float(value))
    trials = row.get(f"{metric}_trials_gpus{gpus}") or 2
    return Estimate(float(value), float(interval[0]), float(interval[1]), trials, "range")


def run_from(metrics: dict, gpus: int) -> Run:
    base = metrics["baseline_gpus"]
    diffs = []
    for row in metrics["per_cell"]:
        for metric, _ in COMPARED:
            a, b = estimate_of(row, metric, base), estimate_of(row, metric, gpus)
            if a is not None and b is not None and a.median > 0:
                diffs.append(
                    CellDiff(
                        row["cell"], metric, a, b, stats.compare(b, a), row.get(f"cuda_visible_devices_gpus{gpus}")
                    )
                )
    entry = metrics["against_baseline"][str(gpus)]
    walls = metrics["wall_s"]
    return Run(gpus, base, float(walls[str(base)]), float(walls[str(gpus)]), tuple(entry["gpus_used"]), tuple(diffs))


def facts_from(record: dict) -> ScaleOut:
    if record["status"] != "ok":
        return ScaleOut(record["status"], record["reason"])
    m, cell = record["metrics"], record["cell"]
    grid_words = (
        f"models {', '.join(cell.get('models', []))} × context {', '.join(map(str, cell.get('context_lengths', [])))}"
        f" × {', '.join(cell.get('precisions', []))}"
    )
    runs = tuple(run_from(m, int(k)) for k in sorted(m["against_baseline"], key=int))
    single = all(d.base.low is None and d.other.low is None for run in runs for d in run.diffs)
    return ScaleOut("ok", None, m["cells"], grid_words, len(m.get("host_gpus", [])), single, runs)


# -- table and figure ------------------------------------------------------------------------------


def fmt(x, digits: int | None = None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if digits is None:
        digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
    return f"{x:,.{digits}f}"


def pct(x, digits: int = 1, signed: bool = False) -> str:
    if x is None:
        return "—"
    return f"{100 * x:+.{digits}f}%" if signed else f"{100 * x:.{digits}f}%"


def est(e: Estimate) -> str:
    digits = 0 if abs(e.median) >= 100 else 1 if abs(e.median) >= 10 else 2
    return e.format(digits)


def cell_table(run: Run) -> pd.DataFrame:
    rows: dict[str, dict] = {}
    for d in run.diffs:
        words = dict(COMPARED)[d.metric]
        row = rows.setdefault(d.cell, {"cell": d.cell})
        row[f"{words}, {run.base_gpus} GPU (ms)"] = est(d.base)
        row[f"{words}, {run.gpus} GPUs (ms)"] = est(d.other)
        row[f"{words} change"] = pct(d.change, signed=True)
        row[f"{words}: {run.gpus} GPUs"] = VERDICT_WORDS[d.verdict]
    for d in run.diffs:
        rows[d.cell][f"GPU ({run.gpus}-GPU run)"] = d.gpu or "—"
    return pd.DataFrame(list(rows.values()))


def csv_frame(facts: ScaleOut | None) -> pd.DataFrame:
    columns = ["gpus", "cell", "metric", "base_gpus", "base_ms", "ms", "change", "verdict", "gpu"]
    rows = [
        [run.gpus, d.cell, d.metric, run.base_gpus, d.base.median, d.other.median, d.change, d.verdict, d.gpu]
        for run in (facts.runs if facts else ())
        for d in run.diffs
    ]
    return pd.DataFrame(rows, columns=columns)


def margin(facts: ScaleOut) -> float:
    """The share around 1 that stats.compare reads as the same (doubled for single trials)."""
    return stats.SAME_MARGIN * (2 if facts.single_trials else 1)


def figure(facts: ScaleOut | None, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    path.parent.mkdir(parents=True, exist_ok=True)
    if not facts or not facts.runs:
        ax.text(0.5, 0.5, "scale-out check: no record on this device", ha="center", va="center")
        ax.set_axis_off()
    else:
        band = margin(facts)
        ax.axhspan(-100 * band, 100 * band, color="#dddddd", label=f"within the noise (±{pct(band, 0)})")
        for run, color in zip(facts.runs, ("#457b9d", "#e76f51", "#2a9d8f", "#6d597a")):
            for (metric, words), marker in zip(COMPARED, ("o", "^")):
                ds = run.of(metric)
                if ds:
                    xs, ys = [d.base.median for d in ds], [100 * d.change for d in ds]
                    ax.scatter(xs, ys, marker=marker, color=color, label=f"{words}, {run.gpus} GPUs")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"the cell's time on {facts.runs[0].base_gpus} GPU (ms, log scale)")
        ax.set_ylabel("change on K GPUs (%)")
        ax.set_title("Each cell on K GPUs at once against one GPU (grey: within the noise)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- templates -------------------------------------------------------------------------------------


def counts_text(run: Run, metric: str) -> str:
    ds, beyond = run.of(metric), run.beyond_noise(metric)
    words = dict(COMPARED)[metric]
    if not beyond:
        return f"the {words} of all {len(ds)} cells is within the noise of its {run.base_gpus}-GPU time"
    slower = sum(d.verdict == "slower" for d in beyond)
    short, _ = run.halves(metric)
    in_short = sum(d in short for d in beyond)
    return (
        f"the {words} of {len(ds) - len(beyond)} of {len(ds)} cells is within the noise of its {run.base_gpus}-GPU "
        f"time and {len(beyond)} differ ({slower} slower, {len(beyond) - slower} faster on {run.gpus} GPUs; "
        f"{in_short} of them among the {len(short)} cells with the shortest times)"
    )


def run_text(run: Run, device: str) -> str:
    train, infer = COMPARED[0][0], COMPARED[1][0]
    short, long = run.halves(train)
    split = ""
    if short and long:
        med = lambda ds: statistics.median(abs(d.change) for d in ds)  # noqa: E731
        split = (
            f" By step length, the {len(long)} cells with the longest training steps ({fmt(long[0].base.median)} ms "
            f"or more) change by {pct(med(long))} in the median, the {len(short)} shortest by {pct(med(short))}."
        )
    return (
        f"Running the cells {run.gpus} at a time took {fmt(run.wall_s, 1)} s against {fmt(run.base_wall_s, 1)} s "
        f"one at a time: {run.speedup:.2f}×, {pct(run.efficiency, 0)} of the ideal {run.gpus / run.base_gpus:.0f}×, "
        f"each cell on its own GPU ({', '.join(run.gpus_used)}, from each record's `CUDA_VISIBLE_DEVICES`). "
        f"{counts_text(run, train)[0].upper()}{counts_text(run, train)[1:]}. {counts_text(run, infer)[0].upper()}"
        f"{counts_text(run, infer)[1:]}.{split}"
    )


def section(records: list[dict], device: str) -> str:
    if not records:
        return f"The scale-out check was not measured on `{device}`: run {HOW_TO_RUN}.\n"
    facts = facts_from(records[0])
    if facts.status != "ok":
        return f"The scale-out check was not measured on `{device}`: {facts.reason.rstrip('.')}. Run {HOW_TO_RUN}.\n"
    noise = (
        f"Each side ran once, so a cell differs only beyond ±{pct(margin(facts), 0)} (twice the margin of cells "
        "with intervals), and the same comparison between two runs on one GPU is not measured."
        if facts.single_trials
        else f"A cell differs only where the interval of its ratio clears ±{pct(margin(facts), 0)}."
    )
    cpu = (
        " On a CPU the GPUs are simulated slots: this checks the pipeline, not GPU isolation."
        if device == "cpu"
        else ""
    )
    blocks = [
        *(run_text(run, device) for run in facts.runs),
        noise + cpu,
        f"![Each cell's change on K GPUs against one GPU](../../results/{device}/{FIGURE})",
        *(
            f"<details><summary>Every cell, {run.gpus} GPUs against {run.base_gpus}</summary>\n\n"
            + cell_table(run).to_markdown(index=False, disable_numparse=True)
            + f"\n\n[full table](../../results/{device}/{CSV})\n\n</details>"
            for run in facts.runs
        ),
        f"The same {facts.cells} end-to-end cells ({facts.grid_words}; the e2e grid's warm-up and measured steps) ran "
        f"once per K as `snakemake --cores 2K --resources gpu=K` in fresh copies of the workflow, on one host with "
        f"{facts.host_gpus} GPUs.",
        source_line(records, device),
    ]
    return "\n\n".join(blocks) + "\n"


def source_line(records: list[dict], device: str) -> str:
    prov = records[0]["provenance"]
    return f"_Source: `results/{device}/scaleout/e2e.json`, {prov['device_name']}, commit `{(prov.get('git_commit') or 'unknown')[:7]}`._"


# -- main ------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", required=True)
    p.add_argument("--out", required=True, help="results/<device>: tables/, figures/, sections/ go under it")
    p.add_argument("--grid", default="{}", help="the scale-out grid (config.yaml grids.<gpu|cpu>.scaleout) as JSON")
    p.add_argument("--records", nargs="*", default=[], help="the scale-out record, if it exists")
    args = p.parse_args(argv)
    json.loads(args.grid)  # the outputs do not depend on it; a malformed grid still fails here
    if len(args.records) > 1:
        p.error("one scale-out record per device")
    records = [load_record(path) for path in args.records]
    out = Path(args.out)
    facts = facts_from(records[0]) if records else None
    (out / CSV).parent.mkdir(parents=True, exist_ok=True)
    csv_frame(facts if facts and facts.status == "ok" else None).to_csv(out / CSV, index=False)
    figure(facts if facts and facts.status == "ok" else None, out / FIGURE)
    (out / "sections").mkdir(parents=True, exist_ok=True)
    (out / "sections" / "scale_out.md").write_text(section(records, args.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
