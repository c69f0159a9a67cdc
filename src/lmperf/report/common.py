"""Shared report helpers: the report CLI, numbers for prose, markdown, figures."""

from __future__ import annotations

import argparse
import collections
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from lmperf.core.record import load_record  # noqa: E402
from lmperf.core.sizes import SIZES, config_from_name, parameter_count  # noqa: E402
from lmperf.core.stats import UNSTABLE_WIDTH  # noqa: E402
from lmperf.kinds import RECORD_FOLDERS  # noqa: E402


def report_cli(doc: str, write):
    """A kind's report CLI, ``main(argv=None)``: ``write(records, grid, device, out)`` with the records (sorted
    by path), the kind's config slice and ``--out`` (results/<device>: tables/, figures/, sections/ go under it)."""

    def main(argv=None) -> int:
        p = argparse.ArgumentParser(description=doc.splitlines()[0])
        p.add_argument("--device", required=True)
        p.add_argument("--out", required=True, type=Path)
        p.add_argument("--grid", default="{}", help="the kind's config slice as JSON")
        p.add_argument("--records", nargs="*", default=[])
        args = p.parse_args(argv)
        write([load_record(path) for path in sorted(args.records)], json.loads(args.grid), args.device, args.out)
        return 0

    return main


def record_paths(directory) -> list[str]:
    """The record files of one device (``results/<device>``), sorted: its kinds' folders only, never
    ``verify/`` (a verify run's result) or ``trials/``."""
    return sorted(str(p) for folder in RECORD_FOLDERS for p in Path(directory, folder).glob("*.json"))


def model_rank(model: str) -> tuple:
    """Registered sizes by parameter count, then any other name alphabetically."""
    return (0, parameter_count(config_from_name(model)), model) if model in SIZES else (1, 0, model)


def fmt(x, digits: int = 2) -> str:
    """A number for prose: 3 significant-ish digits (num() with 0 decimals from 100), '—' for missing."""
    return num(x, 0 if x is not None and abs(x) >= 100 else digits)


def num(x, digits: int | None = None) -> str:
    """Thousands separated, by default 0 decimals from 100, 1 from 10, else 2; '—' for none."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:,.{places(x) if digits is None else digits}f}"


def places(x: float) -> int:
    """num()'s decimals: 0 from 100, 1 from 10, else 2."""
    return 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2


def pct(x, digits: int = 1) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}%"


VERDICT_WORDS = {"faster": "faster", "slower": "slower", "within noise": "within the noise"}  # stats.compare's
UNSTABLE_MARK = "†"  # an estimate whose interval is wider than stats.UNSTABLE_WIDTH of its median


def est(e, digits: int | None = None, unit: str = "", missing: str = "—", mark: bool = True) -> str:
    """An Estimate through num(), its ends to the median's decimals: ``56.2 [55.9, 56.6]`` (the median alone
    for one trial), ``unit`` after the median, † where unstable (unless not ``mark``); ``missing`` for none."""
    if e is None:
        return missing
    digits = places(e.median) if digits is None else digits
    interval = f" [{num(e.low, digits)}, {num(e.high, digits)}]" if e.low is not None else ""
    return num(e.median, digits) + unit + interval + (f" {UNSTABLE_MARK}" if mark and e.unstable else "")


def times(ratio, digits: int = 2, mark: bool = False) -> str:
    """A ratio: '2.59×', with its interval where it has one: '2.59× [2.41, 2.80]' († where unstable, if ``mark``)."""
    return est(ratio, digits, "×", mark=mark)


def span(values, unit: str = "×", digits: int | None = 2) -> str:
    """'1.11×–1.84×' over values (ratios unless told; through num()), one value where both ends print the same."""
    lo, hi = (num(v, digits) for v in (min(values), max(values)))
    return f"{lo}{unit}" if lo == hi else f"{lo}{unit}–{hi}{unit}"


def count_verdicts(verdicts) -> dict[str, int]:
    """How many of ``verdicts`` (``stats.compare``'s) are each, in ``VERDICT_WORDS``' order."""
    counts = collections.Counter(verdicts)
    return {v: counts[v] for v in VERDICT_WORDS}


def verdicts_said(counts: dict[str, int]) -> str:
    """'faster in 6, within the noise in 2' from how many cells have each ``stats.compare`` verdict."""
    return ", ".join(f"{VERDICT_WORDS[v]} in {n}" for v, n in counts.items() if n)


def md_table(rows, columns=None) -> str:
    """A markdown table of ``rows`` (a DataFrame, a list of dicts, or tuples of ``columns``): cells as
    written, floats through fmt(), '—' for none, pipes escaped; columns of numbers aligned right; no
    padding (a renderer aligns the columns). A † in it brings the unstable note beneath."""
    df = pd.DataFrame(rows, columns=columns)
    if df.empty:
        return "_(no rows)_\n"
    shown = df.map(lambda v: fmt(v) if v is None or isinstance(v, float) else str(v).strip().replace("|", "\\|"))
    numeric = [all(v[:1] in "0123456789-−—" for v in shown[col]) for col in shown.columns]
    line = lambda cells: "| " + " | ".join(cells) + " |"  # noqa: E731
    lines = [line(str(c) for c in shown.columns), line("---:" if n else ":---" for n in numeric)]
    text = "\n".join(lines + [line(row) for row in shown.itertuples(index=False)])
    note = f"{UNSTABLE_MARK} unstable: its 95% interval is wider than {pct(UNSTABLE_WIDTH, 0)} of its median."
    return text + (f"\n\n{note}" if UNSTABLE_MARK in text else "") + "\n"


def blocks(*parts: str) -> str:
    """Markdown blocks separated by exactly one blank line, ending in one newline; empty parts dropped."""
    return "\n\n".join(p.strip("\n") for p in parts if p and p.strip("\n")) + "\n"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 cell', '3 cells'."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def listing(items) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = [str(i) for i in items]
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def details(head: str, *body: str) -> str:
    """A markdown fold: ``head`` always shown, the ``body`` blocks on a click."""
    return f"<details><summary>{head}</summary>\n\n" + blocks(*body) + "\n</details>"


def link(device: str, path: str) -> str:
    """A file under results/<device>/ as linked from report/<device>/answers.md."""
    return f"../../results/{device}/{path}"


def summary(text: str) -> str:
    """The question's answer in one line, first in a fragment: the front page's (the device report drops it)."""
    return f"<!-- summary: {text} -->"


def write_text(path, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)


def write_csv(rows, path) -> None:
    """``rows`` (a DataFrame or a list of dicts) as a CSV file, without the index."""
    write_text(path, pd.DataFrame(rows).to_csv(index=False))


def figure(nrows: int = 1, ncols: int = 1, **kwargs):
    kwargs.setdefault("figsize", (4.2 * ncols, 3.4 * nrows))
    return plt.subplots(nrows, ncols, squeeze=False, **kwargs)


def save(fig, path, rect=None, **savefig) -> None:
    """Lay ``fig`` out (within ``rect``, a share of the figure), write it to ``path`` and close it."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110, **savefig)
    plt.close(fig)


def empty_figure(path, message: str) -> None:
    """A placeholder image for an output whose records hold nothing to draw."""
    fig, axes = figure()
    axes[0][0].text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    axes[0][0].set_axis_off()
    save(fig, path)


def source_line(records: list[dict], device: str) -> str:
    """A section's closing line: the records in each folder (their kind's), the device(s) and commit(s)."""
    folders = collections.Counter(r["kind"] for r in records).items()
    where = ", ".join(f"{count(n, 'record')} in `results/{device}/{kind}/`" for kind, n in folders)
    return f"_Source: {where}; {device_line(records)}._"


def device_line(records: list[dict]) -> str:
    """'NVIDIA H100 80GB HBM3 (`h100`), commit `0aa86bc`': the records' device(s) and commits."""
    names = sorted({(r["provenance"]["device_name"], r["provenance"]["device_slug"]) for r in records})
    return (", ".join(f"{name} (`{slug}`)" for name, slug in names) or "no records") + commits_words(records)


def commits_words(records: list[dict]) -> str:
    """', commit `0aa86bc`' or ', commits `0aa86bc` (240), `831eca9` (1)' ('' where none is known or no records)."""
    counts = collections.Counter(
        (r["provenance"].get("git_commit") or "unknown")[:7] + (" (dirty)" if r["provenance"].get("git_dirty") else "")
        for r in records
    )
    if set(counts) <= {"unknown"}:
        return ""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(ranked) == 1:
        return f", commit `{ranked[0][0]}`"
    return ", commits " + ", ".join(f"`{c}` ({n})" for c, n in ranked)
