"""Figures of the attention report: time and kept memory against N, one panel per head dimension.

Each returns its legend's labels: only what has a point on the figure. A figure with nothing to
draw is still written, saying so.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from lmperf.core.units import BYTES_PER_ELEMENT, MIB
from lmperf.kinds.attention import memory_model as memory
from lmperf.report.common import empty_figure, figure, save

TIME_TITLE = "Time per pass against sequence length"
MEMORY_TITLE = "Memory the forward keeps for backward against sequence length"
# (colour, marker, size): hollow markers of different shapes and sizes keep implementations that keep
# the same memory (flash and sdpa) visible on top of each other; out of memory (_draw adds it): x for plain, + else
STYLES = {"plain": ("C0", "o", 5), "compiled": ("C1", "s", 6), "sdpa": ("C2", "^", 5), "flash": ("C3", "D", 8)}


def _draw(df: pd.DataFrame, impls: list[str], path: Path, title: str, ylabel: str, panel) -> list[str]:
    """One log-log panel per head dimension drawn by ``panel(ax, d, impl, sub, style)`` (STYLES' and the
    out-of-memory mark); one legend right of the last panel (it hides no point), each label once."""
    ds = sorted({int(d) for d in df.head_dim})
    fig, axes = figure(1, len(ds), sharey=True, figsize=(3.6 * len(ds), 3.4))
    for ax, d in zip(axes[0], ds):
        ax.set(yscale="log", title=f"d = {d}", xlabel="sequence length N")
        ax.set_xscale("log", base=2)
        for i, impl in enumerate(impls):
            style = (*STYLES.get(impl, (f"C{4 + i % 6}", "v", 5)), "x" if impl == "plain" else "+")
            panel(ax, d, impl, df[(df.implementation == impl) & (df.head_dim == d)], style)
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title)
    # each label once, where first drawn (every handle of a label has one style)
    handles = dict((label, h) for ax in axes[0] for h, label in zip(*ax.get_legend_handles_labels()))
    if handles:
        axes[0][-1].legend(handles.values(), handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1))
    save(fig, path, bbox_inches="tight")
    return list(handles)


def time_figure(df: pd.DataFrame, impls: list[str], path: Path) -> list[str]:
    """Forward and backward time per pass against N, with the trials' intervals where there are some."""
    if df.forward_ms.dropna().empty:
        empty_figure(path, "no timed attention cells")
        return []
    top = 2 * max(df.forward_ms.max(), df.backward_ms.max())

    def panel(ax, d, impl, sub, style):
        color, marker, _, oom_mark = style
        for phase, line in (("forward", "-"), ("backward", "--")):
            ran = sub.dropna(subset=[f"{phase}_ms"])
            y, low, high = (ran[f"{phase}_ms{x}"] for x in ("", "_low", "_high"))
            label = f"{impl} {phase}" if len(ran) else None
            style = dict(fmt=line, marker=marker, ms=3, color=color, capsize=2, label=label)
            ax.errorbar(ran.sequence_length, y, [y - low.fillna(y), high.fillna(y) - y], **style)
        oom = sub[(sub.status == "oom") & sub.backward_ms.isna()]  # in the forward or, after it, the backward
        label = f"{impl}: out of memory (drawn at the top)"
        ax.plot(oom.sequence_length, [top] * len(oom), oom_mark, color=color, ms=8, label=label if len(oom) else None)

    return _draw(df, impls, path, TIME_TITLE, "ms per pass", panel)


def memory_figure(df: pd.DataFrame, impls: list[str], path: Path) -> list[str]:
    """What the forward keeps for backward against N, measured and predicted (memory_model), with the card's size."""
    if df.kept_mib.dropna().empty:
        empty_figure(path, "no attention memory measurements")
        return []
    lengths, total = sorted({int(n) for n in df.sequence_length}), df.device_total_memory_mib.dropna()
    lines = [(memory.plain_accounting, "-", "plain, predicted")]
    if df.implementation[df.kept_mib.notna()].isin(memory.FUSED_IMPLEMENTATIONS).any():
        lines.append((memory.fused_accounting, ":", "fused, predicted"))

    def panel(ax, d, impl, sub, style):
        color, marker, size, oom_mark = style
        if impl == impls[0]:
            r = df[df.head_dim == d].iloc[0]
            shapes = [memory.Shape(int(r.batch_size), n, d, BYTES_PER_ELEMENT[r.precision]) for n in lengths]
            for account, line, label in lines:
                predicted = [account(s).retained_bytes / MIB for s in shapes]
                ax.plot(lengths, predicted, line, color="grey", lw=1, label=label)
        kept, oom = sub.dropna(subset=["kept_mib"]), sub[(sub.status == "oom") & sub.kept_mib.isna()]
        label = f"{impl}, measured" if len(kept) else None
        ax.plot(kept.sequence_length, kept.kept_mib, marker, ms=size, mfc="none", color=color, ls="none", label=label)
        label = f"{impl}: out of memory (at plain's prediction)" if len(oom) else None  # before the forward finished
        ax.plot(oom.sequence_length, oom.plain_predicted_retained_mib, oom_mark, ms=9, color=color, label=label)
        if impl == impls[-1] and not total.empty:
            ax.axhline(total.iloc[0], color="red", lw=0.8, label="card's total memory")
            ax.set_ylim(top=max(ax.get_ylim()[1], 2 * total.iloc[0]))

    return _draw(df, impls, path, MEMORY_TITLE, "MiB kept by the forward for backward", panel)
