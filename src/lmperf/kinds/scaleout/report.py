"""Report of the scale-out check: the e2e cells on one GPU against several GPUs of one host.

Writes the fragment ``scale_out.md`` (and ``tables/scaleout.csv`` when there is a record). The
check is not part of ``all``: without its record the fragment says how to run it.

    python -m lmperf.kinds.scaleout.report --device h200 --sections-dir results/h200/sections \
        --records results/h200/scaleout/e2e.json
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pandas as pd

from lmperf.report.common import device_line, fmt, load, md_table, pct, write_csv, write_text

HOW_TO_RUN = (
    "`snakemake --cores 4 scaleout --resources gpu=2` on a host with two GPUs (the cells of "
    "`grids.<gpu|cpu>.scaleout` in config.yaml, run once on one GPU and once on two)."
)


def signed_pct(x) -> str:
    return "—" if x is None else f"{100 * x:+.1f}%"


def cell_table(metrics: dict, gpus: int) -> pd.DataFrame:
    base = metrics["baseline_gpus"]
    rows = []
    for row in metrics["per_cell"]:
        rows.append(
            {
                "cell": row["cell"],
                f"train step, {base} GPU (ms)": row.get(f"training_step_ms_median_gpus{base}"),
                f"train step, {gpus} GPUs (ms)": row.get(f"training_step_ms_median_gpus{gpus}"),
                "difference": signed_pct(row.get(f"training_step_ms_median_rel_diff_gpus{gpus}")),
                f"inference fwd, {base} GPU (ms)": row.get(f"inference_forward_ms_median_gpus{base}"),
                f"inference fwd, {gpus} GPUs (ms)": row.get(f"inference_forward_ms_median_gpus{gpus}"),
                "difference ": signed_pct(row.get(f"inference_forward_ms_median_rel_diff_gpus{gpus}")),
                f"GPU ({gpus}-GPU run)": row.get(f"cuda_visible_devices_gpus{gpus}"),
            }
        )
    return pd.DataFrame(rows)


def split_sentence(metrics: dict, gpus: int) -> str:
    """Agreement of the longer (GPU-bound) half of the cells against the shorter (launch-bound) half."""
    base = metrics["baseline_gpus"]
    pairs = [
        (row.get(f"training_step_ms_median_gpus{base}"), row.get(f"training_step_ms_median_rel_diff_gpus{gpus}"))
        for row in metrics["per_cell"]
    ]
    pairs = sorted((t, d) for t, d in pairs if t is not None and d is not None)
    if len(pairs) < 4:
        return ""
    half = len(pairs) // 2
    short, long = pairs[:half], pairs[half:]
    med = lambda part: statistics.median(abs(d) for _, d in part)  # noqa: E731
    return (
        f"By step length: the {len(long)} cells with the longest training steps ({fmt(long[0][0])} ms and more on "
        f"{base} GPU) differ by {pct(med(long))} in the median, the {len(short)} shortest ({fmt(short[-1][0])} ms "
        f"and less) by {pct(med(short))}. Short steps are mostly Python and kernel-launch time on the host CPU, "
        "which varies from run to run and can be disturbed by a neighbouring cell; longer steps are more GPU-bound. "
        "Each K ran once: the same comparison between two runs on one GPU (the noise floor) is not measured here."
    )


def section(records: list[dict], device: str, source: str = "") -> str:
    lines = [
        "_Not a course question: the pipeline's own check that several GPUs of one host run cells "
        "at once without changing what they measure._",
        "",
    ]
    if not records:
        return "\n".join(lines + [f"Not measured on `{device}`. Run {HOW_TO_RUN}", ""])
    record = records[0]
    if record["status"] != "ok":
        return "\n".join(lines + [f"Not measured on `{device}`: {record['reason']}. Run {HOW_TO_RUN}", ""])
    m = record["metrics"]
    cell = record["cell"]
    base = m["baseline_gpus"]
    lines += [
        f"The same {m['cells']} end-to-end cells (models {', '.join(cell['models'])} × context "
        f"{', '.join(map(str, cell['context_lengths']))} × {', '.join(cell['precisions'])}; the e2e grid's "
        "warm-up and measured steps), run by `python -m lmperf.kinds.scaleout.cell` as `snakemake --cores 2K "
        "--resources gpu=K` in fresh copies of the workflow, once per K, on one host "
        f"({len(m['host_gpus'])} GPUs, {device_line(records, with_commits=False)}).",
        "",
    ]
    for k, entry in sorted(m["against_baseline"].items(), key=lambda kv: int(kv[0])):
        gpus = int(k)
        lines += [
            f"### {gpus} GPUs against {base}",
            "",
            f"Wall time {fmt(m['wall_s'][str(base)], 1)} s on {base} GPU, {fmt(m['wall_s'][k], 1)} s on {gpus}: "
            f"a speed-up of {entry['speedup']:.2f}× ({pct(entry['efficiency'], 0)} of the ideal {gpus / base:.0f}×; "
            "each cell is a process whose start-up, model build and warm-up are part of the wall time). "
            f"The cells of the {gpus}-GPU run ran on GPUs {', '.join(entry['gpus_used'])} "
            "(each record's `CUDA_VISIBLE_DEVICES`).",
            "",
            f"Timing agreement: a cell's median training step differs by {pct(entry['training_step_abs_rel_diff_median'])} "
            f"in the median over {entry['training_step_cells_compared']} cells (at most "
            f"{pct(entry['training_step_abs_rel_diff_max'])}; signed median {signed_pct(entry['training_step_rel_diff_median'])}, "
            f"positive = slower on {gpus} GPUs); the median inference forward by "
            f"{pct(entry['inference_forward_abs_rel_diff_median'])} (at most {pct(entry['inference_forward_abs_rel_diff_max'])}).",
            "",
            split_sentence(m, gpus),
            "",
            md_table(cell_table(m, gpus)),
        ]
    lines.append(f"_Source: `{source}`, {device_line(records)}._\n")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", required=True)
    p.add_argument("--sections-dir", required=True)
    p.add_argument("--tables-dir", default=None, help="default: the sections dir's sibling tables/")
    p.add_argument("--records", nargs="*", default=[], help="the scale-out record, if it exists")
    args = p.parse_args(argv)
    if len(args.records) > 1:
        p.error("one scale-out record per device")
    records = load(args.records)
    sections = Path(args.sections_dir)
    write_text(sections / "scale_out.md", section(records, args.device, args.records[0] if args.records else ""))
    if records and records[0]["status"] == "ok":
        tables = Path(args.tables_dir) if args.tables_dir else sections.parent / "tables"
        write_csv(pd.DataFrame(records[0]["metrics"]["per_cell"]), tables / "scaleout.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
