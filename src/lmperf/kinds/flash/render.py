"""Writing helpers of the flash report: numbers, intervals, markdown, links. No torch."""

from __future__ import annotations

import math

import pandas as pd

from lmperf.core.stats import Estimate

PRECISION_ORDER = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3}


def num(x, digits: int = 2) -> str:
    """A number for prose or a table; '—' for missing."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.{digits}f}"


def times(est: Estimate | None, digits: int = 2) -> str:
    """A ratio: '2.59×', with its interval where the records have trials: '2.59× [2.41, 2.80]'."""
    if est is None:
        return "—"
    return f"{num(est.median, digits)}×" + (
        f" [{num(est.low, digits)}, {num(est.high, digits)}]" if est.low is not None else ""
    )


def count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def listing(items) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = [str(i) for i in items]
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def span(values) -> str:
    values = sorted(values)
    return str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}"


def md_table(df: pd.DataFrame) -> str:
    return df.astype(str).to_markdown(index=False, disable_numparse=True) + "\n" if len(df) else "_(no rows)_\n"


def blocks(*parts: str) -> str:
    """Markdown blocks separated by one blank line, ending in one newline; empty parts dropped."""
    return "\n\n".join(p.strip("\n") for p in parts if p and p.strip("\n")) + "\n"


def details(summary: str, body: str) -> str:
    return f"<details><summary>{summary}</summary>\n\n{body.strip()}\n\n</details>"


def link(device: str, path: str) -> str:
    """A file under results/<device>/ (``tables/x.csv``) as linked from report/<device>/answers.md."""
    return f"../../results/{device}/{path}"


def source(records: list[dict], device: str) -> str:
    """A section's closing line: which records, from which device and commits."""
    names = sorted({r["provenance"].get("device_name", device) for r in records})
    commits = sorted({(r["provenance"].get("git_commit") or "")[:7] for r in records} - {""})
    where = ", ".join(names) + (f", commit {', '.join(f'`{c}`' for c in commits)}" if commits else "")
    return f"_Source: {count(len(records), 'record')} in `results/{device}/flash/`, {where}._"


def why(records: list[dict]) -> str:
    """' (unsupported: no CUDA device)': what stopped the records that are not ok, or ''."""
    reasons = "; ".join(sorted({f"{r['status']}: {r['reason']}" for r in records if r["status"] != "ok"}))
    return f" ({reasons})" if reasons else ""
