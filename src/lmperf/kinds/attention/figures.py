"""Figures of the attention report: time and kept memory against N, compiled over plain.

Each figure function returns the legend labels it drew; a label is added only for something with
at least one point on the figure, so the legend lists only what is drawn. A figure with nothing
to draw still gets written, saying so.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from lmperf.core.units import BYTES_PER_ELEMENT, MIB  # noqa: E402
from lmperf.kinds.attention import memory_model as memory  # noqa: E402

# the titles, which the sections use as the images' alt text
TIME_TITLE = "Time per pass against sequence length"
MEMORY_TITLE = "Memory the forward keeps for backward against sequence length"
COMPILE_TITLE = "torch.compile over plain attention"
COLORS = {"plain": "C0", "compiled": "C1", "sdpa": "C2", "flash": "C3"}
# hollow markers of different shapes and sizes: implementations that keep the same memory
# (flash and sdpa) stay visible on top of each other
MARKERS = {"plain": ("o", 5), "compiled": ("s", 6), "flash": ("D", 8), "sdpa": ("^", 5)}


def _style(impl: str, i: int) -> tuple[str, str, int]:
    marker, size = MARKERS.get(impl, ("v", 5))
    return COLORS.get(impl, f"C{4 + i % 6}"), marker, size


def _subplots(ncols: int):
    return plt.subplots(1, max(1, ncols), squeeze=False, sharey=True, figsize=(3.6 * max(1, ncols), 3.4))


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend sits outside the panels
    plt.close(fig)


def empty_figure(path: Path, message: str) -> list[str]:
    fig, axes = _subplots(1)
    axes[0][0].text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    axes[0][0].set_axis_off()
    _save(fig, path)
    return []


class Legend:
    """Handles and labels of what was drawn, each label once, for one legend on the figure."""

    def __init__(self):
        self.items: dict[str, object] = {}

    def add(self, handle, label: str) -> None:
        self.items.setdefault(label, handle)

    def draw(self, ax) -> list[str]:
        if self.items:  # outside the panels, right of the last one, so it hides no point
            ax.legend(
                list(self.items.values()), list(self.items), fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1)
            )
        return list(self.items)


def _errorbar(ax, x, est_col: str, sub: pd.DataFrame, **kwargs):
    """A line through the medians with the intervals as error bars where the records have them."""
    y = sub[est_col].map(lambda e: e.median)
    low = sub[est_col].map(lambda e: e.median - e.low if e.low is not None else 0.0)
    high = sub[est_col].map(lambda e: e.high - e.median if e.high is not None else 0.0)
    yerr = [low, high] if (low.any() or high.any()) else None
    return ax.errorbar(x, y, yerr=yerr, capsize=2, **kwargs)


def time_figure(df: pd.DataFrame, impls: list[str], path: Path) -> list[str]:
    """Forward and backward time per pass against N, one panel per head dimension."""
    timed = df.dropna(subset=["forward_ms"])
    if timed.empty:
        return empty_figure(path, "no timed attention cells")
    dims = sorted(int(d) for d in df.head_dim.unique())
    top = max(timed.forward_ms.max(), df.backward_ms.max(skipna=True)) * 2
    fig, axes = _subplots(len(dims))
    legend = Legend()
    for ax, d in zip(axes[0], dims):
        for i, impl in enumerate(impls):
            color, marker, size = _style(impl, i)
            sub = df[(df.implementation == impl) & (df.head_dim == d)]
            for phase, line in (("forward", "-"), ("backward", "--")):
                ran = sub[sub[f"{phase}_est"].notna()]
                if not ran.empty:
                    h = _errorbar(
                        ax, ran.sequence_length, f"{phase}_est", ran, fmt=line, marker=marker, ms=3, color=color
                    )
                    legend.add(h, f"{impl} {phase}")
            oom = sub[(sub.status == "oom") & sub.forward_est.isna()]
            if not oom.empty:
                mark = "x" if impl == "plain" else "+"  # x and + on one spot stay visible
                (h,) = ax.plot(oom.sequence_length, [top] * len(oom), mark, color=color, ms=8)
                legend.add(h, f"{impl}: out of memory (drawn at the top)")
        ax.set(xscale="log", yscale="log", title=f"d = {d}", xlabel="sequence length N")
        ax.set_xscale("log", base=2)
    axes[0][0].set_ylabel("ms per pass")
    fig.suptitle(TIME_TITLE)
    labels = legend.draw(axes[0][-1])
    _save(fig, path)
    return labels


def _predicted_kept(df: pd.DataFrame, d: int, lengths: list[int], fused: bool) -> list[float]:
    row = df[df.head_dim == d].iloc[0]
    shapes = [memory.Shape(int(row.batch_size), n, d, BYTES_PER_ELEMENT[row.precision]) for n in lengths]
    account = memory.fused_accounting if fused else memory.plain_accounting
    return [account(s).retained_bytes / MIB for s in shapes]


def _memory_panel(ax, df: pd.DataFrame, impls: list[str], d: int, legend: Legend) -> None:
    lengths = sorted(int(n) for n in df.sequence_length.unique())
    (h,) = ax.plot(lengths, _predicted_kept(df, d, lengths, False), "-", color="grey", lw=1)
    legend.add(h, "plain, predicted")
    if any(i in memory.FUSED_IMPLEMENTATIONS for i in df.implementation[df.kept_mib.notna()]):
        (h,) = ax.plot(lengths, _predicted_kept(df, d, lengths, True), ":", color="grey", lw=1)
        legend.add(h, "fused, predicted")
    for i, impl in enumerate(impls):
        color, marker, size = _style(impl, i)
        sub = df[(df.implementation == impl) & (df.head_dim == d)]
        kept = sub.dropna(subset=["kept_mib"])
        if not kept.empty:
            (h,) = ax.plot(kept.sequence_length, kept.kept_mib, marker, ms=size, mfc="none", color=color, ls="none")
            legend.add(h, f"{impl}, measured")
        # out of memory before the forward finished: marked at plain attention's prediction
        oom = sub[(sub.status == "oom") & sub.kept_mib.isna()]
        if not oom.empty:
            mark = "x" if impl == "plain" else "+"
            (h,) = ax.plot(oom.sequence_length, oom.plain_predicted_retained_mib, mark, ms=9, color=color)
            legend.add(h, f"{impl}: out of memory (at plain's prediction)")


def memory_figure(df: pd.DataFrame, impls: list[str], path: Path) -> list[str]:
    """What the forward keeps for backward against N, measured and predicted, one panel per head dim."""
    if df.empty or df.kept_mib.dropna().empty:
        return empty_figure(path, "no attention memory measurements")
    dims = sorted(int(d) for d in df.head_dim.unique())
    fig, axes = _subplots(len(dims))
    legend = Legend()
    total = df.device_total_memory_mib.dropna()
    for ax, d in zip(axes[0], dims):
        _memory_panel(ax, df, impls, d, legend)
        ax.set(xscale="log", yscale="log", title=f"d = {d}", xlabel="sequence length N")
        ax.set_xscale("log", base=2)
        if not total.empty:
            h = ax.axhline(total.iloc[0], color="red", lw=0.8)
            legend.add(h, "card's total memory")
            low, high = ax.get_ylim()
            ax.set_ylim(low, max(high, total.iloc[0] * 2))
    axes[0][0].set_ylabel("MiB kept by the forward for backward")
    fig.suptitle(MEMORY_TITLE)
    labels = legend.draw(axes[0][-1])
    _save(fig, path)
    return labels


def compile_figure(table: pd.DataFrame, path: Path) -> list[str]:
    """Plain time / compiled time against N, forward and backward, one line per head dimension."""
    if table.empty or table[["forward_speedup", "backward_speedup"]].dropna(how="all").empty:
        return empty_figure(path, "no plain/compiled pairs")
    fig, axes = _subplots(1)
    ax = axes[0][0]
    legend = Legend()
    for i, d in enumerate(sorted(table.head_dim.unique())):
        for phase, line, marker in (("forward", "-", "o"), ("backward", "--", "s")):
            sub = table[table.head_dim == d].dropna(subset=[f"{phase}_speedup"])
            if sub.empty:
                continue
            y = sub[f"{phase}_speedup"]
            low = (y - sub[f"{phase}_speedup_low"]).fillna(0.0)
            high = (sub[f"{phase}_speedup_high"] - y).fillna(0.0)
            yerr = [low, high] if (low.any() or high.any()) else None
            h = ax.errorbar(sub.sequence_length, y, yerr=yerr, fmt=line, marker=marker, ms=3, color=f"C{i}", capsize=2)
            legend.add(h, f"d = {d} {phase}")
    h = ax.axhline(1.0, color="grey", lw=0.8)
    legend.add(h, "as fast as plain")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="sequence length N", ylabel="plain time / compiled time", title=COMPILE_TITLE)
    labels = legend.draw(ax)
    _save(fig, path)
    return labels
