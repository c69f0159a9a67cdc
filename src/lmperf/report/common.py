"""Shared report helpers: loading records, formatting numbers, markdown tables, figures."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from lmperf.core.record import load_record  # noqa: E402
from lmperf.core.sizes import SIZES, config_from_name, parameter_count  # noqa: E402
from lmperf.report.devices import commits_words  # noqa: E402


def load(paths) -> list[dict]:
    return [load_record(p) for p in sorted(map(str, paths))]


def model_order() -> list[str]:
    """Registered sizes from smallest to largest parameter count."""
    return sorted(SIZES, key=lambda name: parameter_count(config_from_name(name)))


def fmt(x, digits: int = 2) -> str:
    """A number for prose: 3 significant-ish digits, '—' for missing."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if isinstance(x, str):
        return x
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def span(lo, hi, unit: str = "×", digits: int = 2) -> str:
    """'1.11×–1.84×' for a range; '1.57×' where both ends print the same."""
    a, b = fmt(lo, digits), fmt(hi, digits)
    return f"{a}{unit}" if a == b else f"{a}{unit}–{b}{unit}"


def pct(x, digits: int = 1) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}%"


def md_table(df: pd.DataFrame, as_written: bool = False) -> str:
    """A markdown table; floats formatted with fmt(). The table writer re-reads cells that look like
    numbers and prints them to 6 significant digits; `as_written` keeps every cell as given, for
    tables whose cells carry more digits than that."""
    if df.empty:
        return "_(no records)_\n"
    shown = df.copy()
    for col in shown.columns:
        shown[col] = [fmt(v) if isinstance(v, float) else v for v in shown[col]]
    return shown.to_markdown(index=False, disable_numparse=as_written) + "\n"


def blocks(*parts: str) -> str:
    """Markdown blocks (a paragraph, a table, a list, a heading with its lines) separated by exactly one
    blank line and ending in one newline, whatever newlines each part starts or ends with (a table from
    md_table ends in one); empty parts are dropped. Sections compose with it so that no stray blank
    lines reach the report."""
    return "\n\n".join(p.strip("\n") for p in parts if p and p.strip("\n")) + "\n"


def write_text(path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def figure(nrows: int = 1, ncols: int = 1, **kwargs):
    kwargs.setdefault("figsize", (4.2 * ncols, 3.4 * nrows))
    return plt.subplots(nrows, ncols, squeeze=False, **kwargs)


def save(fig, path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def empty_figure(path, message: str) -> None:
    """A placeholder image for an output whose records hold nothing to draw."""
    fig, axes = figure()
    axes[0][0].text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    axes[0][0].set_axis_off()
    save(fig, path)


def device_line(records: list[dict], with_commits: bool = True) -> str:
    """'NVIDIA H100 80GB HBM3 (`h100`), commit `0aa86bc`' for the records' device(s) and the commits
    they were measured from (with counts where there are several)."""
    names = sorted({(r["provenance"]["device_name"], r["provenance"]["device_slug"]) for r in records})
    line = ", ".join(f"{name} (`{slug}`)" for name, slug in names) or "no records"
    return line + (commits_words(records) if with_commits and records else "")


def lengths_text(ns) -> str:
    """'N = 1024, 2048' for a list of sequence lengths."""
    return "N = " + ", ".join(map(str, ns))


def report_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every kind's report CLI takes; each adds its own outputs."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--records", nargs="+", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--sections-dir", required=True)
    parser.add_argument("--figures-dir", required=True)
    return parser


def write_csv(df: pd.DataFrame, path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)


def figures_link(device: str) -> str:
    """Figures as linked from a section (sections land in report/answers.md)."""
    return f"../results/{device}/figures"


def source_line(records: list[dict], device: str, kind: str) -> str:
    """The closing line of a section: which records, from which device."""
    return f"\n_Source: {len(records)} records in `results/{device}/{kind}/`, {device_line(records)}._\n"
