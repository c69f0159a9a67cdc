"""Writing helpers of the flash report: numbers, intervals, markdown, links. No torch."""

from __future__ import annotations

import pandas as pd

from lmperf.core.stats import Estimate
from lmperf.report.common import blocks, count, link, listing, source_line, summary  # noqa: F401 - the flash report's names
from lmperf.report.common import fmt as num

PRECISION_ORDER = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3}


def times(est: Estimate | None, digits: int = 2) -> str:
    """A ratio: '2.59×', with its interval where the records have trials: '2.59× [2.41, 2.80]'."""
    if est is None:
        return "—"
    return f"{num(est.median, digits)}×" + (
        f" [{num(est.low, digits)}, {num(est.high, digits)}]" if est.low is not None else ""
    )


def span(values) -> str:
    values = sorted(values)
    return str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}"


def md_table(df: pd.DataFrame) -> str:
    return df.astype(str).to_markdown(index=False, disable_numparse=True) + "\n" if len(df) else "_(no rows)_\n"


def details(head: str, body: str) -> str:
    return f"<details><summary>{head}</summary>\n\n{body.strip()}\n\n</details>"


def source(records: list[dict], device: str) -> str:
    return source_line(records, device, "flash")


def why(records: list[dict]) -> str:
    """' (unsupported: no CUDA device)': what stopped the records that are not ok, or ''."""
    reasons = "; ".join(sorted({f"{r['status']}: {r['reason']}" for r in records if r["status"] != "ok"}))
    return f" ({reasons})" if reasons else ""
