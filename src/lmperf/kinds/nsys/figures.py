"""The two figures of nsys_profile: kernel class shares per cell (d), and inside attention (e).

Legends list only what is drawn; a figure with nothing to draw says so. No torch here.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from lmperf.kinds.nsys.cells import ok  # noqa: E402
from lmperf.kinds.nsys.facts import attention_rows  # noqa: E402
from lmperf.kinds.nsys.text import Words  # noqa: E402

CLASS_SHARES = "figures/nsys_class_shares.png"
ATTENTION = "figures/nsys_attention.png"
FIGURES = (CLASS_SHARES, ATTENTION)
# one colour per kernel class (lmperf.profiling.kernels.CLASSES); classes the records add get grey
CLASS_COLORS = {
    "matmul": "tab:blue",
    "softmax": "tab:orange",
    "reduction": "tab:green",
    "elementwise": "tab:red",
    "memory": "tab:purple",
    "optimizer": "tab:brown",
    "other": "tab:gray",
}


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _empty(path: Path, message: str) -> None:
    fig, ax = plt.subplots(figsize=(4.2, 3.4))
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    ax.set_axis_off()
    _save(fig, path)


def _classes(columns: list[pd.Series]) -> list[str]:
    """The classes with a share above zero in some cell, in the records' order."""
    dicts = [s for col in columns for s in col if isinstance(s, dict)]
    order = list(dict.fromkeys(cls for s in dicts for cls in s))
    return [cls for cls in order if any(s.get(cls) for s in dicts)]


def class_shares(df: pd.DataFrame, w: Words, path: Path) -> None:
    """Stacked bars: each cell's inference forward and training step, kernel time by class."""
    cells = ok(df, "inference", precision=None)
    if cells.empty:
        _empty(path, "no profiled cells")
        return
    cells = cells.assign(
        **{c: None for c in ("inference_class_share", "train_class_share", "training_status") if c not in cells}
    )
    panels = [
        ("inference_class_share", "inference_status", "inference forward"),
        ("train_class_share", "training_status", "training step"),
    ]
    classes = _classes([cells[col] for col, _, _ in panels])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 0.3 * len(cells) + 1.8), squeeze=False)
    labels = [f"{r.model} ctx {r.context_length} {r.precision}" for r in cells.itertuples()]
    for ax, (col, status, title) in zip(axes[0], panels):
        left = [0.0] * len(cells)
        for cls in classes:
            values = [(s.get(cls) or 0.0) if isinstance(s, dict) else 0.0 for s in cells[col]]
            ax.barh(range(len(cells)), values, left=left, color=CLASS_COLORS.get(cls, "lightgray"), label=cls)
            left = [a + b for a, b in zip(left, values)]
        for y, (shares, said) in enumerate(zip(cells[col], cells[status])):
            if not isinstance(shares, dict):
                ax.text(0.01, y, "out of memory" if said == "oom" else "no record", va="center", fontsize=7)
        ax.set_title(f"{title}: share of {w.kernel} time")
        ax.set_xlim(0, 1)
        ax.set_yticks(range(len(cells)), labels, fontsize=7)
        ax.invert_yaxis()
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path)


def attention(df: pd.DataFrame, w: Words, path: Path) -> None:
    """Per cell: the two attention matmuls and the softmax (ms per forward), and softmax / matmuls
    in time and in FLOPs."""
    rows = attention_rows(df)
    if rows.empty:
        _empty(path, f"no attention {w.range}s profiled")
        return
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 0.45 * len(rows)), 7.0), squeeze=False)
    top, bottom = axes[0][0], axes[1][0]
    labels = [f"{r.model}\n{r.context_length}\n{r.precision}" for r in rows.itertuples()]
    xs = list(range(len(rows)))
    parts = [
        ("att_scores_matmul_ms", "QKᵀ matmul"),
        ("att_softmax_ms", "softmax"),
        ("att_final_matmul_ms", "PV matmul"),
    ]
    width = 0.8 / len(parts)
    for i, (col, name) in enumerate(parts):
        top.bar([x - 0.4 + (i + 0.5) * width for x in xs], rows[col].clip(lower=1e-6), width=width, label=name)
    top.set_yscale("log")
    top.set_ylabel(f"{w.kernel} ms per forward (all layers)")
    top.set_title("Inside self-attention: the softmax against the two matmuls")
    bottom.bar([x - 0.2 for x in xs], rows.softmax_over_matmul_time, width=0.4, label="time")
    bottom.bar([x + 0.2 for x in xs], rows.softmax_over_matmul_flops, width=0.4, label="FLOPs")
    bottom.set_yscale("log")
    bottom.set_ylabel("softmax / the two matmuls")
    for ax in (top, bottom):
        ax.set_xticks(xs, labels, fontsize=6)
        ax.legend(fontsize=7)
    _save(fig, path)


def draw(df: pd.DataFrame, w: Words, out: Path) -> None:
    class_shares(df, w, out / CLASS_SHARES)
    attention(df, w, out / ATTENTION)
