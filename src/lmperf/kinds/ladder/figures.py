"""The ladder's figure: a waterfall of time per token, rung by rung, one per (model, context).

Bars of kept rungs float from the parent's time per token down to the rung's (the saving), from the
first rung that runs to the best; rungs that ran but were not built on are hatched; rungs that did not
run say why. Labels give each rung's MFU against the one yardstick the title names.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from lmperf.kinds.ladder.facts import Ladder, Yardstick  # noqa: E402
from lmperf.kinds.ladder.tables import STATUS_WORDS, pct  # noqa: E402

COLORS = {"end": "#457b9d", "saves": "#2a9d8f", "costs": "#e76f51", "not kept": "#bbbbbb"}
LEGEND = {
    "end": "first rung that runs; best rung",
    "saves": "kept: saves time over its parent",
    "costs": "kept: costs time over its parent",
    "not kept": "ran, not built on",
}


def figure_title(ladder: Ladder, head: Yardstick | None) -> str:
    labels = f"labels: MFU of {head.words}" if head else "no MFU in the records"
    return f"{ladder.model}, context {ladder.context_length}: time per token by rung ({labels})"


def _save(fig, path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def empty_figure(path, message: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    ax.set_axis_off()
    _save(fig, path)


def _bar(ax, x, low, high, kind, used, hatch=None) -> None:
    ax.bar(x, high - low, bottom=low, color=COLORS[kind], hatch=hatch, edgecolor="#666666" if hatch else None)
    used.add(kind)


def _label(ax, x, y, rung, head) -> None:
    if head and head.key in rung.mfu:
        ax.text(x, y, pct(rung.mfu[head.key], 0), ha="center", va="bottom", fontsize=7)


def waterfall(ladder: Ladder, head: Yardstick | None, path, drop_unsupported: bool = False) -> None:
    """``drop_unsupported``: leave out rungs that cannot run on this device (a CPU's CUDA-only rungs)."""
    if drop_unsupported:
        ladder = dataclasses.replace(ladder, rungs=tuple(r for r in ladder.rungs if r.status != "unsupported"))
    fig, ax = plt.subplots(figsize=(8.5, 4))
    steps = {s.rung: (s, True) for s in ladder.chain} | {s.rung: (s, False) for s in ladder.not_kept}
    used: set[str] = set()
    for i, rung in enumerate(ladder.rungs):
        if not rung.ok:
            ax.text(
                i,
                0.02,
                STATUS_WORDS.get(rung.status, rung.status),
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=8,
                rotation=90,
            )
            continue
        us = rung.us_per_token.median
        if ladder.start is not None and rung.name == ladder.start.name:
            _bar(ax, i, 0.0, us, "end", used)
            _label(ax, i, us, rung, head)
        elif rung.name in steps:
            step, kept = steps[rung.name]
            before = step.before_us.median
            kind = ("saves" if step.saved_us >= 0 else "costs") if kept else "not kept"
            _bar(ax, i, min(us, before), max(us, before), kind, used, None if kept else "//")
            _label(ax, i, max(us, before), rung, head)
        e = rung.us_per_token
        if e.low is not None:
            ax.errorbar(i, us, yerr=[[us - e.low], [e.high - us]], fmt="none", ecolor="#333333", capsize=2)
    names = [r.name for r in ladder.rungs]
    if ladder.best is not None:
        _bar(ax, len(names), 0.0, ladder.best.us_per_token.median, "end", used)
        _label(ax, len(names), ladder.best.us_per_token.median, ladder.best, head)
        names.append(f"best: {ladder.best.name}")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("µs per token (lower is faster)")
    ax.set_title(figure_title(ladder, head), fontsize=9)
    handles = [
        Patch(facecolor=COLORS[k], hatch="//" if k == "not kept" else None, label=LEGEND[k])
        for k in COLORS
        if k in used
    ]
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="best")
    _save(fig, path)
