"""Assemble report/answers.md from the section fragments each kind's report writes.

The problems appear in the order of PROBLEMS.md; a fragment named ``<problem>.md`` or
``<problem>_<part>.md`` lands under that problem's heading. A problem without fragments says
it was not measured on this device, and which rule produces it.

    python -m lmperf.report.answers --device h100 --results results/h100 --output report/answers.md \
        --sections results/h100/sections/*.md
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from pathlib import Path

from lmperf.core.record import load_record
from lmperf.report import devices as device_report

# (problem, one-line question, fragment parts in order)
PROBLEMS = [
    ("benchmarking_script", "End-to-end forward/backward timing of every model size; warm-up effects.", [""]),
    ("nsys_profile", "Nsight Systems profiles: kernels per phase, matmul share, attention internals.", [""]),
    ("mixed_precision_accumulation", "Accumulating 0.01 a thousand times in fp32/fp16 mixes.", [""]),
    ("benchmarking_mixed_precision", "Autocast dtypes, layer-norm precision, bf16 end to end.", ["ab", "c"]),
    ("memory_profiling", "Memory timelines and peaks of the 2.7B model.", [""]),
    ("pytorch_attention", "Unfused attention: time and memory across head dims and lengths.", [""]),
    ("torch_compile", "torch.compile of attention and of the whole model.", ["a", "b"]),
    ("flash_forward", "FlashAttention-2 forward in PyTorch and Triton.", [""]),
    ("flash_backward", "FlashAttention-2 backward.", [""]),
    ("flash_benchmarking", "FlashAttention-2 against PyTorch attention.", ["", "model"]),
    ("leaderboard", "Forward+backward of the leaderboard configuration.", [""]),
    ("speed_ladder", "How fast each model trains here: the course's step to our best, one change at a time.", [""]),
    ("timer_check", "Method check: the step timer against CUDA events.", [""]),
    ("scale_out", "Method check: the e2e cells on one GPU against several GPUs of one host.", [""]),
]


def fragment_name(problem: str, part: str) -> str:
    return f"{problem}_{part}" if part else problem


MISSING_SHOWN = 6  # names listed per kind; the rest are counted


def names_by_kind(paths: list[str]) -> list[str]:
    """``kind (n): name, name, …`` per kind of the records' paths, the first few names of each."""
    by_kind: dict[str, list[str]] = {}
    for path in paths:
        by_kind.setdefault(Path(path).parent.name, []).append(Path(path).stem)
    out = []
    for kind, names in sorted(by_kind.items()):
        names = sorted(names)
        shown = ", ".join(names[:MISSING_SHOWN]) + (
            f", … and {len(names) - MISSING_SHOWN} more" if len(names) > MISSING_SHOWN else ""
        )
        out.append(f"{kind} ({len(names)}): {shown}")
    return out


def records_by_kind(title: str, paths: list[str]) -> list[str]:
    """Header lines: a title, then the records' names grouped by kind (the first few of each)."""
    if not paths:
        return []
    return [title, *(f"  - {line}" for line in names_by_kind(paths))]


# The records each problem's answer draws on: (kind, a part of the record's name; "" for all of the kind).
# A problem whose records include some measured with older code says so under its heading.
PROBLEM_RECORDS = {
    "benchmarking_script": [("e2e", "_eager_")],
    "nsys_profile": [("nsys", ""), ("e2e", "_eager_")],
    "mixed_precision_accumulation": [("precision", "accumulation")],
    "benchmarking_mixed_precision": [("precision", ""), ("e2e", "_eager_")],
    "memory_profiling": [("memory", "")],
    "pytorch_attention": [("attention", "")],
    "torch_compile": [("attention", ""), ("e2e", "_compiled_"), ("e2e_compile", "")],
    "flash_forward": [("flash", "correctness")],
    "flash_backward": [("flash", "correctness")],
    "flash_benchmarking": [("flash", "bench_"), ("e2e", "_eager_w5_")],
    "leaderboard": [("flash", "leaderboard")],
    "speed_ladder": [("ladder", ""), ("gemm_peak", ""), ("ladder_profile", "")],
    "timer_check": [("e2e", "")],
    "scale_out": [("scaleout", "")],
}


def older_code_note(problem: str, stale: list[str]) -> str | None:
    """A line under a problem's heading naming its records measured with older code, if any."""
    mine = [
        p
        for p in stale
        if any(Path(p).parent.name == kind and part in Path(p).stem for kind, part in PROBLEM_RECORDS[problem])
    ]
    if not mine:
        return None
    listed = "; ".join(names_by_kind(mine))
    return (
        f"> **Older code here:** {len(mine)} of the records this answer draws on "
        f"{'was' if len(mine) == 1 else 'were'} measured with code that has changed since ({listed}); where a "
        "sentence pools records of several code versions, it mixes them.\n"
    )


def missing_text(missing: list[str]) -> list[str]:
    """Header lines naming the cells of the grid that have no record yet, grouped by kind."""
    return records_by_kind(
        f"- **Not yet measured** ({len(missing)} "
        + ("cell of the grid has" if len(missing) == 1 else "cells of the grid have")
        + " no record; the sections below use the records that exist):",
        missing,
    )


CPU_NOTE = (
    "**This is the CPU report.** It runs the whole pipeline on tiny models (`tiny`, `mini`) with a CPU "
    "grid, so that a newcomer without a GPU sees every section built: its numbers only prove that the "
    "pipeline works. They answer none of the course's GPU questions; sections about CUDA kernels, CUDA "
    "memory or Triton timings say where the CPU has no equivalent."
)


def anchor(problem: str) -> str:
    """The link target of a problem's heading (an explicit id: the same in markdown viewers and HTML)."""
    return problem.replace("_", "-")


def contents() -> list[str]:
    """A table of contents: one line per problem, one click to its answer."""
    return [
        '<a id="contents"></a>',
        "",
        "## Contents",
        "",
        *(f"- [{problem}](#{anchor(problem)}): {question}" for problem, question, _ in PROBLEMS),
        "",
    ]


# The scale-out check is not part of `all`; its record is re-measured by name on a multi-GPU host.
SCALEOUT_RERUN = "`snakemake --cores 4 scaleout --forcerun scaleout_cell --resources gpu=2` on a host with 2 GPUs (targets first: `--forcerun` and `--resources` take every word after them)"


def stale_text(stale: list[str]) -> list[str]:
    """Header lines naming the records measured with older code than the current, grouped by kind,
    with the command that re-measures them."""
    scaleout = [p for p in stale if Path(p).parent.name == "scaleout"]
    rest = len(stale) - len(scaleout)
    how = []
    if rest:
        how.append(f"`snakemake --cores 1 all` on this device re-measures {'it' if rest == 1 else 'them'}")
    if scaleout:
        how.append(f"the scale-out check is not part of `all`: {SCALEOUT_RERUN} re-measures it")
    return records_by_kind(
        f"- **Measured with older code** ({len(stale)} "
        + ("record: its code version differs" if len(stale) == 1 else "records: their code version differs")
        + " from the current code's; "
        + "; ".join(how)
        + "):",
        stale,
    )


def header(device: str, results: Path, missing: list[str] = (), stale: list[str] = ()) -> str:
    records = [load_record(p) for p in sorted(glob.glob(str(results / "*" / "*.json")))]
    prov = [r["provenance"] for r in records]

    def values(key):
        return ", ".join(sorted({str(p.get(key)) for p in prov})) or "—"

    commits = sorted({(p["git_commit"][:12], p["git_dirty"]) for p in prov})
    commit_text = ", ".join(f"`{c}`" + (" (dirty tree)" if d else "") for c, d in commits) or "—"
    statuses = {}
    for r in records:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    status_text = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "none"
    cuda = [p for p in prov if p.get("driver_version") or p.get("cuda_version")]
    if device == "cpu":
        regenerate = (
            "- Regenerate: `snakemake --cores 1 all` on a machine without CUDA (device `auto` resolves to "
            "`cpu`) measures the CPU grid into `results/cpu/` (not committed) and writes this file; "
            "`snakemake --report report/report.html` for HTML."
        )
        device_text = f"- Device: {values('device_name')} (`cpu`; no CUDA device, no driver)"
    else:
        regenerate = (
            f"- Regenerate: `snakemake --cores 1 all` on this device; elsewhere, `snakemake --cores 1 all "
            f"--config device={device} report_only=true` rebuilds it from the committed records under "
            f"`results/{device}/`; `snakemake --report report/report.html` for HTML."
        )
        device_text = f"- Device: {values('device_name')} (`{device}`)" + (
            f", driver {values('driver_version')}, CUDA {values('cuda_version')}" if cuda else ""
        )
    return "\n".join(
        [
            "# CS336 systems, Part 1: answers from measurements",
            "",
            "Generated by `snakemake --cores 1 all` (rule `answers`) from the JSON records under "
            f"`results/{device}/`; do not edit by hand. Every number below is computed from a record.",
            "",
            *([CPU_NOTE, ""] if device == "cpu" else []),
            device_text,
            f"- Software: torch {values('torch_version')}, triton {values('triton_version')}, "
            f"Python {values('python_version')}",
            f"- Code: commit {commit_text}",
            f"- Records: {len(records)} ({status_text}); measured {min((p['start_time'] for p in prov), default='—')}"
            f" to {max((p['start_time'] for p in prov), default='—')}",
            *device_report.timing_lines(records),
            regenerate,
            *missing_text(list(missing)),
            *stale_text(list(stale)),
            "",
            *contents(),
        ]
    )


ACROSS_DEVICES = "Across devices"
ACROSS_DEVICES_QUESTION = "Every cell measured on two or more devices, side by side; links to each device's own report."


def front_page(text: str, across: str) -> str:
    """The front page: a device's answers, with Across devices added to their contents, then that section."""
    problem, question, _ = PROBLEMS[-1]
    last = f"- [{problem}](#{anchor(problem)}): {question}"
    if last not in text:
        raise ValueError("the answers have no contents line for their last problem")
    anchor_id = ACROSS_DEVICES.lower().replace(" ", "-")
    text = text.replace(last, f"{last}\n- [{ACROSS_DEVICES}](#{anchor_id}): {ACROSS_DEVICES_QUESTION}", 1)
    return text.rstrip("\n") + f'\n\n<a id="{anchor_id}"></a>\n\n' + across


def relink(text: str, output: Path) -> str:
    """Fragments link figures as seen from report/ (``../results/…``); fix them for ``output``'s folder."""
    prefix = Path(os.path.relpath(".", output.parent)).as_posix()
    return text if prefix == ".." else text.replace("](../results/", f"]({prefix}/results/")


def assemble(device: str, results: Path, sections: list[Path], missing: list[str] = (), stale: list[str] = ()) -> str:
    by_name = {Path(s).stem: Path(s) for s in sections}
    parts = [header(device, results, missing, stale)]
    for problem, question, fragment_parts in PROBLEMS:
        parts.append(f'<a id="{anchor(problem)}"></a>\n\n## {problem}\n\n_{question}_ ([contents](#contents))\n')
        note = older_code_note(problem, list(stale))
        if note:
            parts.append(note)
        found = False
        for part in fragment_parts:
            path = by_name.get(fragment_name(problem, part))
            if path is not None:
                parts.append(path.read_text().rstrip() + "\n")
                found = True
        if not found:
            parts.append(f"_Not measured on `{device}` by this pipeline yet._\n")
    unknown = sorted(set(by_name) - {fragment_name(p, part) for p, _, parts_ in PROBLEMS for part in parts_})
    if unknown:
        raise ValueError(f"section fragments with no place in the report: {unknown}")
    return "\n".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", required=True)
    p.add_argument("--results", required=True, type=Path)
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--sections", nargs="*", default=[], type=Path)
    p.add_argument("--missing-json", default="[]", help="JSON list: record paths of the grid not measured yet")
    p.add_argument("--stale-json", default="[]", help="JSON list: record paths measured with other code or settings")
    p.add_argument(
        "--front",
        type=Path,
        default=None,
        help="also write the front page (report/answers.md): these answers, then **Across devices**",
    )
    p.add_argument("--results-root", type=Path, default=Path("results"), help="where every device's records are")
    args = p.parse_args(argv)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    missing, stale = json.loads(args.missing_json), json.loads(args.stale_json)
    text = assemble(args.device, args.results, args.sections, missing, stale)
    args.output.write_text(relink(text, args.output))
    if args.front is not None:
        args.front.parent.mkdir(parents=True, exist_ok=True)
        across = device_report.across_devices(args.results_root, args.device, args.front.parent, stale)
        args.front.write_text(front_page(relink(text, args.front), across))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
