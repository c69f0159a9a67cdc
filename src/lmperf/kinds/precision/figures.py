"""The precision report's figure: each part of layer norm's error per dtype, at the largest mean."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lmperf.kinds.precision import facts as F  # noqa: E402
from lmperf.kinds.precision.tables import LN_LABELS  # noqa: E402

LAYER_NORM = "figures/precision_layer_norm.png"
CAP = 1e3  # bars of an overflowed (inf) entry are drawn to here, hatched


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def layer_norm(record: dict | None, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 3.6))
    if record is None:
        ax.text(0.5, 0.5, "no layer-norm probe on this device", ha="center", va="center")
        ax.set_axis_off()
        _save(fig, path)
        return
    results = record["metrics"]["results"]
    top = max(r["mean"] for r in results)
    rows = [r for r in results if r["mean"] == top]
    keys = list(F.ERROR_COLUMNS)
    width = 0.8 / len(rows)
    for i, r in enumerate(rows):
        values = [r.get(k) for k in keys]
        shown = [CAP if F.nonfinite(v) else max(min(v, CAP), 1e-8) for v in values]
        xs = [j + (i - (len(rows) - 1) / 2) * width for j in range(len(keys))]
        bars = ax.bar(xs, shown, width=width, label=r["dtype"])
        for bar, v in zip(bars, values):
            if F.nonfinite(v):
                bar.set_hatch("//")
                ax.text(bar.get_x() + bar.get_width() / 2, CAP, "inf", ha="center", va="bottom", fontsize=6)
    ax.set_yscale("log")
    ax.set_xticks(range(len(keys)), [LN_LABELS[k] for k in keys], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("error (σ units; variance relative)")
    ax.set_title(f"Layer norm's parts: error per dtype, activations of mean {top:g}", fontsize=9)
    ax.legend(fontsize=7)
    _save(fig, path)
