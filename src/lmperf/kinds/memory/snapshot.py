"""Analysis of a CUDA memory snapshot (the analytic account it is compared with: lmperf.kinds.memory.account).

Every function here is pure: it reads the dictionary that ``torch.cuda.memory._snapshot()``
returns (the same object ``_dump_snapshot`` pickles for PyTorch's memory viewer) and returns
plain Python values, so it is tested on synthetic snapshots without a GPU.

The snapshot holds the allocator's end state (``segments`` with their ``blocks``) and the
recorded history (``device_traces``: ``alloc``, ``free_requested``, ``free_completed``,
``segment_alloc``/``segment_free``/``segment_map``/``segment_unmap``, ``oom``). ``replay``
rebuilds the active-memory curve the way the memory viewer draws it: an ``alloc`` adds its
block, a ``free_completed`` removes it; allocations made before recording began are recovered
from frees of unseen addresses and from blocks still active at the end. Sizes are requested
sizes, as the trace records them (the allocator's statistics count blocks rounded up to 512
bytes, so ``torch.cuda.max_memory_allocated`` reads slightly higher).

Phase boundaries are marked by the measuring code with tiny marker allocations made from one
function (``MARKER_FUNCTION``) whose size encodes the phase's index (``MARKER_UNIT_BYTES`` ×
(index + 1)): they sit in the allocation order itself, so they survive the asynchronous
device and the autograd engine's thread, and they need no clock shared with the allocator.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

# The analytic account lives in the pure layer (lmperf.kinds.memory.account); re-exported for the cells.
from lmperf.kinds.memory.account import (  # noqa: F401
    MIB,
    analytic_account,
    autocast_weight_copy_bytes,
    inference_transient_bytes,
    matmul_weight_elements,
    residual_stream_bytes,
    saved_activation_bytes,
)

# A marker's requested size, 512·k bytes, is also its block size (the allocator rounds to 512).
MARKER_UNIT_BYTES = 512
MARKER_FUNCTION = "_memory_phase_marker"
ACTIVE_STATES = ("active_allocated", "active_pending_free")
SEGMENT_GROW = ("segment_alloc", "segment_map")
SEGMENT_SHRINK = ("segment_free", "segment_unmap")
LABEL_CATEGORIES = ("parameters", "gradients", "optimizer_state")


@dataclass
class Allocation:
    """One block's life: allocated at trace event ``alloc_event`` (-1: before recording began)
    and freed at ``free_event`` (None: still live when the snapshot was taken)."""

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
    """The trace replayed: active and reserved bytes after each event, and every allocation."""

    trace: list
    active: list[int]
    reserved: list[int]
    initial_active: int
    initial_reserved: int
    allocations: list[Allocation]
    dropped_allocations: int  # trace allocs live at the end per the trace but not per the end state
    oom_events: list[dict]

    @property
    def peak_event(self) -> int | None:
        return max(range(len(self.active)), key=self.active.__getitem__) if self.active else None


def _device_index(snapshot: dict, device: int | None) -> int:
    if device is not None:
        return device
    traces = snapshot.get("device_traces") or [[]]
    return max(range(len(traces)), key=lambda i: len(traces[i]))


def _segments(snapshot: dict, device: int) -> list[dict]:
    return [s for s in snapshot.get("segments", []) if s.get("device", device) == device]


def end_state_blocks(snapshot: dict, device: int | None = None) -> dict[int, dict]:
    """Blocks active when the snapshot was taken: address -> block (size, frames)."""
    dev = _device_index(snapshot, device)
    blocks = {}
    for seg in _segments(snapshot, dev):
        addr = seg["address"]
        for block in seg.get("blocks", []):
            # older snapshots carry no per-block address: blocks tile their segment in order
            block_addr = block.get("address", addr)
            if block.get("state") in ACTIVE_STATES:
                blocks[block_addr] = block
            addr = block_addr + block["size"]
    return blocks


def replay(snapshot: dict, device: int | None = None) -> Replay:
    """Replay ``device_traces`` into active/reserved bytes per event (see the module docstring)."""
    dev = _device_index(snapshot, device)
    traces = snapshot.get("device_traces") or [[]]
    trace = traces[dev] if dev < len(traces) else []
    end_blocks = end_state_blocks(snapshot, dev)
    end_reserved = sum(s["total_size"] for s in _segments(snapshot, dev))

    allocations: list[Allocation] = []
    live: dict[int, Allocation] = {}
    by_event: dict[int, Allocation] = {}  # alloc or free_completed event -> its allocation
    dropped: set[int] = set()  # ids of allocations whose free the trace never saw
    oom_events = []
    grown = shrunk = 0
    for i, e in enumerate(trace):
        action = e.get("action")
        if action == "alloc":
            a = Allocation(e["addr"], e["size"], i, None, list(e.get("frames") or []))
            stale = live.get(e["addr"])
            if stale is not None:  # the address was handed out again: its free went unrecorded
                dropped.add(id(stale))
            live[e["addr"]] = a
            allocations.append(a)
            by_event[i] = a
        elif action == "free_completed":
            a = live.pop(e["addr"], None)
            if a is None:  # allocated before recording began (its stack is gone with the block)
                a = Allocation(e["addr"], e["size"], -1, None, [])
                allocations.append(a)
            a.free_event = i
            by_event[i] = a
        elif action in SEGMENT_GROW:
            grown += e["size"]
        elif action in SEGMENT_SHRINK:
            shrunk += e["size"]
        elif action == "oom":
            oom_events.append({"event": i, "requested_bytes": e.get("size"), "device_free_bytes": e.get("device_free")})

    # An allocation the trace leaves live but the end state does not hold was freed unrecorded
    # (e.g. a stale entry left in the ring buffer from before recording): drop it from the curve.
    if "segments" in snapshot:
        dropped |= {id(a) for a in live.values() if a.addr not in end_blocks}
    allocations = [a for a in allocations if id(a) not in dropped]
    for addr, block in end_blocks.items():
        if addr not in live:  # live throughout the recording
            size = block.get("requested_size") or block["size"]  # trace sizes are requested sizes
            allocations.append(Allocation(addr, size, -1, None, list(block.get("frames") or [])))

    initial_active = sum(a.size for a in allocations if a.alloc_event == -1)
    initial_reserved = end_reserved - grown + shrunk
    active, reserved = [], []
    current, current_reserved = initial_active, initial_reserved
    for i, e in enumerate(trace):
        action = e.get("action")
        a = by_event.get(i)
        if a is not None and id(a) not in dropped:
            current += a.size if action == "alloc" else -a.size
        elif action in SEGMENT_GROW:
            current_reserved += e["size"]
        elif action in SEGMENT_SHRINK:
            current_reserved -= e["size"]
        active.append(current)
        reserved.append(current_reserved)
    return Replay(trace, active, reserved, initial_active, initial_reserved, allocations, len(dropped), oom_events)


def phase_marks(trace: list, phase_names: list[str]) -> list[dict]:
    """Marker allocations found in the trace, as [{'phase', 'event'}] in trace order.

    A marker is an ``alloc`` whose frames include ``MARKER_FUNCTION``; its size names the phase
    (index = size / MARKER_UNIT_BYTES - 1). Markers must appear in the order of ``phase_names``.
    """
    marks = []
    for i, e in enumerate(trace):
        if e.get("action") != "alloc" or e.get("size", 0) % MARKER_UNIT_BYTES:
            continue
        if not any(f.get("name") == MARKER_FUNCTION for f in e.get("frames") or []):
            continue
        index = e["size"] // MARKER_UNIT_BYTES - 1
        if not 0 <= index < len(phase_names):
            raise ValueError(f"marker of size {e['size']} at event {i} names no phase of {phase_names}")
        marks.append({"phase": phase_names[index], "index": index, "event": i})
    if [m["index"] for m in marks] != list(range(len(marks))):
        raise ValueError(f"phase markers out of order: {[(m['phase'], m['event']) for m in marks]}")
    return [{"phase": m["phase"], "event": m["event"]} for m in marks]


def phase_of_event(marks: list[dict], event: int) -> str:
    """The phase an event falls in: the last mark at or before it ('before recording' for -1)."""
    if event < 0:
        return "before recording"
    phase = "before first mark"
    for m in marks:
        if m["event"] <= event:
            phase = m["phase"]
    return phase


def active_before(rep: Replay, event: int) -> int:
    """Active bytes just before an event (a mark's own marker bytes excluded)."""
    return rep.active[event - 1] if event > 0 else rep.initial_active


def phase_summary(rep: Replay, marks: list[dict]) -> list[dict]:
    """Per phase (mark to next mark): active memory at its start and end, and its peak."""
    out = []
    for m, nxt in zip(marks, marks[1:]):
        lo, hi = m["event"], nxt["event"]
        window = range(lo, hi)
        peak_event = max(window, key=rep.active.__getitem__)
        out.append(
            {
                "phase": m["phase"],
                "start_event": lo,
                "end_event": hi,
                "start_active_mib": active_before(rep, lo) / MIB,
                "end_active_mib": active_before(rep, hi) / MIB,
                "peak_active_mib": rep.active[peak_event] / MIB,
                "peak_event": peak_event,
                "allocated_mib": sum(a.size for a in rep.allocations if lo <= a.alloc_event < hi) / MIB,
                "freed_mib": sum(
                    a.size for a in rep.allocations if a.free_event is not None and lo <= a.free_event < hi
                )
                / MIB,
            }
        )
    return out


def downsample(n: int, primary: list, max_points: int) -> list[int]:
    """At most ``max_points`` indices into a series of length ``n`` that keep its shape:
    per bucket the minimum and maximum of ``primary`` (in order), plus the first, last and
    global-maximum points, so the peak survives."""
    if max_points < 4:
        raise ValueError("max_points must be at least 4")
    if n <= max_points:
        return list(range(n))
    buckets = (max_points - 3) // 2
    keep = {0, n - 1, max(range(n), key=primary.__getitem__)}
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if hi > lo:
            keep.add(min(range(lo, hi), key=primary.__getitem__))
            keep.add(max(range(lo, hi), key=primary.__getitem__))
    return sorted(keep)


def is_internal_frame(filename: str) -> bool:
    """Frames of torch, other installed packages and the standard library (not the model's code)."""
    f = filename.replace("\\", "/")
    return (
        not f
        or f.startswith("<")
        or "/torch/" in f
        or "/site-packages/" in f
        or "/dist-packages/" in f
        or ("/lib/python3" in f and "/lmperf/" not in f)
    )


def short_filename(filename: str) -> str:
    f = filename.replace("\\", "/")
    return f[f.rindex("lmperf/") :] if "lmperf/" in f else f.rsplit("/", 1)[-1]


def top_frames(frames: list, k: int = 3) -> list[str]:
    """The innermost ``k`` frames outside torch internals, as 'file:line function'.

    Snapshot frames run innermost first; the first frame of our own code is the model's line.
    """
    out = []
    for f in frames or []:
        if is_internal_frame(f.get("filename", "")):
            continue
        out.append(f"{short_filename(f['filename'])}:{f.get('line')} {f.get('name')}")
        if len(out) == k:
            break
    return out


def attach_labels(rep: Replay, marks: list[dict], labels: list[dict]) -> None:
    """Name allocations from tensors the measuring code saw at a phase mark.

    ``labels``: [{'mark': phase name, 'addr': storage address, 'category', 'name'}]. A label
    applies to the allocation at that address that was live at the mark's event.
    """
    mark_event = {m["phase"]: m["event"] for m in marks}
    by_addr = collections.defaultdict(list)
    for a in rep.allocations:
        by_addr[a.addr].append(a)
    for label in labels:
        event = mark_event.get(label["mark"])
        if event is None:
            continue
        for a in by_addr.get(label["addr"], []):
            if a.live_at(event):
                a.label = {"category": label["category"], "name": label["name"]}
                break


def live_at(rep: Replay, event: int) -> list[Allocation]:
    return [a for a in rep.allocations if a.live_at(event)]


def describe(a: Allocation, marks: list[dict], frames_per_allocation: int = 3) -> dict:
    return {
        "size_bytes": a.size,
        "size_mib": a.size / MIB,
        "allocated_in": phase_of_event(marks, a.alloc_event),
        "alloc_event": a.alloc_event,
        "category": a.label["category"] if a.label else None,
        "name": a.label["name"] if a.label else None,
        "frames": top_frames(a.frames, frames_per_allocation),
    }


def allocations_of_size(rep: Replay, size: int, marks: list[dict]) -> dict:
    """Every allocation of exactly ``size`` bytes: how many, in which phases, from which lines."""
    hits = [a for a in rep.allocations if a.size == size]
    sites = collections.Counter(" ← ".join(top_frames(a.frames, 2)) or "(no Python frames)" for a in hits)
    phases = collections.Counter(phase_of_event(marks, a.alloc_event) for a in hits)
    return {
        "size_bytes": size,
        "count": len(hits),
        "by_phase": dict(phases),
        "sites": [{"frames": s, "count": n} for s, n in sites.most_common(5)],
    }


def analyse(
    snapshot: dict,
    phase_names: list[str],
    labels: list[dict] = (),
    top_k: int = 10,
    max_points: int = 2000,
    match_sizes: dict[str, int] | None = None,
    device: int | None = None,
) -> dict:
    """Everything the report needs from one snapshot, as a JSON-able metrics dict."""
    rep = replay(snapshot, device)
    marks = phase_marks(rep.trace, phase_names)
    attach_labels(rep, marks, list(labels))
    out: dict = {
        "trace_events": len(rep.trace),
        "replay_dropped_allocations": rep.dropped_allocations,
        "phase_marks": marks,
    }
    if not rep.active:
        out.update(replay_peak_active_mib=rep.initial_active / MIB, timeline={})
        return out
    peak = rep.peak_event
    out.update(
        replay_initial_active_mib=rep.initial_active / MIB,
        replay_end_active_mib=rep.active[-1] / MIB,
        replay_peak_active_mib=rep.active[peak] / MIB,
        replay_peak_reserved_mib=max(rep.reserved) / MIB,
        peak_event=peak,
        peak_phase=phase_of_event(marks, peak),
        phases=phase_summary(rep, marks),
        oom_events=[{**o, "phase": phase_of_event(marks, o["event"])} for o in rep.oom_events],
    )
    keep = downsample(len(rep.active), rep.active, max_points)
    # MiB to 4 decimals (~100 bytes) keeps the record small
    out["timeline"] = {
        "event": keep,
        "active_mib": [round(rep.active[i] / MIB, 4) for i in keep],
        "reserved_mib": [round(rep.reserved[i] / MIB, 4) for i in keep],
    }
    at_peak = live_at(rep, peak)
    largest = sorted(at_peak, key=lambda a: (-a.size, a.alloc_event))[:top_k]
    out["top_allocations"] = [describe(a, marks) for a in largest]
    breakdown = {c: 0 for c in (*LABEL_CATEGORIES, "other")}
    for a in at_peak:
        breakdown[a.label["category"] if a.label else "other"] += a.size
    out["breakdown_at_peak_mib"] = {k: v / MIB for k, v in breakdown.items()}
    out["live_allocations_at_peak"] = len(at_peak)
    if match_sizes:
        out["size_matches"] = {name: allocations_of_size(rep, size, marks) for name, size in match_sizes.items()}
    return out
