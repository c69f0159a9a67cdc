"""Assemble a device's report from its kinds' section fragments, and the front page.

``report/<device>/answers.md``: a short header (device, versions, the code that measured and the
code that wrote the report, the measured time), then one section per problem of PROBLEMS.md in
its order; a fragment ``results/<device>/sections/<problem>[_<part>].md`` lands under its problem.

``report/answers.md`` (``--front``, the front page device's run only): one table with a row per
question — its answer in one line, linked to the detail in the device's report — the compact
**Across devices** table, and links to every device's report. A fragment may open with
``<!-- summary: … -->``: that line is the question's one-line answer (else its first sentence). The
reproduce section is written here from the device's latest verify run (``--verify``), where it has one.

    python -m lmperf.report.answers --device h100 --results results/h100 \\
        --output report/h100/answers.md --front report/answers.md --sections results/h100/sections/*.md
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from lmperf.core import fingerprint
from lmperf.core.record import load_record
from lmperf.kinds import KINDS
from lmperf.report import devices
from lmperf.report.common import blocks, commits_words, md_table, record_paths, summary, write_text

# (problem, one-line question, fragment parts in order)
PROBLEMS = [
    ("benchmarking_script", "How long do forward and backward take for each size; what does warm-up change?", [""]),
    ("nsys_profile", "Which kernels take the time in forward, backward and the optimizer step?", [""]),
    ("mixed_precision_accumulation", "What does accumulating 0.01 a thousand times give in fp32/fp16 mixes?", [""]),
    (
        "benchmarking_mixed_precision",
        "Which dtypes does autocast give, and what does bf16 buy end to end?",
        ["ab", "c"],
    ),
    ("memory_profiling", "How much memory do the 2.7B model's forward and training step need, and for what?", [""]),
    ("pytorch_attention", "How do plain attention's time and memory grow, and where does it run out?", [""]),
    ("torch_compile", "What does torch.compile buy for attention and for the whole model?", ["a", "b"]),
    ("flash_forward", "Is our FlashAttention-2 forward right?", [""]),
    ("flash_backward", "Is our FlashAttention-2 backward right?", [""]),
    ("flash_benchmarking", "How much faster is our FlashAttention-2 than PyTorch's attention?", ["", "model"]),
    ("leaderboard", "How fast is the leaderboard configuration?", [""]),
    ("speed_ladder", "How fast can each model train here, and what does each change buy?", [""]),
    ("timer_check", "Method check: does the step timer agree with CUDA events?", [""]),
    ("scale_out", "Method check: do cells measured two GPUs at a time agree with one at a time?", [""]),
    ("reproduce", "Method check: does a re-measure land inside the committed intervals?", [""]),
]
SUMMARY = re.compile(r"^<!-- summary: (.*?) -->\n*")
SUMMARY_CHARS = 200  # a question's one-line answer on the front page
CPU_NOTE = (
    "**This is the CPU report.** It runs the whole pipeline on tiny models with a CPU grid so that a "
    "newcomer without a GPU sees every section built: its numbers only show that the pipeline works "
    "and answer none of the course's GPU questions. What a CPU cannot measure (CUDA kernels and events, allocator "
    "history) is said once, in one line, where it would be."
)


def fragment_name(problem: str, part: str) -> str:
    return f"{problem}_{part}" if part else problem


def anchor(problem: str) -> str:
    return problem.replace("_", "-")


def summary_of(text: str) -> str:
    """A fragment's one-line answer: its summary comment, else its first prose sentence."""
    match = SUMMARY.match(text)
    blocks = (block.strip() for block in text.split("\n\n"))
    prose = next((b for b in blocks if b and not b.startswith(("#", "|", "!", "<", "`", ">", "_"))), "")
    sentence = match.group(1).strip() if match else re.split(r"(?<=[.!?])\s", prose.replace("\n", " "), maxsplit=1)[0]
    sentence = sentence if len(sentence) <= SUMMARY_CHARS else sentence[: SUMMARY_CHARS - 1] + "…"
    return sentence if not sentence or sentence.endswith((".", "!", "?", "…")) else sentence + "."


def fragments(sections: list[Path]) -> dict[str, str]:
    """{fragment name: its text}, each placed in PROBLEMS or an error naming the stray one."""
    found = {Path(s).stem: Path(s).read_text() for s in sections}
    known = {fragment_name(p, part) for p, _, parts in PROBLEMS for part in parts}
    if unknown := sorted(set(found) - known):
        raise ValueError(f"section fragments with no place in the report: {unknown}")
    return found


def reproduce(result: dict) -> str:
    """The "reproduce" fragment from a verify run (lmperf.core.verify): how many re-measured medians
    landed inside their committed 95% intervals, and how far outside the others are."""

    def outside_pct(cell: dict) -> float | None:
        low, high = cell["committed"]["interval"] or (None, None)
        new = cell["new"]["median"]
        if cell["inside"] is not False or new is None:
            return None
        return 100 * max(low - new, new - high) / cell["committed"]["median"]

    def num(v) -> str:  # 4 significant digits: the committed interval's ends can lie 0.01% apart
        return "—" if v is None else f"{v:.4g}"

    cells = result["cells"]
    judged = [c for c in cells if c["inside"] is not None]
    misses = [m for m in map(outside_pct, cells) if m is not None]
    if not judged:
        said = f"None of the {len(cells)} re-measured cells had a committed interval to judge."
    elif not misses:
        said = f"All {len(judged)} re-measured cells landed inside their committed 95% intervals."
    else:
        spread = f"{min(misses):.2g}%" + (f" to {max(misses):.2g}%" if len(misses) > 1 else "")
        said = (
            f"{len(judged) - len(misses)} of {len(judged)} re-measured cells landed inside their committed 95% "
            f"intervals; {'the one' if len(misses) == 1 else f'the {len(misses)}'} outside missed by {spread} of the median."
        )
    rows = []
    for c in cells:
        interval = c["committed"]["interval"]
        committed = num(c["committed"]["median"]) + (f" [{num(interval[0])}, {num(interval[1])}]" if interval else "")
        outside = {True: "inside", None: "—"}.get(c["inside"]) or f"**{outside_pct(c):.2g}%**"
        record = "/".join(Path(c["record"]).with_suffix("").parts[-2:])
        rows.append((record, c["half"], c["metric"], committed, num(c["new"]["median"]), outside))
    commit = f" from commit `{result['git_commit'][:7]}`" if result.get("git_commit") else ""
    return blocks(
        summary(said),
        "### Re-measured cells",
        f"`snakemake --cores 1 verify` re-measured {len(cells)} timed records of `{result['device']}` on "
        f"{result['date']}{commit}, picked at random (seed {result['seed']}) from each cell's host-bound and GPU-bound "
        "halves, each in as many independent trials as its record. A new median outside the committed interval lies "
        "further from the committed one than that record's trials suggested; both medians are noisy, so a small miss "
        "can happen with nothing changed. _outside by_: the distance beyond the nearer end, in % of the committed median.",
        md_table(rows, ["record", "half", "metric", "committed", "new", "outside by"]),
    )


def versions(device: str, records: list[dict]) -> list[str]:
    """The device and the software that measured, in two lines, from the records' provenance."""

    def values(key: str) -> str:
        return ", ".join(sorted({str(v) for r in records if (v := r["provenance"].get(key)) is not None})) or "—"

    return [
        f"- Device: {values('device_name')}"
        + (f"; driver {values('driver_version')}, CUDA {values('cuda_version')}" if device != "cpu" else ""),
        f"- Software: torch {values('torch_version')}, Triton {values('triton_version')}, Python {values('python_version')}",
    ]


def header(device: str, results: Path, missing: list[str], stale: list[str]) -> list[str]:
    records = [load_record(p) for p in record_paths(results)]
    # the fingerprint of the code that writes the reports (this module and every kind's report)
    code = fingerprint.code_version_of(["lmperf.report.answers", *(f"lmperf.kinds.{k}.report" for k in KINDS)])
    lines = [
        f"# CS336 systems, Part 1, measured on `{device}`",
        "",
        "Generated from the records under `results/" + device + "/` by `snakemake --cores 1 all`; every number "
        "comes from a record. A time is the median over independent trials with its 95% interval in brackets "
        "where the record has trials; † marks an unstable one (interval wider than 10% of it).",
        "",
        *([CPU_NOTE, ""] if device == "cpu" else []),
        *versions(device, records),
        f"- Measured with{commits_words(records).removeprefix(',') or ' commit —'}; report code `{code}`",
        *devices.timing_lines(records),
    ]
    if missing:
        lines.append(f"- Not yet measured: {len(missing)} cells of the grid (the sections use the records that exist)")
    if stale:
        lines.append(
            f"- Measured with other code or settings than the current: {len(stale)} records "
            "(`snakemake --cores 1 all` on this device measures them again)"
        )
    return lines


def answered(found: dict[str, str]):
    """(problem, question, its fragments' texts) for each problem of PROBLEMS that has fragments."""
    for problem, question, parts in PROBLEMS:
        if texts := [found[name] for name in (fragment_name(problem, p) for p in parts) if name in found]:
            yield problem, question, texts


def device_report(device: str, results: Path, found: dict[str, str], missing: list[str], stale: list[str]) -> str:
    parts = ["\n".join(header(device, results, missing, stale)), ""]
    for problem, question, texts in answered(found):  # a problem with no data here is left out
        parts.append(f'<a id="{anchor(problem)}"></a>\n\n## {problem}\n\n_{question}_\n')
        parts += [SUMMARY.sub("", text).rstrip() + "\n" for text in texts]
    return "\n".join(parts)


def front_page(device: str, found: dict[str, str], results_root: Path, report_path: Path) -> str:
    rows = ["| question | answer | detail |", "|---|---|---|"]
    detail = f"{device}/answers.md"
    for problem, question, texts in answered(found):
        answer = " ".join(s for s in (summary_of(t) for t in texts) if s).replace("|", "\\|")
        rows.append(f"| {problem}: {question} | {answer} | [{device}]({detail}#{anchor(problem)}) |")
    # the other devices whose records Across devices compares (a local CPU run's report is not committed)
    others = sorted({d.name for d in results_root.iterdir() if record_paths(d)} - {device, "cpu"})
    links = [f"[{device}]({detail})", *(f"[{d}]({d}/answers.md)" for d in others)]
    across = devices.across_devices(results_root, device, report_path.parent)
    records = [load_record(p) for p in record_paths(results_root / device)]
    return "\n".join(
        [
            "# CS336 systems, Part 1: answers from measurements",
            "",
            f"Answers measured on `{device}`; every number comes from a record under `results/{device}/`. "
            "Each device's full report: " + ", ".join(links) + "; its sections and figures as one browsable page: "
            "[report.html](report.html), once `snakemake --report report/report.html` has built it (it is not committed).",
            "",
            *versions(device, records),
            "",
            *rows,
            "",
            across,
        ]
    )


def relink(text: str, output: Path) -> str:
    """Fragments link figures as seen from report/<device>/ (``../../results/…``); fix them for ``output``."""
    depth = len(output.parent.parts)
    return text if depth == 2 else text.replace("](../../results/", "](" + "../" * depth + "results/")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", required=True)
    p.add_argument("--results", required=True, type=Path)
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--sections", nargs="*", default=[], type=Path)
    p.add_argument("--missing-json", default="[]", help="JSON list: record paths of the grid not measured yet")
    p.add_argument("--stale-json", default="[]", help="JSON list: record paths measured with other code or settings")
    p.add_argument("--verify", type=Path, help="the device's latest verify run (results/<device>/verify/)")
    p.add_argument("--front", type=Path, help="also write the front page (report/answers.md)")
    p.add_argument("--results-root", type=Path, default=Path("results"), help="where every device's records are")
    args = p.parse_args(argv)
    found = fragments(args.sections)
    if args.verify is not None:
        found["reproduce"] = reproduce(json.loads(args.verify.read_text()))
    missing, stale = json.loads(args.missing_json), json.loads(args.stale_json)
    write_text(args.output, relink(device_report(args.device, args.results, found, missing, stale), args.output))
    if args.front is not None:
        write_text(args.front, relink(front_page(args.device, found, args.results_root, args.front), args.front))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
