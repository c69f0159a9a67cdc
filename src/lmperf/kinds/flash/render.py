"""Small writing helpers of the flash report: numbers with their intervals, markdown tables, links
from a device's answers page, files. No torch, no other kind's modules."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from lmperf.core.stats import Estimate

KIND = "flash"
# sections land in report/<device>/answers.md; results/ is two folders up from there
RESULTS_FROM_ANSWERS = "../../results"


def missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def num(x, digits: int = 2) -> str:
    """A number for prose or a table cell; '—' for missing."""
    if missing(x):
        return "—"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.{digits}f}"


def sci(x) -> str:
    """An error in scientific notation: '2.9e-03'."""
    return "—" if missing(x) else f"{x:.1e}"


def ms(est: Estimate | None, digits: int = 3) -> str:
    """'4.753 ms' or '4.753 ms [4.71, 4.80]' (the interval when the record has trials)."""
    return "—" if est is None else est.format(digits, "ms")


def times(est: Estimate | None, digits: int = 2) -> str:
    """A ratio: '2.59×' or '2.59× [2.41, 2.80]'."""
    if est is None:
        return "—"
    text = f"{num(est.median, digits)}×"
    if est.low is not None and est.high is not None:
        text += f" [{num(est.low, digits)}, {num(est.high, digits)}]"
    return text


def count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def listing(items) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = [str(i) for i in items]
    if len(items) < 2:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def md_table(df: pd.DataFrame) -> str:
    """A markdown table, every cell as given (the facts format their numbers)."""
    if df.empty:
        return "_(no rows)_\n"
    return df.astype(str).to_markdown(index=False, disable_numparse=True) + "\n"


def blocks(*parts: str) -> str:
    """Markdown blocks separated by one blank line, ending in one newline; empty parts dropped."""
    return "\n\n".join(p.strip("\n") for p in parts if p and p.strip("\n")) + "\n"


def details(summary: str, body: str) -> str:
    """A `<details>` fold (long lists and tables a reader opens on demand)."""
    return f"<details><summary>{summary}</summary>\n\n{body.strip()}\n\n</details>"


def table_link(device: str, name: str) -> str:
    return f"{RESULTS_FROM_ANSWERS}/{device}/tables/{name}"


def figure_link(device: str, name: str) -> str:
    return f"{RESULTS_FROM_ANSWERS}/{device}/figures/{name}"


def source_line(records: list[dict], device: str) -> str:
    """The closing line of a section: which records, from which device and commits."""
    names = sorted({r["provenance"].get("device_name", device) for r in records})
    commits = sorted({(r["provenance"].get("git_commit") or "")[:7] for r in records} - {""})
    where = ", ".join(names) + (f", commit {', '.join(f'`{c}`' for c in commits)}" if commits else "")
    return f"_Source: {count(len(records), 'record')} in `results/{device}/{KIND}/`, {where}._"


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_csv(df: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)
