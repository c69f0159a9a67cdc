"""torch_compile (b) block by block against the whole model as one graph, from records.

The compiled e2e cells compile block by block since 2591fa8 (``lmperf.cells.e2e.compile_blocks``);
before, they compiled the whole model as one graph. This script pairs each compiled cell's record in
the working tree that compiled block by block with the same cell's record as committed at an older
commit, one that compiled the whole model (read with ``git show``; the header names the commit the
old records were measured with, which is not the commit that committed them), on the same device, and prints the measured step
times side by side with their ratio, the cell's process time, and the compile job's cold compile
times of both. Nothing is measured here: both sides are committed records.

    python bench/compile_scope_compare.py h100 b3c1ab7 > bench/results/compile_scope_h100.txt
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from lmperf.report.e2e import compile_scope as scope

COMPILED_GLOB = "*_compiled_*.json"


def pair_rows(new: dict[str, dict], old: dict[str, dict]) -> list[dict]:
    """One row per cell whose new record compiled block by block and whose old one the whole model."""
    rows = []
    for name in sorted(set(new) & set(old)):
        a, b = new[name], old[name]
        if scope(a) != "blocks" or scope(b) != "model":
            continue
        row = {"cell": name.removesuffix(".json")}
        for key in ("training_step_ms_mean", "inference_forward_ms_mean"):
            x, y = a["metrics"].get(key), b["metrics"].get(key)
            row[key] = (x, y, x / y if x and y else None)
        row["process_s"] = (a["provenance"].get("process_age_s"), b["provenance"].get("process_age_s"))
        rows.append(row)
    return rows


def cold_compile_s(records: list[dict]) -> tuple[list[float], list[float]]:
    """The compile job's cold (training, no-grad) compile seconds of each record that has them."""
    train = [r["metrics"]["training_compile_s"] for r in records if r["metrics"].get("training_compile_s")]
    infer = [r["metrics"]["inference_compile_s"] for r in records if r["metrics"].get("inference_compile_s")]
    return train, infer


def _fmt(x, digits=2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def measured_commits(records) -> str:
    return ", ".join(sorted({r["provenance"].get("git_commit", "?")[:7] for r in records}))


def render(
    rows: list[dict], device: str, commit: str, cold_new, cold_old, measured: tuple[str, str] = ("?", "?")
) -> str:
    out = [
        f"## {device}: compiled e2e cells, block by block (working tree, measured by {measured[0]}) against the "
        f"whole model (as committed at {commit}, measured by {measured[1]})",
        "",
        "| cell | train step ms, blocks | whole | ratio | inference fwd ms, blocks | whole | ratio | process s, blocks | whole |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        t, i, p = r["training_step_ms_mean"], r["inference_forward_ms_mean"], r["process_s"]
        out.append(
            f"| {r['cell']} | {_fmt(t[0])} | {_fmt(t[1])} | {_fmt(t[2], 3)} | {_fmt(i[0])} | {_fmt(i[1])} "
            f"| {_fmt(i[2], 3)} | {_fmt(p[0], 1)} | {_fmt(p[1], 1)} |"
        )
    out.append("")
    for key, label in (("training_step_ms_mean", "training step"), ("inference_forward_ms_mean", "inference forward")):
        ratios = [r[key][2] for r in rows if r[key][2]]
        if ratios:
            out.append(
                f"- {label}, blocks / whole over {len(ratios)} cells: median {statistics.median(ratios):.3f}, "
                f"range {min(ratios):.3f}-{max(ratios):.3f}"
            )
    for name, (train, infer) in (("blocks", cold_new), (f"whole model ({commit})", cold_old)):
        if train:
            out.append(
                f"- compile job, {name}: cold training graphs {min(train):.1f}-{max(train):.1f} s, "
                f"no-grad graph {min(infer):.1f}-{max(infer):.1f} s over {len(train)} cells"
            )
    return "\n".join(out) + "\n"


def _git_records(commit: str, folder: str) -> dict[str, dict]:
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", commit, folder + "/"], capture_output=True, text=True, check=True
    ).stdout.split()
    return {
        Path(n).name: json.loads(
            subprocess.run(["git", "show", f"{commit}:{n}"], capture_output=True, text=True).stdout
        )
        for n in names
        if n.endswith(".json")
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    device, commit = argv
    e2e, job = Path("results") / device / "e2e", Path("results") / device / "e2e_compile"
    new = {p.name: json.loads(p.read_text()) for p in e2e.glob(COMPILED_GLOB)}
    old = {n: r for n, r in _git_records(commit, str(e2e)).items() if "_compiled_" in n}
    cold_new = cold_compile_s(
        [r for r in (json.loads(p.read_text()) for p in job.glob("*.json")) if scope(r) == "blocks"]
    )
    cold_old = cold_compile_s([r for r in _git_records(commit, str(job)).values() if scope(r) == "model"])
    rows = pair_rows(new, old)
    paired = {r["cell"] + ".json" for r in rows}
    measured = (
        measured_commits(r for n, r in new.items() if n in paired),
        measured_commits(r for n, r in old.items() if n in paired),
    )
    sys.stdout.write(render(rows, device, commit, cold_new, cold_old, measured))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
