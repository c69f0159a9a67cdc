"""Figures of the memory report: one active-memory timeline per cell and the fp32-against-bf16
panel of peaks and end-of-forward memory. Every figure the workflow expects is written, a short
note in place of a plot where the records hold nothing to draw.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lmperf.kinds.memory import facts as F  # noqa: E402

MIB_PER_GIB = 1024.0
PHASE_COLOURS = {
    "forward": "tab:blue",
    "backward": "tab:orange",
    "optimizer_step": "tab:green",
    "zero_grad": "tab:purple",
}
PRECISION_COLOURS = {"fp32": "tab:blue", "bf16": "tab:orange"}


def timeline_name(cell: dict) -> str:
    return f"memory_timeline_{cell['model']}_ctx{cell['context_length']}_{cell['precision']}_{cell['mode']}.png"


def save(fig, path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def placeholder(path, message: str) -> None:
    """A figure that says why there is nothing to draw."""
    fig, ax = plt.subplots(figsize=(4.2, 2.4))
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    ax.set_axis_off()
    save(fig, path)


def _shade_phases(ax, marks: list[dict], last_event: int) -> None:
    if marks and marks[-1]["phase"] != "end":  # a step cut short (out of memory): shade to the last event
        marks = [*marks, {"phase": "end", "event": last_event}]
    for k, (mark, nxt) in enumerate(zip(marks, marks[1:])):
        ax.axvspan(mark["event"], nxt["event"], color=PHASE_COLOURS.get(mark["phase"], "grey"), alpha=0.12, lw=0)
        ax.text(  # staggered so that the labels of short phases do not overlap
            (mark["event"] + nxt["event"]) / 2,
            1.0 + 0.07 * (k % 2),
            mark["phase"].replace("_", " "),
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=7,
        )


def timeline_figure(record: dict | None, path, title: str, missing: str) -> None:
    """Active (and reserved) memory over the recorded step's allocator events, phases shaded."""
    t = (record or {}).get("metrics", {}).get("timeline") or {}
    if not t.get("event"):
        placeholder(path, f"{title}\n{missing}")
        return
    m = record["metrics"]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    _shade_phases(ax, list(m.get("phase_marks") or []), t["event"][-1])
    ax.plot(t["event"], [v / MIB_PER_GIB for v in t["active_mib"]], lw=1, color="black", label="active")
    ax.plot(t["event"], [v / MIB_PER_GIB for v in t["reserved_mib"]], lw=0.8, ls="--", color="grey", label="reserved")
    if m.get("peak_event") is not None and m.get("replay_peak_active_mib") is not None:
        peak = m["replay_peak_active_mib"] / MIB_PER_GIB
        ax.plot([m["peak_event"]], [peak], "o", color="red", ms=4, label=f"peak {peak:.2f} GiB")
    for k, o in enumerate(m.get("oom_events") or []):
        ax.axvline(o["event"], color="red", lw=1, ls=":", label="out of memory" if k == 0 else None)
    ax.set_xlabel("allocator event")
    ax.set_ylabel("memory (GiB)")
    ax.set_title(title, fontsize=9, pad=22)
    ax.legend(fontsize=7, loc="best")
    save(fig, path)


PANELS = (
    ("inference", "peak", "forward only: peak"),
    ("training", "peak", "full step: peak"),
    ("training", "forward_end", "full step: end of forward"),
)


def _value(record: dict | None, what: str) -> float | None:
    if record is None or record["status"] != "ok":
        return None
    if what == "peak":
        return record["metrics"].get("peak_allocated_mib")
    forward = F.phases(record).get("forward")
    return forward["end_active_mib"] if forward else None


def peaks_figure(records: list[dict], path, title: str, missing: str) -> None:
    """fp32 against bf16 per context: forward-only peak, full-step peak, end-of-forward memory."""
    cells = F.lookup(F.measured(records))
    if not cells:
        placeholder(path, missing)
        return
    contexts = sorted({c for c, _, _ in cells})
    precisions = [p for p in F.PRECISIONS if any(k[1] == p for k in cells)]
    panels = [p for p in PANELS if any(k[2] == p[0] for k in cells)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    width = 0.8 / len(precisions)
    for ax, (mode, what, label) in zip(axes[0], panels):
        for k, precision in enumerate(precisions):
            xs = [i + (k - (len(precisions) - 1) / 2) * width for i in range(len(contexts))]
            recs = [cells.get((c, precision, mode)) for c in contexts]
            values = [_value(r, what) for r in recs]
            drawn = [(x, v / MIB_PER_GIB) for x, v in zip(xs, values) if v is not None]
            if drawn:
                ax.bar(*zip(*drawn), width=width, color=PRECISION_COLOURS[precision], label=precision)
            for x, r in zip(xs, recs):
                if r is not None and r["status"] != "ok":
                    ax.text(x, 0, r["status"].upper(), rotation=90, ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(contexts)), [str(c) for c in contexts])
        ax.set_xlabel("context length")
        ax.set_title(label, fontsize=9)
    axes[0][0].set_ylabel("memory (GiB)")
    drawn = {h.get_label(): h for ax in axes[0] for h in ax.get_legend_handles_labels()[0]}
    if drawn:  # one legend for the figure: the precisions drawn
        fig.legend(drawn.values(), drawn.keys(), loc="upper right", ncol=len(drawn), fontsize=8)
    fig.suptitle(title, fontsize=10, x=0.02, ha="left")
    save(fig, path)
