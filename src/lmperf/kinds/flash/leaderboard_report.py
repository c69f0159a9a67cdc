"""The leaderboard section: our forward+backward time under the course's protocol against SDPA's flash
and cuDNN backends (verdicts from ``stats.compare``), the course's published best entry as a
reference only, and the eager side-by-side throughputs (folded). Facts → tables → prose."""

from __future__ import annotations

import collections

from lmperf.core import stats
from lmperf.core.peaks import PEAKS
from lmperf.kinds.flash.bench_report import PASS_WORDS
from lmperf.kinds.flash.correctness_report import why
from lmperf.report.common import blocks, details, fmt, listing, md_table, source_line, summary, times

OURS = "flash"
NAMES = {"sdpa_flash": "SDPA flash", "sdpa_cudnn": "SDPA cuDNN"}
VERDICT_WORDS = {"faster": "faster than", "slower": "slower than", "within noise": "within the noise of"}
# the course's published best verified entry: cited as a reference, never measured here
REFERENCE = (
    "For reference, the course's published best verified entry is 5.364 ms on an H100 "
    "(the course's figure, not measured here)."
)


# one implementation's protocol time at one head dim; ours_over_it and verdict (ours "faster", "slower" or
# "within noise") None for ours
Timing = collections.namedtuple("Timing", "head_dim implementation status time error ours_over_it verdict")


class LeaderboardFacts:
    """The facts of the leaderboard from its ok record."""

    def __init__(self, record: dict, device: str):
        m, s = record["metrics"], record["provenance"].get("settings") or {}
        self.device_name = record["provenance"].get("device_name", device)
        self.shape = m["leaderboard_shape"]  # batch, seq, head_dim, dtype, causal
        self.settings = {k: s.get(k) for k in ("compile", "warmup_ms", "rep_ms")}
        self.timings = []
        for d, results in m["protocol_by_head_dim"].items():
            results = {k: v for k, v in results.items() if isinstance(v, dict)}  # not the ratios older records keep
            # the protocol's median, with its interval where the record merged trials (a top-level metric)
            found = {
                impl: stats.metric(record, f"{impl}_d{d}_forward_backward_ms_median")
                or stats.metric({"metrics": res}, "forward_backward_ms_median")
                for impl, res in results.items()
            }
            ours = found.get(OURS)
            for impl, res in results.items():
                time = found[impl]
                vs = ours is not None and time is not None and impl != OURS
                ratio, verdict = (stats.ratio(ours, time), stats.compare(ours, time)) if vs else (None, None)
                self.timings.append(Timing(int(d), impl, res.get("status"), time, res.get("error"), ratio, verdict))
        self.eager = m.get("side_by_side") or []  # the side-by-side rows, as recorded
        self.bf16_peak = (PEAKS.get(device) or {}).get("bf16")  # the device's dense bf16 peak, TFLOP/s
        # our tuner's seconds, in untimed first calls
        self.tuning_s = sum((r.get(OURS) or {}).get("tuning_s") or 0.0 for r in m["protocol_by_head_dim"].values())

    def at(self, implementation: str) -> Timing | None:
        """``implementation``'s timing at the leaderboard's head dim."""
        key = (implementation, self.shape.get("head_dim"))
        return next((t for t in self.timings if (t.implementation, t.head_dim) == key), None)

    def others(self) -> list[Timing]:
        """The other implementations' timings at the leaderboard's head dim."""
        return [t for t in self.timings if t.head_dim == self.shape.get("head_dim") and t.implementation != OURS]


def _against(t: Timing, ratio: bool = True) -> str:
    """'faster than SDPA flash (7.020 ms; ours / it = 0.677×)' (the ratio where told), or that it did not finish."""
    name = NAMES.get(t.implementation, t.implementation)
    if t.time is None:
        return f"{name} did not finish ({t.status}: {t.error})"
    said = f"; ours / it = {times(t.ours_over_it, 3)}" if ratio else ""
    return f"{VERDICT_WORDS[t.verdict]} {name} ({t.time.format(3, 'ms')}{said})"


def answer(facts: LeaderboardFacts) -> str:
    ours, shape = facts.at(OURS), facts.shape
    what = (
        f"{'torch.compile' if facts.settings['compile'] else 'eager'}, {shape['dtype']}, causal, Q, K, V of shape "
        f"({shape['batch']}, {shape['seq']}, {shape['head_dim']})"
    )
    if ours is None or ours.time is None:
        why = f" ({ours.status}: {ours.error})" if ours else ""
        return f"Our kernels did not finish the leaderboard configuration ({what}) on {facts.device_name}{why}."
    return (
        f"Our FlashAttention-2 takes {ours.time.format(3, 'ms')} for the leaderboard's forward+backward ({what}) on "
        f"{facts.device_name}: {listing(map(_against, facts.others()))}."
    )


def one_line(facts: LeaderboardFacts) -> str:
    ours = facts.at(OURS)
    if ours is None or ours.time is None:
        return ""
    against = listing(_against(t, ratio=False) for t in facts.others() if t.time is not None)
    return summary(f"Ours {ours.time.format(3, 'ms')} forward+backward: {against}.")


def protocol_table(facts: LeaderboardFacts) -> str:
    rows = []
    for t in facts.timings:
        time = "—" if t.time is None else t.time.format(3) + (" (unstable)" if t.time.unstable else "")
        row = {"d": str(t.head_dim), "implementation": t.implementation, "status": str(t.status), "fwd+bwd (ms)": time}
        rows.append(row | {"ours / it": times(t.ours_over_it, 3), "ours is": t.verdict or "—"})
    return md_table(rows)


def eager_fold(facts: LeaderboardFacts) -> str:
    """The eager side-by-side rows, folded ('' where the record has none)."""
    if not facts.eager:
        return ""
    rows = []
    for x in facts.eager:
        row = {"implementation": x["implementation"], "d": str(x["head_dim"]), "status": x["status"]}
        row |= {f"{word} (ms)": fmt(x.get(f"{p}_ms_median"), 3) for p, word in PASS_WORDS.items()}
        row |= {f"{PASS_WORDS[p]} TFLOP/s": fmt(x.get(f"{p}_tflops"), 1) for p in ("forward", "forward_backward")}
        if facts.bf16_peak and x.get("forward_tflops"):
            row["fwd % of bf16 peak"] = fmt(100 * x["forward_tflops"] / facts.bf16_peak, 1)
        rows.append(row)
    x = facts.eager[0]
    title = f"Eager, side by side: causal, N = {x['sequence_length']}, batch {x['batch_size']}, {x['precision']}"
    return details(title, md_table(rows))


def method_note(facts: LeaderboardFacts) -> str:
    s = facts.settings
    compiled = "`f = torch.compile(attention)`; " if s["compile"] else "eager (no torch.compile); "
    tuned = f" Tuning our tiles took {facts.tuning_s:.1f} s, in untimed first calls." if facts.tuning_s else ""
    return (
        f"Protocol: {compiled}`do_bench(lambda: f(q, k, v, True).sum().backward(), warmup={s['warmup_ms']:g}, "
        f"rep={s['rep_ms']:g})`, median; the heads folded into the batch; every implementation in the same process, "
        "one after the other." + tuned
    )


def section(records: list[dict], device: str) -> str:
    ok = [r for r in records if r["status"] == "ok"]
    if not ok:
        return blocks(f"The leaderboard configuration was not measured on `{device}`{why(records)}.")
    facts, closing = LeaderboardFacts(ok[0], device), source_line(records, device)
    return blocks(
        one_line(facts), answer(facts), REFERENCE, protocol_table(facts), method_note(facts), eager_fold(facts), closing
    )
