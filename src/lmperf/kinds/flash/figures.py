"""The benchmark's figure: each implementation's speed-up over plain attention against sequence length,
one panel per precision and head dim; error bars where the records have intervals, grey where plain
runs out of memory."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd
from matplotlib.ticker import FuncFormatter

from lmperf.kinds.flash.render import PRECISION_ORDER
from lmperf.report import common

COLORS = {"flash": "C3", "sdpa": "C2"}


def figure(df: pd.DataFrame, path: Path) -> None:
    """Each implementation's speed-up over plain (plain's time / its time): fwd+bwd and forward alone, with
    error bars where both ends are known, in one log-log panel per (precision, head dim); a placeholder
    where there is nothing to draw."""
    if not len(df) or not (df.status == "ok").any():
        return common.empty_figure(path, "no benchmark timings on this device")
    precisions = sorted(df.precision.unique(), key=lambda p: PRECISION_ORDER.get(p, 9))
    dims = sorted(df.head_dim.unique())
    fig, axes = common.figure(len(precisions), len(dims), sharex=True, figsize=(3.6 * len(dims), 2.9 * len(precisions)))
    fig.suptitle("Speed-up over plain attention (plain's time / the implementation's)")
    for (i, precision), (j, d) in itertools.product(enumerate(precisions), enumerate(dims)):
        ax, sub = axes[i][j], df[(df.precision == precision) & (df.head_dim == d)]
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N" if i == len(precisions) - 1 else "")
        ax.set_ylabel("speed-up (×)" if j == 0 else "")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: f"{y:g}" if f"{y:.0e}"[0] in "25" else ""))
        ax.tick_params(axis="y", which="minor", labelsize=6)
        ax.set_title(f"{precision}, d = {d}", fontsize=8)
        plain = sub[sub.implementation == "plain"].set_index("sequence_length")
        for impl in sorted(set(sub.implementation) - {"plain"}, key=lambda x: x != "flash"):
            mine = sub[(sub.implementation == impl) & (sub.status == "ok")].set_index("sequence_length")
            for p, style, word in (("forward_backward", "o-", "fwd+bwd"), ("forward", "--", "fwd")):
                base = plain[[f"{p}_ms", f"{p}_ms_low", f"{p}_ms_high"]].reindex(mine.index)
                ok = mine[f"{p}_ms"].notna() & base[f"{p}_ms"].notna()
                if not ok.any():
                    continue
                b, m = base[ok], mine[ok]
                y = b[f"{p}_ms"] / m[f"{p}_ms"]
                low, high = b[f"{p}_ms_low"] / m[f"{p}_ms_high"], b[f"{p}_ms_high"] / m[f"{p}_ms_low"]
                known = low.notna() & high.notna()
                yerr = [(y - low).where(known, 0.0), (high - y).where(known, 0.0)] if known.any() else None
                color, label = COLORS.get(impl, "C4"), f"{impl} {word}"
                ax.errorbar(m.index, y, yerr=yerr, fmt=style, ms=3, capsize=2, color=color, label=label)
        oom = plain[plain.status == "oom"].index
        if len(oom):
            ax.axvspan(oom.min() / 1.3, sub.sequence_length.max() * 1.3, color="0.9", label="plain out of memory")
        ax.axhline(1, color="0.5", lw=0.8)
    labels = {label: h for ax in fig.axes for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(list(labels.values()), list(labels), loc="lower center", ncol=max(1, len(labels)), fontsize=7)
    common.save(fig, path, rect=(0, 0.04, 1, 0.96))  # room for the figure's legend and title
