"""Analysis of a CUDA memory snapshot (``torch.cuda.memory._snapshot()``), pure functions: ``replay``
rebuilds the active-memory curve as PyTorch's memory viewer draws it; phases are marked by allocations
of ``MARKER_UNIT_BYTES`` × (index + 1) from ``MARKER_FUNCTION``, in the allocation order itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lmperf.core.units import MIB

MARKER_UNIT_BYTES = 512  # a marker's size is also its block size (the allocator rounds to 512)
MARKER_FUNCTION = "_memory_phase_marker"
ACTIVE_STATES = ("active_allocated", "active_pending_free")


@dataclass
class Allocation:
    """One block's life: allocated at trace event ``alloc_event`` (-1: before recording) and freed at
    ``free_event`` (None: still live at the end)."""

    addr: int
    size: int
    alloc_event: int
    free_event: int | None
    frames: list = field(default_factory=list)
    label: dict | None = None

    def live_at(self, event: int) -> bool:
        return self.alloc_event <= event and (self.free_event is None or self.free_event > event)


@dataclass
class Replay:
    """The trace replayed: active bytes after each event, and every allocation."""

    trace: list
    active: list[int]
    initial_active: int
    allocations: list[Allocation]
    dropped_allocations: int  # left live by the trace but absent from the end state: freed unrecorded
    oom_events: list[dict]


def end_state_blocks(snapshot: dict, device: int) -> dict[int, dict]:
    """Blocks active when the snapshot was taken: address -> block."""
    blocks = {}
    for seg in snapshot.get("segments", []):
        if seg.get("device", device) == device:
            blocks.update((b["address"], b) for b in seg.get("blocks", []) if b.get("state") in ACTIVE_STATES)
    return blocks


def replay(snapshot: dict) -> Replay:
    """Replay the busiest device's trace into active bytes per event."""
    traces = snapshot.get("device_traces") or [[]]
    dev = max(range(len(traces)), key=lambda i: len(traces[i]))
    trace, end_blocks = traces[dev], end_state_blocks(snapshot, dev)
    live: dict[int, Allocation] = {}
    by_event: dict[int, Allocation] = {}  # alloc or free_completed event -> its allocation
    allocations, dropped, ooms = [], set(), []
    for i, e in enumerate(trace):
        action = e.get("action")
        if action == "alloc":
            if e["addr"] in live:  # the address was handed out again: its free went unrecorded
                dropped.add(id(live[e["addr"]]))
            a = live[e["addr"]] = by_event[i] = Allocation(e["addr"], e["size"], i, None, list(e.get("frames") or []))
            allocations.append(a)
        elif action == "free_completed":
            a = live.pop(e["addr"], None)
            if a is None:  # allocated before recording began
                a = Allocation(e["addr"], e["size"], -1, None)
                allocations.append(a)
            a.free_event, by_event[i] = i, a
        elif action == "oom":
            ooms.append({"event": i, "requested_bytes": e.get("size"), "device_free_bytes": e.get("device_free")})
    dropped |= {id(a) for a in live.values() if a.addr not in end_blocks}
    allocations = [a for a in allocations if id(a) not in dropped]
    for addr, block in end_blocks.items():
        if addr not in live:  # live throughout the recording; trace sizes are requested sizes
            size = block.get("requested_size") or block["size"]
            allocations.append(Allocation(addr, size, -1, None, block.get("frames") or []))
    current = initial = sum(a.size for a in allocations if a.alloc_event == -1)
    active = []
    for i, e in enumerate(trace):
        a = by_event.get(i)
        if a is not None and id(a) not in dropped:
            current += a.size if e["action"] == "alloc" else -a.size
        active.append(current)
    return Replay(trace, active, initial, allocations, len(dropped), ooms)


def phase_marks(trace: list, phase_names: list[str]) -> list[dict]:
    """The marker allocations in the trace, [{'phase', 'event'}]; they must follow ``phase_names``' order."""
    marks = []
    for i, e in enumerate(trace):
        if e.get("action") != "alloc" or e.get("size", 0) % MARKER_UNIT_BYTES:
            continue
        if any(f.get("name") == MARKER_FUNCTION for f in e.get("frames") or []):
            index = e["size"] // MARKER_UNIT_BYTES - 1
            if index != len(marks):
                raise ValueError(f"phase marker {index} at event {i} out of order (expected {len(marks)})")
            marks.append({"phase": phase_names[index], "event": i})
    return marks


def phase_of_event(marks: list[dict], event: int) -> str:
    """The phase an event falls in: the last mark at or before it ('before recording' for -1)."""
    if event < 0:
        return "before recording"
    return next((m["phase"] for m in reversed(marks) if m["event"] <= event), "before first mark")


def phase_summary(rep: Replay, marks: list[dict]) -> list[dict]:
    """Per phase (mark to next mark): active memory at its start and end, and its peak (MiB)."""

    def before(event: int) -> int:  # a mark's own marker bytes excluded
        return rep.active[event - 1] if event > 0 else rep.initial_active

    return [
        {
            "phase": m["phase"],
            "start_active_mib": before(m["event"]) / MIB,
            "end_active_mib": before(nxt["event"]) / MIB,
            "peak_active_mib": max(rep.active[m["event"] : nxt["event"]]) / MIB,
        }
        for m, nxt in zip(marks, marks[1:])
    ]


def downsample(series: list, max_points: int) -> list[int]:
    """At most ``max_points`` indices into ``series`` that keep its shape: each bucket's minimum and
    maximum, the first and last points and the global maximum (the peak survives)."""
    n = len(series)
    if n <= max_points:
        return list(range(n))
    buckets = (max_points - 3) // 2
    keep = {0, n - 1, max(range(n), key=series.__getitem__)}
    for b in range(buckets):
        window = range(b * n // buckets, (b + 1) * n // buckets)
        keep |= {min(window, key=series.__getitem__), max(window, key=series.__getitem__)}
    return sorted(keep)


def top_frames(frames: list, k: int = 3) -> list[str]:
    """The innermost ``k`` frames outside torch, other packages and the standard library, as
    'file:line function' (snapshot frames run innermost first)."""
    out = []
    for f in frames or []:
        name = f.get("filename", "").replace("\\", "/")
        internal = any(s in name for s in ("/torch/", "/site-packages/", "/dist-packages/"))
        if not name or name.startswith("<") or internal or ("/lib/python3" in name and "/lmperf/" not in name):
            continue
        short = name[name.rindex("lmperf/") :] if "lmperf/" in name else name.rsplit("/", 1)[-1]
        out.append(f"{short}:{f.get('line')} {f.get('name')}")
        if len(out) == k:
            break
    return out


def analyse(snapshot: dict, phase_names: list[str], labels: dict[int, dict], top_k: int, max_points: int) -> dict:
    """Everything the report needs from one snapshot, as a record's metrics. ``labels`` names storages
    live through the step by address ({'category', 'name'})."""
    rep = replay(snapshot)
    marks = phase_marks(rep.trace, phase_names)
    for a in rep.allocations:
        if a.free_event is None and a.addr in labels:
            a.label = labels[a.addr]
    out = {"trace_events": len(rep.trace), "replay_dropped_allocations": rep.dropped_allocations, "phase_marks": marks}
    if not rep.active:
        return {**out, "replay_peak_active_mib": rep.initial_active / MIB, "timeline": {}}
    peak = max(range(len(rep.active)), key=rep.active.__getitem__)
    at_peak = [a for a in rep.allocations if a.live_at(peak)]
    keep = downsample(rep.active, max_points)
    largest = sorted(at_peak, key=lambda a: (-a.size, a.alloc_event))[:top_k]
    return {
        **out,
        "replay_peak_active_mib": rep.active[peak] / MIB,
        "peak_event": peak,
        "peak_phase": phase_of_event(marks, peak),
        "phases": phase_summary(rep, marks),
        "oom_events": [{**o, "phase": phase_of_event(marks, o["event"])} for o in rep.oom_events],
        "timeline": {"event": keep, "active_mib": [round(rep.active[i] / MIB, 4) for i in keep]},  # 4 decimals: ~100 B
        "top_allocations": [
            {
                "size_bytes": a.size,
                "size_mib": a.size / MIB,
                "allocated_in": phase_of_event(marks, a.alloc_event),
                **(a.label or {"category": None, "name": None}),
                "frames": top_frames(a.frames),
            }
            for a in largest
        ],
        "live_allocations_at_peak": len(at_peak),
    }
