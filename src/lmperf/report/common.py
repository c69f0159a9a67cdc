"""Shared report helpers: the report CLI, numbers for prose, markdown, figures."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from lmperf.core.record import load_record  # noqa: E402
from lmperf.core.sizes import SIZES, config_from_name, parameter_count  # noqa: E402
from lmperf.report.devices import commits_words  # noqa: E402


def report_main(argv, doc: str, write) -> int:
    """A kind's report CLI: ``write(records, grid, device, out)`` with the records (sorted by path),
    the kind's config slice and ``--out`` (results/<device>: tables/, figures/, sections/ go under it)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--device", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--grid", default="{}", help="the kind's config slice as JSON")
    p.add_argument("--records", nargs="*", default=[])
    args = p.parse_args(argv)
    write([load_record(path) for path in sorted(args.records)], json.loads(args.grid), args.device, args.out)
    return 0


def model_order() -> list[str]:
    """Registered sizes from smallest to largest parameter count."""
    return sorted(SIZES, key=lambda name: parameter_count(config_from_name(name)))


def fmt(x, digits: int = 2) -> str:
    """A number for prose: 3 significant-ish digits, '—' for missing."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if isinstance(x, str):
        return x
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.{digits}f}"


def num(x, digits: int | None = None) -> str:
    """Thousands separated, by default 0 decimals from 100, 1 from 10, else 2; '—' for none."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    digits = (0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2) if digits is None else digits
    return f"{x:,.{digits}f}"


def pct(x, digits: int = 1) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}%"


def md_table(df: pd.DataFrame, as_written: bool = False) -> str:
    """A markdown table, floats through fmt(); ``as_written`` stops the writer re-reading number-like
    cells (it prints them to 6 significant digits)."""
    if df.empty:
        return "_(no records)_\n"
    shown = df.copy()
    for col in shown.columns:
        shown[col] = [fmt(v) if isinstance(v, float) else v for v in shown[col]]
    return shown.to_markdown(index=False, disable_numparse=as_written) + "\n"


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


def link(device: str, path: str) -> str:
    """A file under results/<device>/ as linked from report/<device>/answers.md."""
    return f"../../results/{device}/{path}"


def summary(text: str) -> str:
    """The question's answer in one line, first in a fragment: the front page's (the device report drops it)."""
    return f"<!-- summary: {text} -->"


def write_text(path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_csv(df: pd.DataFrame, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)


def figure(nrows: int = 1, ncols: int = 1, **kwargs):
    kwargs.setdefault("figsize", (4.2 * ncols, 3.4 * nrows))
    return plt.subplots(nrows, ncols, squeeze=False, **kwargs)


def save(fig, path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def empty_figure(path, message: str) -> None:
    """A placeholder image for an output whose records hold nothing to draw."""
    fig, axes = figure()
    axes[0][0].text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    axes[0][0].set_axis_off()
    save(fig, path)


def source_line(records: list[dict], device: str, folder: str) -> str:
    """A section's closing line: the records, their folder, device(s) and commit(s)."""
    return f"_Source: {count(len(records), 'record')} in `results/{device}/{folder}/`, {device_line(records)}._"


def device_line(records: list[dict]) -> str:
    """'NVIDIA H100 80GB HBM3 (`h100`), commit `0aa86bc`': the records' device(s) and commits."""
    names = sorted({(r["provenance"]["device_name"], r["provenance"]["device_slug"]) for r in records})
    line = ", ".join(f"{name} (`{slug}`)" for name, slug in names) or "no records"
    return line + (commits_words(records) if records else "")
