"""Tables of the memory report: the CSV frames (one row per cell, one per large allocation) and the
markdown tables each answer shows, built from the facts (``lmperf.kinds.memory.facts``,
``lmperf.kinds.memory.allocations``). Sizes print in GiB (1024³ bytes), as the column names say.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from lmperf.core.stats import Estimate
from lmperf.kinds.memory import bf16 as B
from lmperf.kinds.memory import facts as F
from lmperf.kinds.memory.allocations import ResidualFacts, TopFacts

MIB_PER_GIB = 1024.0
UNSTABLE_MARK = "†"


def missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def gib(mib, digits: int = 2) -> str:
    """MiB as GiB for a table or a sentence; '—' for a missing value."""
    return "—" if missing(mib) else f"{mib / MIB_PER_GIB:.{digits}f}"


def gib_estimate(est: Estimate | None) -> str:
    """An Estimate in MiB as GiB, with its interval when it has one and † when it is unstable."""
    if est is None:
        return "—"
    scale = 1 / MIB_PER_GIB
    low, high = (None, None) if est.low is None else (est.low * scale, est.high * scale)
    text = dataclasses.replace(est, median=est.median * scale, low=low, high=high).format(2)
    return text + (UNSTABLE_MARK if est.unstable else "")


def pct(x, digits: int = 1, sign: bool = False) -> str:
    if missing(x):
        return "—"
    return f"{100 * x:+.{digits}f}%" if sign else f"{100 * x:.{digits}f}%"


def phase_name(phase: str | None) -> str:
    return "—" if not phase else phase.replace("_", " ")


def md_table(df: pd.DataFrame) -> str:
    """A markdown table with every cell as written (no re-reading of numbers)."""
    if df.empty:
        return "_(no records)_\n"
    return df.to_markdown(index=False, disable_numparse=True) + "\n"


# -- the CSV frames ------------------------------------------------------------------------------


def _cell_row(record: dict) -> dict:
    c, m = record["cell"], record["metrics"]
    a, stage = F.analytic(record), F.stage_row(record) if F.measured([record]) else None
    live = m.get("breakdown_at_peak_mib") or {}
    return {
        **{k: c[k] for k in ("model", "context_length", "precision", "mode")},
        "status": record["status"],
        "reason": record.get("reason"),
        "peak_allocated_mib": m.get("peak_allocated_mib"),
        "peak_reserved_mib": m.get("peak_reserved_mib"),
        "replay_peak_active_mib": m.get("replay_peak_active_mib"),
        "peak_phase": m.get("peak_phase"),
        "step_start_active_mib": stage.start_mib if stage else None,
        "forward_end_active_mib": stage.forward_end_mib if stage else None,
        "backward_end_active_mib": stage.backward_end_mib if stage else None,
        "optimizer_step_transient_mib": stage.step_transient_mib if stage else None,
        "zero_grad_frees_mib": stage.zero_grad_frees_mib if stage else None,
        "stages_hidden": "; ".join(stage.hidden) if stage else None,
        **{f"live_at_peak_{k}_mib": v for k, v in live.items()},
        "saved_for_backward_hooks_mib": m.get("saved_for_backward_mib"),
        "analytic_peak_mib": a.get("predicted_peak_mib"),
        "analytic_peak_phase": F.analytic_peak_phase(a),
        **{
            f"analytic_{k}": a.get(k)
            for k in (
                "parameters_mib",
                "gradients_mib",
                "optimizer_state_mib",
                "activations_mib",
                "weight_copies_mib",
                "end_of_forward_mib",
                "optimizer_step_mib",
            )
        },
        "trace_events": m.get("trace_events"),
        "snapshot_path": m.get("snapshot_path"),
    }


def cells_frame(records: list[dict]) -> pd.DataFrame:
    """``tables/memory.csv``: one row per cell, everything the sections draw on."""
    return pd.DataFrame([_cell_row(r) for r in records])


def top_frame(records: list[dict]) -> pd.DataFrame:
    """``tables/memory_top_allocations.csv``: each cell's largest allocations live at its peak."""
    rows = [
        {
            **{k: r["cell"][k] for k in ("model", "context_length", "precision", "mode")},
            "rank": rank,
            "size_mib": a["size_mib"],
            "category": a.get("category"),
            "name": a.get("name"),
            "allocated_in": a["allocated_in"],
            "frames": " ← ".join(a["frames"]),
        }
        for r in records
        for rank, a in enumerate(r["metrics"].get("top_allocations") or [], 1)
    ]
    columns = ["model", "context_length", "precision", "mode", "rank", "size_mib", "category", "name"]
    return pd.DataFrame(rows, columns=[*columns, "allocated_in", "frames"])


# -- the markdown tables -------------------------------------------------------------------------


def stage_table(facts: F.StageFacts) -> pd.DataFrame:
    rows = []
    for r in facts.rows:
        training = r.mode == "training"
        rows.append(
            {
                "mode": r.mode,
                "precision": r.precision,
                "context": str(r.context),
                "step starts (GiB)": gib(r.start_mib),
                "forward: end (max) (GiB)": f"{gib(r.forward_end_mib)} ({gib(r.forward_peak_mib)})",
                "backward: peak → end (GiB)": f"{gib(r.backward_peak_mib)} → {gib(r.backward_end_mib)}"
                if training
                else "—",
                "optimizer step: transient (GiB)": gib(r.step_transient_mib) if training else "—",
                "zero_grad frees (GiB)": gib(r.zero_grad_frees_mib) if training else "—",
                "peak (GiB, phase)": f"{gib(r.peak_mib)} ({phase_name(r.peak_phase)})",
                "every stage shows": ("yes" if r.visible else "no: " + ", ".join(r.hidden))
                if training
                else "(forward only)",
            }
        )
    return pd.DataFrame(rows)


def peak_text(cell: F.PeakCell | None) -> str:
    """A peak for a table: GiB, or OOM with the peak the replay reached before it."""
    if cell is None or cell.status == "unsupported":
        return "—"
    if cell.status == "oom":
        return "OOM" + (f" (reached {gib(cell.replay_mib)})" if not missing(cell.replay_mib) else "")
    return gib_estimate(cell.peak)


def peak_table(facts: F.PeakFacts) -> pd.DataFrame:
    rows = []
    for r in facts.rows:
        t = r.training
        rows.append(
            {
                "context": str(r.context),
                "forward only: peak (GiB)": peak_text(r.inference),
                "full step: peak (GiB)": peak_text(t),
                "full step: phase of the peak": phase_name(t.phase) if t else "—",
                "full step: analytic peak (GiB)": gib(t.analytic_mib) if t else "—",
                "analytic: phase of its peak": t.analytic_phase if t and t.analytic_phase else "—",
            }
        )
    return pd.DataFrame(rows)


def live_table(rows: tuple[F.Composition, ...]) -> pd.DataFrame:
    """What is live at each training cell's measured peak event (GiB)."""
    return pd.DataFrame(
        [
            {
                "precision": c.precision,
                "context": str(c.context),
                "peak phase": phase_name(c.phase),
                "parameters (GiB)": gib(c.live_mib.get("parameters")),
                "gradients live (GiB)": gib(c.live_mib.get("gradients")),
                "AdamW state (GiB)": gib(c.live_mib.get("optimizer_state")),
                "other: activations, weight copies, temporaries (GiB)": gib(c.live_mib.get("other")),
                "total, replay (GiB)": gib(c.replay_peak_mib),
            }
            for c in rows
        ]
    )


def account_table(rows: tuple[F.Composition, ...]) -> pd.DataFrame:
    """The analytic account's full-size components (GiB) and its two candidate peaks."""
    out = []
    for c in rows:
        a = c.account
        saved = a.get("activations_mib", 0) + a.get("weight_copies_mib", 0)
        out.append(
            {
                "precision": c.precision,
                "context": str(c.context),
                "parameters (GiB)": gib(a.get("parameters_mib")),
                "gradients, all (GiB)": gib(a.get("gradients_mib")),
                "AdamW state (GiB)": gib(a.get("optimizer_state_mib")),
                "saved for backward: closed form (GiB)": gib(saved),
                "saved for backward: hooks, measured (GiB)": gib(c.saved_hooks_mib),
                "end of forward (GiB)": gib(a.get("end_of_forward_mib")),
                "optimizer step (GiB)": gib(a.get("optimizer_step_mib")),
            }
        )
    return pd.DataFrame(out)


def change_table(facts: B.PrecisionFacts) -> pd.DataFrame:
    rows = [
        {
            "what": "peak, forward only" if c.mode == "inference" else "peak, full step",
            "context": str(c.context),
            "fp32 (GiB)": gib_estimate(c.fp32),
            "bf16 (GiB)": gib_estimate(c.bf16),
            "change": pct(c.change, sign=True),
            "verdict": c.verdict,
        }
        for c in facts.peaks
    ]
    rows += [
        {
            "what": "end of forward, full step",
            "context": str(e.change.context),
            "fp32 (GiB)": gib_estimate(e.change.fp32),
            "bf16 (GiB)": gib_estimate(e.change.bf16),
            "change": pct(e.change.change, sign=True),
            "verdict": e.change.verdict,
        }
        for e in facts.forward_ends
    ]
    return pd.DataFrame(rows)


def saved_table(facts: B.PrecisionFacts) -> pd.DataFrame:
    """Why end-of-forward memory moves: what autograd saved, measured and split by the account."""
    return pd.DataFrame(
        [
            {
                "context": str(e.change.context),
                "end of forward, bf16 − fp32 (GiB)": f"{(e.change.bf16.median - e.change.fp32.median) / 1024:+.2f}",
                "saved for backward, hooks: fp32 → bf16 (GiB)": f"{gib(e.saved_fp32_mib)} → {gib(e.saved_bf16_mib)}",
                "activation bytes bf16 saves (GiB, analytic)": gib(e.activations_saved_mib),
                "bf16 weight copies saved for backward (GiB, analytic)": gib(e.weight_copies_mib),
            }
            for e in facts.forward_ends
        ]
    )


def matches_table(facts: ResidualFacts) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "context": str(m.context),
                "precision": m.precision,
                "mode": m.mode,
                "size (bytes)": f"{m.size_bytes:,}",
                "allocations of exactly that size": str(m.count),
                "by phase": ", ".join(f"{k} {v}" for k, v in m.by_phase) or "—",
                "most common site": f"`{m.site}`",
            }
            for m in facts.matches
        ]
    )


def top_table(facts: TopFacts) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "size (MiB)": f"{g.size_mib:g}",
                "count": str(g.count),
                "what": g.what,
                "allocated in": g.allocated_in,
                "innermost frames outside torch": " ← ".join(f"`{f}`" for f in g.frames) or "(none)",
            }
            for g in facts.groups
        ]
    )
