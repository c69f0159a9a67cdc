"""The leaderboard section: our forward+backward time under the course's protocol against SDPA's flash
and cuDNN backends, the course's published best entry as a reference only, and the eager
side-by-side throughputs (folded)."""

from __future__ import annotations

import pandas as pd

from lmperf.kinds.flash.leaderboard_facts import (
    COURSE_BEST_DEVICE,
    COURSE_BEST_MS,
    OTHERS,
    OURS,
    LeaderboardFacts,
    Timing,
)
from lmperf.kinds.flash.render import blocks, details, listing, md_table, ms, num, table_link, times

CSV = "flash_leaderboard.csv"
VERDICT_WORDS = {"faster": "faster than", "slower": "slower than", "within noise": "within the noise of"}
REFERENCE = (
    f"For reference, the course's published best verified entry is {COURSE_BEST_MS} ms on an {COURSE_BEST_DEVICE} "
    "(the course's figure, not measured here)."
)


def _shape(facts: LeaderboardFacts) -> str:
    s = facts.shape
    return f"({s.get('batch')}, {s.get('seq')}, {s.get('head_dim')})"


def _against(t: Timing) -> str:
    name = OTHERS.get(t.implementation, t.implementation)
    if t.time is None:
        return f"{name} did not finish ({t.status}: {t.error})"
    return f"{VERDICT_WORDS[t.verdict]} {name} ({ms(t.time)}; ours / it = {times(t.ours_over_it, 3)})"


def answer(facts: LeaderboardFacts) -> str:
    ours = facts.ours
    protocol = "torch.compile" if facts.compiled else "eager"
    what = f"{protocol}, {facts.shape.get('dtype')}, causal, Q, K, V of shape {_shape(facts)}"
    if ours is None or ours.time is None:
        why = f" ({ours.status}: {ours.error})" if ours else ""
        return f"Our kernels did not finish the leaderboard configuration ({what}) on {facts.device_name}{why}."
    others = [t for t in facts.timings if t.head_dim == ours.head_dim and t.implementation != OURS]
    return (
        f"Our FlashAttention-2 takes {ms(ours.time)} for the leaderboard's forward+backward ({what}) on "
        f"{facts.device_name}: " + listing(_against(t) for t in others) + "."
    )


def _time_cell(t: Timing) -> str:
    if t.time is None:
        return "—"
    return t.time.format(3) + (" (unstable)" if t.time.unstable else "")


def protocol_table(facts: LeaderboardFacts) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "d": str(t.head_dim),
                "implementation": t.implementation,
                "status": str(t.status),
                "fwd+bwd (ms)": _time_cell(t),
                "ours / it": times(t.ours_over_it, 3) if t.ours_over_it else "—",
                "ours is": t.verdict or "—",
            }
            for t in facts.timings
        ]
    )


def method_note(facts: LeaderboardFacts) -> str:
    compiled = "`f = torch.compile(attention)`; " if facts.compiled else "eager (no torch.compile); "
    return (
        f"Protocol: {compiled}`do_bench(lambda: f(q, k, v, True).sum().backward(), warmup={facts.warmup_ms:g}, "
        f"rep={facts.rep_ms:g})`, median; the heads folded into the batch; every implementation in the same "
        "process, one after the other. " + facts.tiles
    ).strip()


def eager_table(facts: LeaderboardFacts) -> pd.DataFrame:
    rows = []
    for x in facts.eager:
        row = {
            "implementation": x["implementation"],
            "d": str(x["head_dim"]),
            "status": x["status"],
            "fwd (ms)": num(x.get("forward_ms_median"), 3),
            "bwd (ms)": num(x.get("backward_ms_median"), 3),
            "fwd+bwd (ms)": num(x.get("forward_backward_ms_median"), 3),
            "fwd TFLOP/s": num(x.get("forward_tflops"), 1),
            "fwd+bwd TFLOP/s": num(x.get("forward_backward_tflops"), 1),
        }
        if facts.bf16_peak and x.get("forward_tflops"):
            row["fwd % of bf16 peak"] = num(100 * x["forward_tflops"] / facts.bf16_peak, 1)
        rows.append(row)
    return pd.DataFrame(rows)


def eager_sentence(facts: LeaderboardFacts) -> str:
    """Per head dim: our forward's throughput, against the others' and the device's bf16 peak."""
    out = []
    for d in sorted({x["head_dim"] for x in facts.eager}):
        at = {x["implementation"]: x for x in facts.eager if x["head_dim"] == d}
        tflops = (at.get(OURS) or {}).get("forward_tflops")
        if tflops is None:
            continue
        others = [f"{i} {num(x['forward_tflops'], 1)}" for i, x in at.items() if i != OURS and x.get("forward_tflops")]
        peak = f" ({num(100 * tflops / facts.bf16_peak, 1)}% of the dense bf16 peak)" if facts.bf16_peak else ""
        against = f" against {listing(others)} TFLOP/s" if others else ""
        out.append(f"d = {d}: our forward alone reaches {num(tflops, 1)} TFLOP/s{peak}{against}.")
    return " ".join(out)


def section(facts: LeaderboardFacts | None, device: str, source: str, why: str = "") -> str:
    if facts is None:
        return blocks(f"The leaderboard configuration was not measured on `{device}`{why}.")
    eager = ""
    if facts.eager:
        first = facts.eager[0]
        eager = details(
            f"Eager, side by side: causal, N = {first['sequence_length']}, batch {first['batch_size']}, "
            f"{first['precision']}",
            blocks(md_table(eager_table(facts)), eager_sentence(facts)),
        )
    return blocks(
        answer(facts),
        REFERENCE,
        md_table(protocol_table(facts)),
        method_note(facts),
        eager,
        f"Every timing: [full table]({table_link(device, CSV)}).",
        source,
    )
