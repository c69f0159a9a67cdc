"""Figures of the end-to-end report, drawn from the facts: each with its intervals where the records
have them, a legend of only what is drawn, and a placeholder saying why when there is nothing to draw."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lmperf.core.stats import Estimate  # noqa: E402
from lmperf.kinds.e2e import facts as F  # noqa: E402

NAMES = ("phase_times", "warmup", "precision_speedup", "compile")


def path_of(name: str) -> str:
    """A figure's path relative to the report's ``--out``."""
    return f"figures/e2e_{name}.png"


def _axes(ncols: int = 1):
    fig, axes = plt.subplots(1, ncols, figsize=(4.2 * ncols, 3.4), squeeze=False)
    return fig, list(axes[0])


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def placeholder(path: Path, message: str) -> None:
    fig, (ax,) = _axes()
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True)
    ax.set_axis_off()
    _save(fig, path)


def _errorbar(ax, xs: list, values: list[Estimate | None], **kwargs) -> None:
    """Medians as a line, the 95% interval as error bars where there is one."""
    points = [(x, e) for x, e in zip(xs, values) if e is not None]
    if not points:
        return
    ys = [e.median for _, e in points]
    low = [e.median - (e.low if e.low is not None else e.median) for _, e in points]
    high = [(e.high if e.high is not None else e.median) - e.median for _, e in points]
    ax.errorbar([x for x, _ in points], ys, yerr=[low, high], marker="o", capsize=3, **kwargs)


def _sizes(ax, rows) -> dict[str, int]:
    """Each size's x position (smallest first), its name as the tick label."""
    sizes = list(dict.fromkeys(r.model for r in rows))
    ax.set_xticks(range(len(sizes)), sizes, rotation=45)
    return {m: i for i, m in enumerate(sizes)}


def _by_context(rows, value) -> dict[int, tuple[list[str], list]]:
    """{context: (sizes, values)} in the rows' order (smallest size first)."""
    out: dict[int, tuple[list[str], list]] = {}
    for r in rows:
        sizes, values = out.setdefault(r.context_length, ([], []))
        sizes.append(r.model)
        values.append(value(r))
    return out


def phase_times(t: F.TimingFacts, path: Path) -> None:
    ok = t.ok
    if not ok:
        placeholder(path, "no fp32 training step measured")
        return
    contexts = sorted({r.context_length for r in ok})
    fig, axes = _axes(len(contexts))
    for ax, ctx in zip(axes, contexts):
        rows = [r for r in ok if r.context_length == ctx]
        x = _sizes(ax, rows)
        for phase in F.STEP_PHASES:
            _errorbar(ax, [x[r.model] for r in rows], [r.times[phase] for r in rows], label=phase)
        ax.set_yscale("log")
        ax.set_title(f"context {ctx}")
        ax.set_xlabel("model")
    axes[0].set_ylabel(f"ms (fp32, mean, {t.warmup_steps} warm-up steps)")
    axes[0].legend(fontsize=8)
    _save(fig, path)


def warmup(w: F.WarmupFacts | None, path: Path) -> None:
    rows = [r for r in (w.rows if w else ()) if r.samples]
    if not rows:
        placeholder(path, "no warm-up sweep measured")
        return
    models = list(dict.fromkeys(r.model for r in rows))
    fig, axes = _axes(len(models))
    for ax, model in zip(axes, models):
        for r in sorted((r for r in rows if r.model == model), key=lambda r: r.warmup_steps):
            steps = range(1, len(r.samples) + 1)
            ax.plot(steps, r.samples, marker=".", label=f"{r.warmup_steps} warm-up")
        ax.set_yscale("log")
        ax.set_title(f"{model}, context {w.context_length}")
        ax.set_xlabel("measured step")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("forward (ms, fp32)")
    _save(fig, path)


def _speedups(rows, path: Path, ylabel: str, title: str) -> None:
    fig, (ax,) = _axes()
    x = _sizes(ax, rows)
    for ctx, (sizes, values) in sorted(_by_context(rows, lambda r: r.speedup("step")).items()):
        _errorbar(ax, [x[m] for m in sizes], values, label=f"context {ctx}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel(ylabel)
    ax.set_xlabel("model")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    _save(fig, path)


def precision_speedup(p: F.PrecisionFacts, path: Path) -> None:
    if not p.judged:
        placeholder(path, "no fp32 and bf16 training steps of one cell")
        return
    _speedups(p.judged, path, "speed-up (fp32 / bf16 step time)", "bf16 autocast against fp32")


def compile_speedup(c: F.CompileFacts, path: Path) -> None:
    rows = F.judged(c.rows, "step")
    if not rows:
        placeholder(path, "no compiled training step beside an eager one")
        return
    how = "block by block" if set(c.scopes) == {"blocks"} else "torch.compile"
    _speedups(rows, path, "speed-up (eager / compiled step time)", f"compiled ({how}) against eager")


def draw_all(figures_dir: Path, timing, warm, precision, compiled) -> None:
    phase_times(timing, figures_dir / Path(path_of("phase_times")).name)
    warmup(warm, figures_dir / Path(path_of("warmup")).name)
    precision_speedup(precision, figures_dir / Path(path_of("precision_speedup")).name)
    compile_speedup(compiled, figures_dir / Path(path_of("compile")).name)
