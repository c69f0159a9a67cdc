"""Figures of the end-to-end report, drawn from the facts with their 95% intervals as error bars, and a
placeholder saying why where there is nothing to draw."""

from __future__ import annotations

from pathlib import Path

from lmperf.kinds.e2e import facts as F
from lmperf.report.common import empty_figure, figure, save

NAMES = ("phase_times", "precision_speedup", "compile")


def path_of(name: str) -> str:
    """A figure's path relative to the report's ``--out``."""
    return f"figures/e2e_{name}.png"


def errorbars(ax, rows, value, **kwargs) -> None:
    """Each row's ``value`` (an Estimate, None: left out) over its size, the interval as error bars."""
    points = [(r.model, e) for r in rows if (e := value(r)) is not None]
    low = [e.median - (e.low if e.low is not None else e.median) for _, e in points]
    high = [(e.high if e.high is not None else e.median) - e.median for _, e in points]
    if points:
        models, medians = [m for m, _ in points], [e.median for _, e in points]
        ax.errorbar(models, medians, yerr=[low, high], marker="o", capsize=3, **kwargs)


def by_context(path: Path, rows, lines: dict, ylabel: str, log: bool) -> None:
    """One panel per context, sizes along x, a line per entry of ``lines`` (label -> row -> Estimate)."""
    contexts = sorted({r.context_length for r in rows})
    if not contexts:
        return empty_figure(path, "nothing measured to draw")
    fig, axes = figure(1, len(contexts))
    for ax, ctx in zip(axes[0], contexts):
        for label, value in lines.items():
            errorbars(ax, [r for r in rows if r.context_length == ctx], value, label=label)
        ax.set(title=f"context {ctx}", xlabel="model", yscale="log" if log else "linear")
        ax.tick_params(axis="x", rotation=45)
        if not log:
            ax.axhline(1.0, color="grey", lw=0.8)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=8)
    save(fig, path)


def draw_all(folder: Path, records: list[dict], grid: dict, device: str) -> None:
    w = grid.get("warmup_steps")
    phases = {p: (lambda r, p=p: r.times[p][1]) for p in F.STEP_PHASES}
    speedup = {"training step": lambda r: r.speedup("step")}
    for name, rows, lines, ylabel in (
        ("phase_times", F.timing_facts(records, w).ok, phases, f"ms (fp32, {w} warm-up steps)"),
        ("precision_speedup", F.precision_facts(records, w, device == "cpu").judged, speedup, "speed-up (fp32 / bf16)"),
        ("compile", F.judged(F.compile_facts(records, w).rows), speedup, "speed-up (eager / compiled)"),
    ):
        by_context(folder / Path(path_of(name)).name, rows, lines, ylabel, log=name == "phase_times")
