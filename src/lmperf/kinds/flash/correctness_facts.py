"""Facts of flash_forward and flash_backward: how close each implementation's outputs and gradients
are to float64 attention, entry by entry, and whether the forward saves what backward needs."""

from __future__ import annotations

import dataclasses
import math

from lmperf.kinds.flash.frames import PRECISION_ORDER

FORWARD_TENSORS = ("O", "L")
BACKWARD_TENSORS = ("dQ", "dK", "dV")
TILE_KERNELS = (("fwd", "forward"), ("dkdv", "dK/dV pass"), ("dq", "dQ pass"))
MAX_LISTED = 8


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One implementation's record: what ran and on what."""

    name: str  # the cell's implementation: pytorch | triton
    function: str | None
    kernel_mode: str | None
    status: str
    reason: str | None
    entries: int
    course_entries: int | None
    precisions: tuple[str, ...]
    head_dims: tuple[int, ...]
    causal: tuple[bool, ...]
    shapes: tuple[tuple[int, int, int], ...]
    seed: int | None
    tiles: str  # '' where the record names no tiles


@dataclasses.dataclass(frozen=True)
class ErrorRow:
    """The largest relative error of each tensor over one implementation's entries of one precision."""

    implementation: str
    precision: str
    errors: tuple[tuple[str, float | None], ...]
    tolerance: float | None
    ok: int
    entries: int

    @property
    def worst(self) -> tuple[str, float] | None:
        known = [(t, e) for t, e in self.errors if e is not None]
        return max(known, key=lambda te: te[1]) if known else None


@dataclasses.dataclass(frozen=True)
class CorrectnessFacts:
    problem: str  # flash_forward | flash_backward
    tensors: tuple[str, ...]
    implementations: tuple[Implementation, ...]
    rows: tuple[ErrorRow, ...]
    entries: int
    entries_ok: int
    failures: tuple[str, ...]  # one line per entry not within tolerance (or that did not run)
    saved_ok: int
    saved_checked: int

    @property
    def within_tolerance(self) -> bool:
        """The verdict: every entry of every implementation within tolerance (and every other check)."""
        return self.entries > 0 and self.entries_ok == self.entries

    @property
    def contract_kept(self) -> bool | None:
        """Every checked entry saves exactly one float32 tensor of L's shape; None if none was checked."""
        return None if not self.saved_checked else self.saved_ok == self.saved_checked

    @property
    def closest(self) -> tuple[ErrorRow, str, float] | None:
        """The row whose largest error comes closest to (or goes furthest over) its tolerance."""
        best = None
        for row in self.rows:
            worst = row.worst
            if worst is None or not row.tolerance:
                continue
            share = worst[1] / row.tolerance
            if best is None or share > best[0]:
                best = (share, row, *worst)
        return None if best is None else best[1:]


def _max(values) -> float | None:
    finite = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return max(finite) if finite else None


def _tile(choice) -> str | None:
    """'128×64' from one kernel's tile choice (``{"config": {...}}`` or the config itself)."""
    if not isinstance(choice, dict):
        return None
    cfg = choice.get("config", choice)
    return f"{cfg['BLOCK_M']}×{cfg['BLOCK_N']}" if "BLOCK_M" in cfg and "BLOCK_N" in cfg else None


def _dims_text(dims: list[int], tested: list[int]) -> str:
    """'d ≤ 64', 'd ≥ 80', 'd = 80, 128' or 'every d', against the head dims tested."""
    dims = sorted(dims)
    if dims == tested:
        return "every d"
    if len(dims) > 1 and dims == [d for d in tested if d <= dims[-1]]:
        return f"d ≤ {dims[-1]}"
    if len(dims) > 1 and dims == [d for d in tested if d >= dims[0]]:
        return f"d ≥ {dims[0]}"
    return "d = " + ", ".join(map(str, dims))


def _precisions(values) -> list[str]:
    return sorted(set(values), key=lambda p: PRECISION_ORDER.get(p, 9))


def tiles_text(record: dict) -> str:
    """Every tile set (forward / dK/dV / dQ) the record's entries ran, with how many entries ran each
    and where; from the entries' own tiles, else the record's list of tiles (which entries ran which
    then unknown). '' where the record names none."""
    m = record["metrics"]
    entries = [e for e in m.get("entries_detail") or [] if isinstance(e.get("tiles"), dict)]
    names = " / ".join(name for _, name in TILE_KERNELS)
    if not entries:
        return _listed_tiles(m.get("triton_tiles"))
    groups: dict[tuple, list[dict]] = {}
    for e in entries:
        groups.setdefault(tuple(_tile(e["tiles"].get(k)) or "?" for k, _ in TILE_KERNELS), []).append(e)
    tested = {p: sorted({e["head_dim"] for e in entries if e["precision"] == p}) for p in PRECISION_ORDER}
    parts = []
    for key, es in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        where: dict[str, list[str]] = {}
        for p in _precisions(e["precision"] for e in es):
            dims = sorted({e["head_dim"] for e in es if e["precision"] == p})
            where.setdefault(_dims_text(dims, tested.get(p, dims)), []).append(p)
        at = "; ".join(f"{', '.join(ps)} {dims}" for dims, ps in where.items())
        parts.append(f"{' / '.join(key)} in {len(es)} {'entry' if len(es) == 1 else 'entries'} ({at})")
    unknown = len(m.get("entries_detail") or []) - len(entries)
    tail = f"; {unknown} entries name no tiles" if unknown else ""
    return f"tiles (BLOCK_M×BLOCK_N, {names}): " + ", ".join(parts) + tail


def _listed_tiles(tiles) -> str:
    if not tiles:
        return ""
    listed = []
    for k, name in TILE_KERNELS:
        choices = tiles.get(k)
        choices = choices if isinstance(choices, list) else [choices]
        shown = list(dict.fromkeys(t for t in map(_tile, choices) if t))
        if shown:
            listed.append(f"{name} {', '.join(shown)}")
    if not listed:
        return ""
    several = any(isinstance(tiles.get(k), list) and len(tiles[k]) > 1 for k, _ in TILE_KERNELS)
    return "tiles (BLOCK_M×BLOCK_N) " + ("used across the entries: " if several else "") + ", ".join(listed)


def implementation(record: dict) -> Implementation:
    m = record["metrics"]
    es = m.get("entries_detail") or []
    return Implementation(
        name=record["cell"]["implementation"],
        function=m.get("function"),
        kernel_mode=m.get("kernel_mode"),
        status=record["status"],
        reason=record.get("reason"),
        entries=len(es),
        course_entries=m.get("course_entries"),
        precisions=tuple(_precisions(e["precision"] for e in es)),
        head_dims=tuple(sorted({e["head_dim"] for e in es})),
        causal=tuple(sorted({bool(e["causal"]) for e in es})),
        shapes=tuple(sorted({(e["batch"], e["n_queries"], e["n_keys"]) for e in es})),
        seed=m.get("seed"),
        tiles=tiles_text(record),
    )


def _failure(impl: str, e: dict) -> str:
    why = "; ".join(e.get("failed_checks") or []) or e.get("message")
    return (
        f"{impl} {e['precision']} d={e['head_dim']} causal={e['causal']} ({e['batch']}, {e['n_queries']}, "
        f"{e['n_keys']}): {e['status']}" + (f" — {why}" if why else "")
    )


def _rows(records: list[dict], tensors: tuple[str, ...], tol_key: str) -> list[ErrorRow]:
    rows = []
    for r in records:
        es = r["metrics"].get("entries_detail") or []
        for p in _precisions(e["precision"] for e in es):
            mine = [e for e in es if e["precision"] == p]
            rows.append(
                ErrorRow(
                    implementation=r["cell"]["implementation"],
                    precision=p,
                    errors=tuple((t, _max(e.get(f"{t}_rel_error") for e in mine)) for t in tensors),
                    tolerance=_max(e.get(tol_key) for e in mine),
                    ok=sum(e.get("status") == "ok" for e in mine),
                    entries=len(mine),
                )
            )
    return rows


def correctness_facts(problem: str, records: list[dict]) -> CorrectnessFacts:
    """The facts of flash_forward (O, L; the saved tensors) or flash_backward (dQ, dK, dV)."""
    forward = problem == "flash_forward"
    tensors = FORWARD_TENSORS if forward else BACKWARD_TENSORS
    entries = [(r["cell"]["implementation"], e) for r in records for e in r["metrics"].get("entries_detail") or []]
    checked = [e for _, e in entries if e.get("saved_contract_ok") is not None] if forward else []
    return CorrectnessFacts(
        problem=problem,
        tensors=tensors,
        implementations=tuple(implementation(r) for r in records),
        rows=tuple(_rows(records, tensors, "tolerance_o_l" if forward else "tolerance_grad")),
        entries=len(entries),
        entries_ok=sum(e.get("status") == "ok" for _, e in entries),
        failures=tuple(_failure(i, e) for i, e in entries if e.get("status") != "ok"),
        saved_ok=sum(bool(e["saved_contract_ok"]) for e in checked),
        saved_checked=len(checked),
    )
