"""The ladder's figure: a waterfall of time per token, rung by rung, one per (model, context).

Bars of the rungs on the best rung's path (its parents as the records name them, kept or not) float from the
parent's time per token to the rung's; rungs that ran off that path are hatched; rungs that did not run say why.
Labels give each rung's MFU against the one yardstick the title names.
"""

from __future__ import annotations

from matplotlib.patches import Patch

from lmperf.kinds.ladder.facts import YARDSTICKS, Ladder
from lmperf.kinds.ladder.tables import STATUS_WORDS
from lmperf.report.common import figure, pct, save

COLORS = {"end": "#457b9d", "saves": "#2a9d8f", "costs": "#e76f51", "off path": "#bbbbbb"}
HATCHES = {"off path": "//"}
LEGEND = {
    "end": "first rung that runs; best rung",
    "saves": "on the best rung's path: saves time over its parent",
    "costs": "on the best rung's path: costs time over its parent",
    "off path": "ran, off that path",
}


def figure_title(ladder: Ladder, head: str | None) -> str:
    labels = f"labels: MFU of {YARDSTICKS[head]}" if head else "no MFU in the records"
    return f"{ladder.model}, context {ladder.context_length}: time per token by rung ({labels})"


def waterfall(ladder: Ladder, head: str | None, path, drop_unsupported: bool = False) -> None:
    """``drop_unsupported``: leave out rungs that cannot run on this device (a CPU's CUDA-only rungs)."""
    rungs = [r for r in ladder.rungs if not (drop_unsupported and r.status == "unsupported")]
    fig, axes = figure(figsize=(8.5, 4))
    ax = axes[0][0]
    steps = {s.rung: (s, True) for s in ladder.chain} | {s.rung: (s, False) for s in ladder.off_chain}
    used: set[str] = set()

    def bar(x, low, high, kind, rung):
        ax.bar(x, high - low, bottom=low, color=COLORS[kind], hatch=HATCHES.get(kind))
        used.add(kind)
        if head in rung.mfu:
            ax.text(x, high, pct(rung.mfu[head], 0), ha="center", va="bottom", fontsize=7)

    for i, rung in enumerate(rungs):
        if not rung.ok:
            words = STATUS_WORDS.get(rung.status, rung.status)
            ax.text(i, 0.02, words, transform=ax.get_xaxis_transform(), ha="center", fontsize=8, rotation=90)
            continue
        us = rung.us_per_token.median
        if rung is ladder.start:
            bar(i, 0.0, us, "end", rung)
        elif rung.name in steps:
            step, on_path = steps[rung.name]
            kind = ("saves" if step.saved_us >= 0 else "costs") if on_path else "off path"
            bar(i, min(us, step.before_us.median), max(us, step.before_us.median), kind, rung)
        e = rung.us_per_token
        if e.low is not None:
            ax.errorbar(i, us, yerr=[[us - e.low], [e.high - us]], fmt="none", ecolor="#333333", capsize=2)
    names = [r.name for r in rungs]
    if ladder.best is not None:
        bar(len(names), 0.0, ladder.best.us_per_token.median, "end", ladder.best)
        names.append(f"best: {ladder.best.name}")
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("µs per token (lower is faster)")
    ax.set_title(figure_title(ladder, head), fontsize=9)
    # in COLORS' order: a set's order changes from one process to the next, and the figure with it
    handles = [Patch(facecolor=COLORS[k], hatch=HATCHES.get(k), label=LEGEND[k]) for k in COLORS if k in used]
    if handles:
        ax.legend(handles=handles, fontsize=7, loc="best")
    save(fig, path)
