"""Facts about single allocations: the residual-stream tensor (question (d)) and the largest
allocations live at the peak (question (e)). Pure functions of the memory records; sizes in MiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmperf.core.sizes import config_from_name
from lmperf.core.units import MIB
from lmperf.kinds.memory.account import residual_stream_bytes
from lmperf.kinds.memory.facts import measured

# -- (d) one fp32 residual-stream activation -----------------------------------------------------


@dataclass(frozen=True)
class SizeMatch:
    """Allocations of exactly one residual-stream tensor's size in one recorded step."""

    context: int
    precision: str
    mode: str
    size_bytes: int
    count: int
    by_phase: tuple[tuple[str, int], ...]
    site: str  # the most common innermost frames outside torch


@dataclass(frozen=True)
class ResidualFacts:
    model: str
    d_model: int
    batch: int
    context: int
    other_contexts: tuple[int, ...]  # the model's other profiled contexts
    matches: tuple[SizeMatch, ...]

    @property
    def nbytes(self) -> int:
        return residual_stream_bytes(config_from_name(self.model), self.batch, self.context)

    @property
    def mib(self) -> float:
        return self.nbytes / MIB

    def mib_at(self, context: int) -> float:
        return residual_stream_bytes(config_from_name(self.model), self.batch, context) / MIB

    @property
    def longest(self) -> bool:
        """Whether the reference context is the longest profiled."""
        return all(c <= self.context for c in self.other_contexts)

    @property
    def confirmation(self) -> SizeMatch | None:
        """The recorded step at the reference context with the most allocations of that size."""
        at = [m for m in self.matches if m.context == self.context]
        return max(at, key=lambda m: m.count) if at else None


def residual_facts(records: list[dict], model: str, batch: int, context: int) -> ResidualFacts:
    config = config_from_name(model)
    mine = [r for r in measured(records) if r["cell"]["model"] == model]
    matches = []
    for r in sorted(mine, key=lambda r: (r["cell"]["context_length"], r["cell"]["precision"], r["cell"]["mode"])):
        c, match = r["cell"], (r["metrics"].get("size_matches") or {}).get("residual_stream")
        if match is None:
            continue
        sites = match.get("sites") or []
        matches.append(
            SizeMatch(
                c["context_length"],
                c["precision"],
                c["mode"],
                match["size_bytes"],
                match["count"],
                tuple(sorted(match["by_phase"].items())),
                sites[0]["frames"] if sites else "—",
            )
        )
    others = tuple(sorted({r["cell"]["context_length"] for r in mine} - {context}))
    return ResidualFacts(model, config.d_model, batch, context, others, tuple(matches))


# -- (e) the largest allocations at the peak -------------------------------------------------------


@dataclass(frozen=True)
class TopGroup:
    """Identical entries of a cell's largest live allocations (same size, name, phase, frames)."""

    size_mib: float
    what: str  # "parameters: layers.31.ffn.w3.weight"; unnamed: "score-sized (fp32)" or "—"
    allocated_in: str
    frames: tuple[str, ...]
    count: int


@dataclass(frozen=True)
class TopFacts:
    mode: str
    model: str
    context: int
    precision: str
    peak_mib: float | None
    phase: str | None
    live: int | None
    groups: tuple[TopGroup, ...]
    score_shape: tuple[int, int, int, int]  # (B, H, T, T): one layer's attention scores

    @property
    def count(self) -> int:
        return sum(g.count for g in self.groups)

    def kinds(self) -> list[tuple[str, int, float]]:
        """(what, how many, size MiB) of the listed allocations, most first; named storages by category."""
        out: dict[tuple[str, float], int] = {}
        for g in self.groups:
            what = g.what.split(":")[0] if ":" in g.what else g.what
            out[(what, g.size_mib)] = out.get((what, g.size_mib), 0) + g.count
        return sorted(((w, n, s) for (w, s), n in out.items()), key=lambda t: (-t[1], -t[2]))

    def model_lines(self) -> tuple[str, ...]:
        """The innermost model frames of the listed allocations (one per allocation site)."""
        return tuple(sorted({g.frames[0] for g in self.groups if g.frames}))


def score_sized(size_bytes: float, shape: tuple[int, ...]) -> str:
    """'score-sized (fp32)' (or bf16) where an unnamed allocation holds exactly one layer's attention
    scores, B·H·T² elements of that precision; '—' otherwise."""
    elements = shape[0] * shape[1] * shape[2] * shape[3]
    for name, nbytes in (("fp32", 4), ("bf16", 2)):
        if abs(size_bytes - elements * nbytes) < 1:
            return f"score-sized ({name})"
    return "—"


def representative(records: list[dict], mode: str) -> dict | None:
    """The cell of a mode whose record lists its largest allocations: fp32 preferred, then a cell
    that ran to the end, then the longest context."""
    cands = [r for r in measured(records) if r["cell"]["mode"] == mode and r["metrics"].get("top_allocations")]
    if not cands:
        return None
    return max(
        cands, key=lambda r: (r["cell"]["precision"] == "fp32", r["status"] == "ok", r["cell"]["context_length"])
    )


def top_facts(records: list[dict], mode: str) -> TopFacts | None:
    r = representative(records, mode)
    if r is None:
        return None
    c, m = r["cell"], r["metrics"]
    shape = (c["batch_size"], config_from_name(c["model"]).num_heads, c["context_length"], c["context_length"])
    groups: dict[tuple, int] = {}
    for a in m["top_allocations"]:
        what = (
            f"{a['category']}: {a['name']}"
            if a.get("category")
            else score_sized(a.get("size_bytes", a["size_mib"] * MIB), shape)
        )
        key = (a["size_mib"], what, a["allocated_in"], tuple(a["frames"]))
        groups[key] = groups.get(key, 0) + 1
    return TopFacts(
        mode=mode,
        model=c["model"],
        context=c["context_length"],
        precision=c["precision"],
        peak_mib=m.get("replay_peak_active_mib"),
        phase=m.get("peak_phase"),
        live=m.get("live_allocations_at_peak"),
        groups=tuple(TopGroup(*key, n) for key, n in groups.items()),
        score_shape=shape,
    )
