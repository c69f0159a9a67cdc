"""The flash benchmark's two figures, one panel per precision and head dimension: the speed-up of each
implementation over plain attention, and forward+backward time, against sequence length. Error bars
where the records have intervals; the legend lists what is drawn."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from lmperf.kinds.flash.frames import PRECISION_ORDER  # noqa: E402

COLORS = {"plain": "C0", "flash_triton": "C3", "sdpa": "C2"}
ORDER = {"plain": 0, "flash_triton": 1}


def _implementations(sub: pd.DataFrame) -> list[str]:
    """The baseline, ours, then the others as found."""
    return sorted(dict.fromkeys(sub.implementation), key=lambda i: ORDER.get(i, 2))


PLAIN_NUMBERS = FuncFormatter(lambda y, _: f"{y:g}")
TWOS_AND_FIVES = FuncFormatter(lambda y, _: f"{y:g}" if f"{y:.0e}"[0] in "25" else "")


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=(0, 0.04, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def no_data(path: Path, message: str) -> None:
    """A placeholder for a declared figure with nothing to draw."""
    fig, ax = plt.subplots(figsize=(4.2, 2.0))
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    ax.set_axis_off()
    _save(fig, path)


def _grid(df: pd.DataFrame, title: str):
    precisions = sorted(df.precision.unique(), key=lambda p: PRECISION_ORDER.get(p, 9))
    dims = sorted(df.head_dim.unique())
    fig, axes = plt.subplots(
        len(precisions), len(dims), squeeze=False, sharex=True, figsize=(3.6 * len(dims), 2.9 * len(precisions))
    )
    fig.suptitle(title)
    for i, p in enumerate(precisions):
        for j, d in enumerate(dims):
            ax = axes[i][j]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(PLAIN_NUMBERS)
            ax.set_title(f"{p}, d = {d}", fontsize=8)
            if i == len(precisions) - 1:
                ax.set_xlabel("sequence length N")
            yield ax, df[(df.precision == p) & (df.head_dim == d)], j == 0


def _label_ticks(ax) -> None:
    """Plain numbers on the log axis: the decades, and 2 and 5 of each where it spans under two decades."""
    low, high = ax.get_ylim()
    ax.yaxis.set_minor_formatter(TWOS_AND_FIVES if high / low < 100 else NullFormatter())
    ax.tick_params(axis="y", which="minor", labelsize=6)


def _errorbar(ax, x, y, low, high, **style):
    """A line with error bars where both ends are known."""
    known = low.notna() & high.notna()
    yerr = [(y - low).where(known, 0.0), (high - y).where(known, 0.0)] if known.any() else None
    return ax.errorbar(x, y, yerr=yerr, capsize=2 if yerr is not None else 0, ms=3, **style)


def _legend(fig, axes_list) -> None:
    labels = {}
    for ax in axes_list:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            labels.setdefault(label, handle)
    order = sorted(labels, key=lambda label: "out of memory" in label)  # the lines first
    if order:
        fig.legend([labels[k] for k in order], order, loc="lower center", ncol=len(order), fontsize=7)


def speedup_figure(df: pd.DataFrame, path: Path) -> None:
    """Each implementation's speed-up over plain (plain's time / its time), fwd+bwd and forward alone."""
    axes = []
    fig = None
    for ax, sub, first in _grid(df, "Speed-up over plain attention (plain's time / the implementation's)"):
        fig, plain = ax.figure, sub[sub.implementation == "plain"].set_index("sequence_length")
        for impl in [i for i in _implementations(sub) if i != "plain"]:
            mine = sub[(sub.implementation == impl) & (sub.status == "ok")].set_index("sequence_length")
            for pass_, style, word in (("forward_backward", "o-", "fwd+bwd"), ("forward", "--", "fwd")):
                t, b = mine[f"{pass_}_ms"], plain[f"{pass_}_ms"].reindex(mine.index)
                ok = t.notna() & b.notna()
                if not ok.any():
                    continue
                lo = plain[f"{pass_}_ms_low"].reindex(mine.index) / mine[f"{pass_}_ms_high"]
                hi = plain[f"{pass_}_ms_high"].reindex(mine.index) / mine[f"{pass_}_ms_low"]
                x = pd.Series(mine.index[ok], index=mine.index[ok])
                _errorbar(
                    ax, x, (b / t)[ok], lo[ok], hi[ok], fmt=style, color=COLORS.get(impl, "C4"), label=f"{impl} {word}"
                )
        oom = plain[plain.status == "oom"].index
        if len(oom):
            ax.axvspan(oom.min() / 1.3, sub.sequence_length.max() * 1.3, color="0.9", label="plain out of memory")
        ax.axhline(1, color="0.5", lw=0.8)
        _label_ticks(ax)
        if first:
            ax.set_ylabel("speed-up (×)")
        axes.append(ax)
    _legend(fig, axes)
    _save(fig, path)


def time_figure(df: pd.DataFrame, path: Path) -> None:
    """Forward+backward time of each implementation; a cross above the lines where it ran out of memory."""
    axes = []
    fig = None
    for ax, sub, first in _grid(df, "Forward+backward time against sequence length"):
        fig = ax.figure
        top = sub.forward_backward_ms.max()
        for impl in _implementations(sub):
            mine = sub[(sub.implementation == impl) & (sub.status == "ok")].dropna(subset=["forward_backward_ms"])
            color = COLORS.get(impl, "C4")
            if not mine.empty:
                y, lo, hi = mine.forward_backward_ms, mine.forward_backward_ms_low, mine.forward_backward_ms_high
                _errorbar(ax, mine.sequence_length, y, lo, hi, fmt="o-", color=color, label=impl)
            oom = sub[(sub.implementation == impl) & (sub.status == "oom")]
            if not oom.empty and pd.notna(top):
                ax.plot(oom.sequence_length, [top * 2] * len(oom), "x", color=color, label=f"{impl} out of memory")
        _label_ticks(ax)
        if first:
            ax.set_ylabel("forward+backward (ms)")
        axes.append(ax)
    _legend(fig, axes)
    _save(fig, path)


def figures(df: pd.DataFrame, speedup_path: Path, time_path: Path) -> None:
    """Both figures, or placeholders saying why there is nothing to draw."""
    timed = df[(df.status == "ok")] if not df.empty else df
    if timed.empty:
        for path in (speedup_path, time_path):
            no_data(path, "no benchmark timings on this device")
        return
    speedup_figure(df, speedup_path)
    time_figure(df, time_path)
