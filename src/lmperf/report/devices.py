"""Devices side by side, and where a grid's time went: pure functions over records (no torch).

``across_devices`` is the **Across devices** section of the front page (``report/answers.md``):
every cell measured on two or more devices under ``results/``, side by side, with the ratio to
the report's own device and sentences generated from those ratios — which device is faster
where, by how much, and whether the measured ratio follows the datasheets' peak-FLOP/s ratio
(compute-bound) or their memory-bandwidth ratio (bandwidth-bound); ``lmperf.core.peaks`` holds those.

``timing_lines`` gives the report header the grid's wall time, per-kind totals and the median
per-cell start-up, from the provenance every record carries (``process_start_time``,
``process_age_s``) and e2e's start-up metrics.
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import math
import statistics
from pathlib import Path

from lmperf.core.peaks import PEAKS
from lmperf.core.record import load_record
from lmperf.core.sizes import SIZES, config_from_name, parameter_count
from lmperf.kinds.flash.products import record_products, sdpa_products

SAME = 0.03  # speed-ups within 3% of 1 read as "about as fast"
# A cell is "launch-bound" when doubling the context raises its forward time by less than this
# factor: the GPU's work doubles, so the time is set by something else (kernel launches). Used by each
# device's benchmarking_script (lmperf.kinds.e2e.report) and by the comparison across devices below.
LAUNCH_BOUND_GROWTH = 1.3


# ---------------------------------------------------------------------------------------------
# Loading


def device_record_paths(results_root: Path) -> dict[str, list[str]]:
    """Record paths per device slug, results/<device>/<kind>/*.json (devices in name order)."""
    out = {}
    for directory in sorted(p for p in Path(results_root).iterdir() if p.is_dir()):
        paths = sorted(glob.glob(str(directory / "*" / "*.json")))
        if paths:
            out[directory.name] = paths
    return out


def device_records(results_root: Path) -> dict[str, list[dict]]:
    """Records per device slug (devices in name order)."""
    return {d: [load_record(p) for p in paths] for d, paths in device_record_paths(results_root).items()}


def attention_of(record: dict) -> str:
    """The attention implementation a cell's model used (its settings; ``plain`` by default)."""
    return record["provenance"]["settings"].get("attention", "plain")


def compared_cell(record: dict) -> str:
    """What a record measured, as compared across devices: its cell, with the attention a whole-model
    cell ran when it is not the course's `plain` (the e2e cells of attention_compare share their cell
    with the plain one; their settings tell them apart, as in lmperf.core.record.cell_key)."""
    cell = dict(record["cell"])
    if attention_of(record) != "plain":
        cell["attention"] = attention_of(record)
    return json.dumps(cell, sort_keys=True)


def _by_cell(records: list[dict], kind: str) -> dict[str, dict]:
    return {compared_cell(r): r for r in records if r["kind"] == kind}


def _shared(by_device: dict[str, list[dict]], kind: str) -> tuple[list[str], dict[str, dict[str, dict]]]:
    """Cells of ``kind`` measured on two or more devices, and each device's records by cell."""
    cells = {device: _by_cell(records, kind) for device, records in by_device.items()}
    counts: dict[str, int] = {}
    for device_cells in cells.values():
        for key in device_cells:
            counts[key] = counts.get(key, 0) + 1
    return [k for k, n in counts.items() if n >= 2], cells


# ---------------------------------------------------------------------------------------------
# Formatting


def fmt(x, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if isinstance(x, str):
        return x
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def pct(x) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def ratio(x) -> str:
    return "—" if x is None else f"{x:.2f}×"


FOLD_ROWS = 12  # longer tables are folded (<details>) under their sentences


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(v if isinstance(v, str) else fmt(v) for v in row) + " |" for row in rows]
    text = "\n".join(lines) + "\n"
    if len(rows) > FOLD_ROWS:
        text = f"<details><summary>All {len(rows)} rows</summary>\n\n{text}\n</details>\n"
    return text


def _div(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def _model_rank(name: str) -> float:
    try:
        return parameter_count(config_from_name(name)) if name in SIZES else math.inf
    except (KeyError, ValueError):
        return math.inf


def _cell_sort_key(cell: dict):
    key = []
    for name, value in cell.items():
        if name == "model":
            key.append((name, 0, _model_rank(value), str(value)))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            key.append((name, 0, float(value), ""))
        else:
            key.append((name, 1, 0.0, str(value)))
    return tuple(key)


# ---------------------------------------------------------------------------------------------
# Sentences


def speed_words(speedup: float) -> str:
    """How much faster a device is than the reference for a time ratio t_ref / t_dev."""
    if abs(speedup - 1) <= SAME:
        return "about as fast as"
    if speedup > 1:
        return f"{speedup:.2f}× as fast as"
    return f"slower than ({1 / speedup:.2f}× the time of)"


def bound_words(speedup: float, flops_ratio: float | None, bandwidth_ratio: float | None) -> str:
    """Compute- or bandwidth-bound: which datasheet ratio the measured speed-up is nearer (log scale)."""
    if not flops_ratio or not bandwidth_ratio:
        return "no datasheet rates for both devices, so the records cannot say what bounds them"
    if abs(math.log(flops_ratio / bandwidth_ratio)) < 0.05:
        return (
            f"the datasheets give both devices the same ratio of peak FLOP/s and memory bandwidth "
            f"({flops_ratio:.2f}×), so the records cannot tell compute- from bandwidth-bound"
        )
    to_flops = abs(math.log(speedup / flops_ratio))
    to_bandwidth = abs(math.log(speedup / bandwidth_ratio))
    rates = f"peak FLOP/s ratio {flops_ratio:.2f}×, memory-bandwidth ratio {bandwidth_ratio:.2f}×"
    low, high = sorted((flops_ratio, bandwidth_ratio))
    if speedup > high * 1.1 or speedup < low / 1.1:
        return (
            f"outside both datasheet ratios ({rates}): something else differs between the runs "
            "(clocks, power limits, library versions)"
        )
    if min(to_flops, to_bandwidth) > 0.6 * max(to_flops, to_bandwidth):
        return f"between the datasheet ratios ({rates}): neither compute nor bandwidth alone bounds these cells"
    if to_flops < to_bandwidth:
        return f"which follows the peak FLOP/s ratio: compute-bound (or launch-bound) here ({rates})"
    return f"which follows the memory-bandwidth ratio: bandwidth-bound here ({rates})"


def datasheet_ratios(ref: str, dev: str, precision: str | None) -> tuple[float | None, float | None]:
    a, b = PEAKS.get(ref), PEAKS.get(dev)
    if not a or not b:
        return None, None
    flops = _div(b.get(precision or "fp32"), a.get(precision or "fp32"))
    return flops, _div(b.get("hbm_gbps"), a.get("hbm_gbps"))


def summary_sentence(
    what: str, ref: str, dev: str, speedups: list[float], precision: str | None, which: str = "", why: str = ""
) -> str:
    """'- WHAT (PRECISION)WHICH: DEV is … REF on the median cell (range …), WHY.'; ``which`` narrows the
    cells (e.g. ', cells launch-bound on neither device'); ``why`` defaults to which datasheet ratio the
    median follows (``bound_words``)."""
    if not speedups:
        return ""
    med = statistics.median(speedups)
    spread = (
        f" (range {min(speedups):.2f}–{max(speedups):.2f}× over {len(speedups)} cells)" if len(speedups) > 1 else ""
    )
    if not why:
        flops, bandwidth = datasheet_ratios(ref, dev, precision)
        why = bound_words(med, flops, bandwidth)
    return (
        f"- {what}{f' ({precision})' if precision else ''}{which}: `{dev}` is {speed_words(med)} `{ref}` on the median "
        f"cell{spread}, {why}."
    )


# ---------------------------------------------------------------------------------------------
# Tables, one per kind


def _metric(record: dict | None, key: str):
    if record is None:
        return None
    value = record.get("metrics", {}).get(key)
    return value if isinstance(value, (int, float)) else None


def _label(cell: dict, keys: list[str]) -> str:
    parts = []
    for key in keys:
        if key in cell and cell[key] is not None:
            value = cell[key]
            parts.append(
                {
                    "context_length": f"ctx{value}",
                    "warmup_steps": f"w{value}",
                    "head_dim": f"d{value}",
                    "sequence_length": f"N={value}",
                }.get(key, str(value))
            )
    return " ".join(parts)


def _rows(shared: list[str], cells: dict[str, dict[str, dict]]) -> list[tuple[dict, dict[str, dict]]]:
    rows = [(json.loads(k), {d: c.get(k) for d, c in cells.items()}) for k in shared]
    return sorted(rows, key=lambda row: _cell_sort_key(row[0]))


def _group_sentences(what, ref, devices, rows, time_key, precision_of, which: str = "", why: str = "") -> list[str]:
    """One sentence per (other device, precision): median of t_ref / t_dev over the rows."""
    lines = []
    for dev in devices[1:]:
        by_precision: dict[str, list[float]] = {}
        for cell, recs in rows:
            s = _div(time_key(recs.get(ref)), time_key(recs.get(dev)))
            if s is not None:
                by_precision.setdefault(precision_of(cell), []).append(s)
        for precision, speedups in sorted(by_precision.items()):
            lines.append(summary_sentence(what, ref, dev, speedups, precision, which, why))
    return [line for line in lines if line]


def launch_bound_test(records: list[dict]) -> dict[str, bool]:
    """Whether each e2e cell (``compared_cell`` key) of one device is launch-bound there: doubling the
    context, all else equal, raises the forward's median time by less than LAUNCH_BOUND_GROWTH. A cell
    without a measured cell at twice its context (the longest context) is not launch-bound when its
    own doubling, from half its context, grew the time by LAUNCH_BOUND_GROWTH or more: the GPU's work
    set the time already at half the context, and there is more of it per kernel launch here. Other
    cells are untested (absent)."""
    forward = {}
    for r in records:
        if r["kind"] == "e2e" and _metric(r, "forward_ms_median"):
            forward[compared_cell(r)] = r["metrics"]["forward_ms_median"]
    tested = {}
    for key, ms in forward.items():
        cell = json.loads(key)
        doubled = json.dumps({**cell, "context_length": 2 * cell["context_length"]}, sort_keys=True)
        halved = json.dumps({**cell, "context_length": cell["context_length"] // 2}, sort_keys=True)
        if doubled in forward:
            tested[key] = forward[doubled] / ms < LAUNCH_BOUND_GROWTH
        elif halved in forward and ms / forward[halved] >= LAUNCH_BOUND_GROWTH:
            tested[key] = False
    return tested


def e2e_part(by_device: dict[str, list[dict]], devices: list[str]) -> str:
    shared, cells = _shared(by_device, "e2e")
    rows = _rows(shared, cells)
    if not rows:
        return ""
    ref, others = devices[0], devices[1:]
    tests = {d: launch_bound_test(by_device[d]) for d in devices}
    header = ["cell"]
    for name in ("forward", "backward", "training step"):
        header += [f"{name} ms `{d}`" for d in devices]
    header += [f"`{d}` speed-up" for d in others] + [f"MFU `{d}`" for d in devices] + ["launch-bound"]
    body = []
    gpu_rows, launch_rows = [], []
    for cell, recs in rows:
        key = json.dumps(cell, sort_keys=True)  # the row's compared_cell key
        on = [d for d in devices if tests[d].get(key)]
        if on:
            launch_rows.append((cell, recs))
            verdict = "on " + ", ".join(f"`{d}`" for d in on)
        elif all(key in tests[d] for d in devices):
            gpu_rows.append((cell, recs))
            verdict = "no"
        else:  # no cell at twice the context on some device: left out of both sentences
            verdict = "untested"
        row = [_label(cell, ["model", "context_length", "precision", "compile", "warmup_steps", "attention"])]
        for metric in ("forward_ms_mean", "backward_ms_mean", "training_step_ms_mean"):
            row += [_metric(recs[d], metric) for d in devices]
        row += [
            ratio(_div(_metric(recs[ref], "training_step_ms_mean"), _metric(recs[d], "training_step_ms_mean")))
            for d in others
        ]
        row += [pct(_metric(recs[d], "training_step_mfu")) for d in devices]
        body.append(row + [verdict])
    launch_why = (
        f"and on at least one device their forward grows by less than {LAUNCH_BOUND_GROWTH:.1f}× when the context "
        "doubles: the CPU launching kernels sets their time, so the ratio compares the hosts, not the GPUs' datasheets"
    )
    sentences = []
    for group, which, why in (
        (gpu_rows, ", cells launch-bound on neither device", ""),
        (launch_rows, ", launch-bound cells", launch_why),
    ):
        sentences += _group_sentences(
            "End-to-end training step",
            ref,
            devices,
            group,
            lambda r: _metric(r, "training_step_ms_mean"),
            lambda c: c.get("precision"),
            which,
            why,
        )
    untested = len(rows) - len(gpu_rows) - len(launch_rows)
    if untested:
        sentences.append(
            f"- {untested} of {len(rows)} cells are in neither sentence: on some device the launch-bound test "
            "cannot tell (no cell at twice their context, and at the longest context a doubling that grew the "
            "time by less than the factor, or no cell at half of it; table, last column)."
        )
    return (
        f"### End-to-end steps (mean ms; speed-up = time on `{ref}` / time on the other)\n\n"
        + "\n".join(sentences)
        + ("\n\n" if sentences else "")
        + table(header, body)
    )


def _phase(record: dict | None, phase: str) -> dict:
    if record is None:
        return {}
    phases = record.get("metrics", {}).get("phases")
    return phases.get(phase, {}) if isinstance(phases, dict) else {}


def nsys_part(by_device: dict[str, list[dict]], devices: list[str]) -> str:
    shared, cells = _shared(by_device, "nsys")
    rows = _rows(shared, cells)
    if not rows:
        return ""
    ref, others = devices[0], devices[1:]
    header = ["cell", "phase"] + [f"kernel ms/step `{d}`" for d in devices] + [f"`{d}` speed-up" for d in others]
    header += [f"matmul share `{d}`" for d in devices] + [f"top kernel share `{d}`" for d in devices]
    body, phase_rows = [], []
    for cell, recs in rows:
        phases = sorted({p for d in devices for p in (_phase_names(recs[d]))}, key=_phase_order)
        for phase in phases:
            ms = {d: _phase(recs[d], phase).get("kernel_ms_per_step") for d in devices}
            tops = {d: (_phase(recs[d], phase).get("top_kernels") or [{}])[0].get("share") for d in devices}
            body.append(
                [_label(cell, ["model", "context_length", "precision", "mode"]), phase]
                + [ms[d] for d in devices]
                + [ratio(_div(ms[ref], ms[d])) for d in others]
                + [pct(_phase(recs[d], phase).get("matmul_share")) for d in devices]
                + [pct(tops[d]) for d in devices]
            )
            phase_rows.append(({**cell, "phase": phase}, {d: {"ms": ms[d]} for d in devices}))
    sentences = []
    for phase in [p for p in PHASE_ORDER if any(c["phase"] == p for c, _ in phase_rows)]:
        subset = [(c, r) for c, r in phase_rows if c["phase"] == phase]
        sentences += _group_sentences(
            f"Profiled GPU kernel time per step, {phase}",
            ref,
            devices,
            subset,
            lambda r: (r or {}).get("ms"),
            lambda c: c.get("precision"),
        )
    return (
        "### Nsight Systems kernel time and top-kernel shares\n\n"
        + "\n".join(sentences)
        + ("\n\n" if sentences else "")
        + table(header, body)
    )


PHASE_ORDER = ["forward", "backward", "optimizer_step"]


def _phase_order(phase: str):
    return (PHASE_ORDER.index(phase) if phase in PHASE_ORDER else len(PHASE_ORDER), phase)


def _phase_names(record: dict | None) -> list[str]:
    phases = (record or {}).get("metrics", {}).get("phases")
    return (
        [p for p, v in phases.items() if isinstance(v, dict) and "kernel_ms_per_step" in v]
        if isinstance(phases, dict)
        else []
    )


def memory_part(by_device: dict[str, list[dict]], devices: list[str]) -> str:
    shared, cells = _shared(by_device, "memory")
    rows = _rows(shared, cells)
    if not rows:
        return ""
    ref, others = devices[0], devices[1:]
    header = ["cell"] + [f"peak MiB `{d}`" for d in devices] + [f"`{d}` / `{ref}`" for d in others]
    body, sentences = [], []
    for cell, recs in rows:
        peaks = {d: _metric(recs[d], "peak_allocated_mib") for d in devices}
        body.append(
            [_label(cell, ["model", "context_length", "precision", "mode"])]
            + [peaks[d] for d in devices]
            + [ratio(_div(peaks[d], peaks[ref])) for d in others]
        )
    for dev in others:
        rel = [
            abs(_div(_metric(r[dev], "peak_allocated_mib"), _metric(r[ref], "peak_allocated_mib")) - 1)
            for _, r in rows
            if _div(_metric(r[dev], "peak_allocated_mib"), _metric(r[ref], "peak_allocated_mib"))
        ]
        if rel:
            worst = max(rel)
            verdict = (
                "the same allocations, as expected of the same program"
                if worst < 0.01
                else "the peaks differ: allocator or library workspaces differ between the devices"
            )
            sentences.append(
                f"- Memory peaks: `{dev}` and `{ref}` agree within {100 * worst:.1f}% over {len(rel)} "
                f"cells — {verdict}."
            )
    return (
        "### Memory peaks (allocated, MiB)\n\n"
        + "\n".join(sentences)
        + ("\n\n" if sentences else "")
        + table(header, body)
    )


def _boundary(records: list[dict]) -> tuple[int | None, int | None]:
    """(longest sequence that ran, shortest that ran out of memory) among one group's records."""
    ok = [r["cell"]["sequence_length"] for r in records if r["status"] == "ok"]
    oom = [r["cell"]["sequence_length"] for r in records if r["status"] == "oom"]
    return (max(ok) if ok else None), (min(oom) if oom else None)


# implementations that are our Triton kernels, by kind (their records say what they multiplied in)
TRITON_IMPLEMENTATIONS = {"attention": "flash", "flash": "flash_triton"}


def fp32_products_line(by_device: dict[str, list[dict]], devices: list[str], kind: str) -> str:
    """A line saying what each implementation's fp32 rows of ``kind`` multiplied in, from the records:
    our kernels by their ``dot_precision`` (lmperf.kinds.flash.products.record_products), SDPA by its
    backend and the device (sdpa_products), PyTorch's own matmuls by ``matmul_allow_tf32`` in the
    provenance. Per device where the devices differ; '' without fp32 records."""
    labels: dict[str, dict[str, str]] = {}
    for d in devices:
        recs = [r for r in by_device.get(d, []) if r["kind"] == kind and r["cell"].get("precision") == "fp32"]
        for impl in sorted({str(r["cell"].get("implementation")) for r in recs}):
            mine = [r for r in recs if r["cell"].get("implementation") == impl and r["status"] == "ok"]
            if not mine:
                continue  # it did not run in fp32 here (e.g. cuDNN's SDPA refuses fp32)
            if impl == TRITON_IMPLEMENTATIONS.get(kind):
                found = sorted({p[0] for p in map(record_products, mine) if p})
            elif impl.startswith("sdpa"):
                found = [sdpa_products(recs, impl) or "unknown"]
            else:
                found = sorted({"TF32" if r["provenance"].get("matmul_allow_tf32") else "IEEE" for r in mine})
            if found:
                labels.setdefault(impl, {})[d] = " or ".join(found)
    if not labels:
        return ""
    parts = []
    for impl, by_dev in labels.items():
        if len(set(by_dev.values())) == 1:
            parts.append(f"`{impl}` {next(iter(by_dev.values()))}")
        else:
            parts.append(f"`{impl}` " + ", ".join(f"{v} (`{d}`)" for d, v in by_dev.items()))
    return (
        "- fp32 rows: fp32 inputs, multiplied in " + "; ".join(parts) + " (from the records: our kernels' "
        "`dot_precision`, SDPA's backend on this GPU, PyTorch's `matmul_allow_tf32`; 3xTF32 is fp32-accurate, "
        "TF32 is not; each device's report says more)."
    )


def attention_part(by_device: dict[str, list[dict]], devices: list[str]) -> str:
    shared, cells = _shared(by_device, "attention")
    if not shared:
        return ""
    ref, others = devices[0], devices[1:]
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for key in shared:
        cell = json.loads(key)
        group = (cell["implementation"], cell["precision"], cell["head_dim"])
        for d in devices:
            if key in cells[d]:
                groups.setdefault(group, {}).setdefault(d, []).append(cells[d][key])
    header = ["implementation", "precision", "d"] + [f"longest N run / first N OOM `{d}`" for d in devices]
    body, differs = [], []
    for group in sorted(groups):
        marks = {d: _boundary(groups[group].get(d, [])) for d in devices}
        body.append(
            [group[0], group[1], str(group[2])]
            + [f"{fmt(marks[d][0])} / {fmt(marks[d][1]) if marks[d][1] else 'none'}" for d in devices]
        )
        differs += [(group, d) for d in others if marks[d] != marks[ref] and groups[group].get(d)]
    sentences = []
    for dev in others:
        n = sum(1 for _, d in differs if d == dev)
        total = sum(1 for g in groups.values() if g.get(dev) and g.get(ref))
        sentences.append(
            f"- Attention out-of-memory boundary: `{dev}` and `{ref}` "
            + (
                f"agree in all {total} groups."
                if n == 0
                else f"differ in {n} of {total} groups (each device's memory decides where the "
                "(N×N) scores stop fitting)."
            )
        )
    rows = _rows(shared, cells)
    sentences += _group_sentences(
        "Attention forward pass",
        ref,
        devices,
        rows,
        lambda r: _metric(r, "forward_ms_mean"),
        lambda c: c.get("precision"),
    )
    products = fp32_products_line(by_device, devices, "attention")
    sentences += [products] if products else []
    return "### Attention: out-of-memory boundary and speed\n\n" + "\n".join(sentences) + "\n\n" + table(header, body)


def flash_part(by_device: dict[str, list[dict]], devices: list[str]) -> str:
    shared, cells = _shared(by_device, "flash")
    rows = [(c, r) for c, r in _rows(shared, cells) if c.get("test") == "benchmark"]
    ref, others = devices[0], devices[1:]
    parts = []
    if rows:
        header = ["cell"] + [f"fwd+bwd TFLOP/s `{d}`" for d in devices] + [f"`{d}` / `{ref}`" for d in others]
        body = []
        for cell, recs in rows:
            tf = {d: _metric(recs[d], "forward_backward_tflops") for d in devices}
            body.append(
                [_label(cell, ["implementation", "precision", "head_dim", "sequence_length"])]
                + [tf[d] for d in devices]
                + [ratio(_div(tf[d], tf[ref])) for d in others]
            )
        sentences = _group_sentences(
            "Attention kernels forward+backward (flash benchmark)",
            ref,
            devices,
            rows,
            lambda r: _metric(r, "forward_backward_ms_median"),
            lambda c: c.get("precision"),
        )
        products = fp32_products_line(by_device, devices, "flash")
        sentences += [products] if products else []
        parts.append(
            "### FlashAttention benchmark (forward+backward TFLOP/s)\n\n"
            + "\n".join(sentences)
            + ("\n\n" if sentences else "")
            + table(header, body)
        )
    boards = {d: cells[d].get(json.dumps({"test": "leaderboard"})) for d in devices}
    if sum(1 for b in boards.values() if b) >= 2:
        keys = [
            ("flash_triton_forward_backward_ms_median", "ours fwd+bwd ms"),
            ("ratio_flash_triton_over_sdpa_flash", "ours / SDPA flash (time)"),
            ("ratio_flash_triton_over_sdpa_cudnn", "ours / SDPA cuDNN (time)"),
        ]
        body = [[label] + [_metric(boards[d], key) for d in devices] for key, label in keys]
        sentences = []
        for dev in others:
            s = _div(_metric(boards[ref], keys[0][0]), _metric(boards[dev], keys[0][0]))
            if s is not None:
                sentences.append(
                    summary_sentence("Leaderboard configuration, our Triton kernel", ref, dev, [s], "bf16")
                )
        parts.append(
            "### Leaderboard configuration\n\n"
            + "\n".join(sentences)
            + ("\n\n" if sentences else "")
            + table(["metric"] + [f"`{d}`" for d in devices], body)
        )
    return "\n".join(parts)


def commits_words(records: list[dict]) -> str:
    """', commit `0aa86bc`' or ', commits `0aa86bc` (240), `831eca9` (1)' ('' where none is known)."""
    counts: dict[str, int] = {}
    for r in records:
        commit = r["provenance"].get("git_commit") or "unknown"
        short = commit[:7] if commit != "unknown" else "unknown"
        dirty = " (dirty)" if r["provenance"].get("git_dirty") else ""
        counts[short + dirty] = counts.get(short + dirty, 0) + 1
    if set(counts) == {"unknown"}:
        return ""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if len(ranked) == 1:
        return f", commit `{ranked[0][0]}`"
    return ", commits " + ", ".join(f"`{c}` ({n})" for c, n in ranked)


COMPARED_KINDS = ("e2e", "nsys", "memory", "attention", "flash")


def code_sentence(
    by_device: dict[str, list[dict]], devices: list[str], stale: set[tuple[str, str, str]] = frozenset()
) -> str:
    """Whether the compared cells ran the same code on every device, and the commits each device's
    records came from; '' when no cell is shared. Two records ran the same code when their code
    versions are equal, or when neither is in ``stale`` ((device, kind, compared_cell) of the records
    measured with older code than the current): both ran the current code,
    whatever label their commit's code wrote (a record from a clean commit whose cell code is
    unchanged since is current)."""
    total = differ = 0
    for kind in COMPARED_KINDS:
        shared, cells = _shared(by_device, kind)
        for key in shared:
            present = [d for d in devices if key in cells[d]]
            versions = [cells[d][key]["provenance"].get("code_version") for d in present]
            equal = None not in versions and len(set(versions)) == 1
            current = not any((d, kind, key) in stale for d in present)
            total += 1
            differ += not (equal or current)
    if not total:
        return ""

    by_commit = "; ".join(f"`{d}`{commits_words(by_device.get(d, []))}" for d in devices)
    if not differ:
        return (
            "Every compared cell ran the same code on each device (equal code versions, or the current code on "
            f"both). Records by commit: {by_commit}.\n"
        )
    return (
        f"**{differ} of {total} compared cells ran different code on different devices** (their code versions "
        "differ, and a record was measured with older code than the current), so their ratios compare code as well as devices; each "
        f"device's report header lists its records measured with older code. Records by commit: {by_commit}.\n"
    )


def across_devices(
    results_root: Path, reference: str, report_dir: Path | None = None, stale: list[str] | tuple[str, ...] = ()
) -> str:
    """The **Across devices** section: every cell measured on two or more devices, side by side.

    ``report_dir`` (the front page's folder, where ``<device>/answers.md`` are) adds links to each
    device's own report; ``stale``, the record paths of any device measured with older code.
    """
    # The CPU grid (results/cpu/, git-ignored) only proves that the pipeline runs: it is no device to set
    # beside a GPU, and a front page rebuilt where a CPU run left it must not depend on it or link its
    # uncommitted report.
    paths = {d: p for d, p in device_record_paths(Path(results_root)).items() if d != "cpu" or d == reference}
    by_device = {d: [load_record(p) for p in device_paths] for d, device_paths in paths.items()}
    stale_paths = {Path(p).resolve() for p in stale}
    stale_cells = {
        (d, record["kind"], compared_cell(record))
        for d, device_paths in paths.items()
        for path, record in zip(device_paths, by_device[d])
        if Path(path).resolve() in stale_paths
    }
    devices = [reference] + sorted(d for d in by_device if d != reference)
    by_device.setdefault(reference, [])
    lines = ["## Across devices", ""]
    if report_dir is not None:
        lines += [
            "Each device's own report, from its own records: "
            + ", ".join(f"[`{d}`]({d}/answers.md)" for d in devices)
            + ".",
            "",
        ]
    if len(by_device) < 2:
        lines.append(f"_Only `{reference}` has records under `results/`; nothing to compare yet._\n")
        return "\n".join(lines)
    lines.append(
        f"Every cell measured on two or more of {', '.join(f'`{d}`' for d in devices)} (records under "
        f"`results/<device>/`), against `{reference}`. Speed-ups are time on `{reference}` over time on the other "
        "device; each sentence compares the median with the datasheets' ratios (`lmperf.core.peaks`): following the "
        "peak FLOP/s ratio reads as compute-bound, following the memory-bandwidth ratio as bandwidth-bound.\n"
    )
    code = code_sentence(by_device, devices, stale_cells)
    if code:
        lines.append(code)
    parts = [p(by_device, devices) for p in (e2e_part, nsys_part, memory_part, attention_part, flash_part)]
    parts = [p for p in parts if p]
    lines += parts or ["_No cell was measured on two devices yet._\n"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Where the grid's time went (report header)


def _parse_time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


# A stretch longer than this with no cell process running is a pause between runs (a device call
# ending, a machine starting, the place of a cell re-measured in a later sitting), not the grid's
# time; shorter ones are the previous cell's exit and Snakemake scheduling the next one (a few
# seconds: at most 7 s in the H100 and H200 grids of 450e38c, whose other gaps were 35 s and more,
# between device calls).
PAUSE_S = 30.0
# The speed ladder reports its own time, apart from the course's grid (docs/ARCHITECTURE.md).
LADDER_KINDS = ("ladder", "gemm_peak", "ladder_profile")
# The scale-out check runs on a machine of several GPUs, outside `all`: neither the course's grid nor the ladder.
SCALEOUT_KINDS = ("scaleout",)


# Part 1's own configurations (../shared/PROBLEMS.md): attention up to this length with the course's two
# implementations, flash_benchmarking's bf16 and fp32 rows of ours and of plain PyTorch; the e2e cells
# with the course's attention; the fp32 nsys profiles (nsys_profile asks for every size, no precision
# beyond the model's own). What the grid measures beyond them (other attention implementations,
# lengths past 16384 that find the out-of-memory boundary, tf32 and SDPA rows, our kernels in the
# whole model, bf16 profiles of two sizes) is this project's addition, and its time is reported apart.
# Two cells run both in one process, the course's part first, and say where it ended
# (`record_parts`): the leaderboard (SDPA's backends, d = 128 and the eager table after our kernel's
# protocol run) and the flash correctness check (fp16 and head dims beyond 16-128 after the rest).
COURSE_ATTENTION_MAX_LENGTH = 16384
COURSE_ATTENTION = ("plain", "compiled")
COURSE_FLASH_ROWS = (("flash_triton", "bf16"), ("flash_triton", "fp32"), ("plain", "bf16"), ("plain", "fp32"))
COURSE_NSYS_PRECISION = "fp32"


def grid_part(record: dict) -> str:
    """Which part of the grid a record's time counts to: `course` (Part 1's configurations),
    `additions` (what this project measures beyond them), `ladder` or `scaleout`."""
    kind, cell = record["kind"], record.get("cell", {})
    if kind in LADDER_KINDS:
        return "ladder"
    if kind in SCALEOUT_KINDS:
        return "scaleout"
    if kind == "e2e" and attention_of(record) != "plain":
        return "additions"
    if kind == "attention":
        course = cell.get("implementation") in COURSE_ATTENTION
        return "course" if course and cell.get("sequence_length", 0) <= COURSE_ATTENTION_MAX_LENGTH else "additions"
    if kind == "flash" and cell.get("test") == "benchmark":
        return "course" if (cell.get("implementation"), cell.get("precision")) in COURSE_FLASH_ROWS else "additions"
    if kind == "nsys":
        return "course" if cell.get("precision") == COURSE_NSYS_PRECISION else "additions"
    return "course"


def course_part_end(record: dict) -> float | None:
    """The process age at which a course record's own part of its share ends, where this project's
    additions follow it in the same share: ``course_part_process_age_s`` of a cell that runs the
    course's configurations first (the leaderboard, the flash correctness check), or, for an nsys
    profile, the record's age less its size's NVTX-overhead timing (``stage_s.nvtx_overhead``: the
    forwards timed with the ranges off and on, no profiler attached, right before the size's records
    are written; the course asks for the ranges, not for their cost). None where nothing follows."""
    metrics = record.get("metrics") or {}
    if metrics.get("course_part_process_age_s") is not None:
        return metrics["course_part_process_age_s"]
    nvtx_s = (metrics.get("stage_s") or {}).get("nvtx_overhead") if record["kind"] == "nsys" else None
    return record["provenance"]["process_age_s"] - nvtx_s if nvtx_s else None


def record_parts(record: dict) -> list[tuple[float, str]]:
    """(process age at its end, grid part) of each part of a record's share of its process: one part,
    ``grid_part``'s, unless the record is the course's and its course part ends before its age
    (``course_part_end``), which splits it there: the course's part, then this project's additions."""
    age, part = record["provenance"]["process_age_s"], grid_part(record)
    course_end = course_part_end(record) if part == "course" else None
    if course_end is not None and 0 < course_end < age:
        return [(course_end, "course"), (age, "additions")]
    return [(age, part)]


def run_began_between(run_starts: list[dt.datetime], end: dt.datetime, start: dt.datetime) -> bool:
    """Whether a Snakemake run began (``run_starts``, lmperf.core.run_log) after one process's ``end`` and
    by the next one's ``start``: that stretch is a restart between runs, not a run's own gap."""
    return any(end < began <= start for began in run_starts)


def _busy(
    intervals: list[tuple[dt.datetime, dt.datetime, str]], run_starts: list[dt.datetime] = ()
) -> tuple[dict[str, float], int, float, int, float]:
    """Busy seconds per group, the pauses (number, seconds) and the restarts (number, seconds). A
    stretch with no process running in which a Snakemake run began (``run_starts``,
    lmperf.core.run_log) is a restart; else one over PAUSE_S is a pause. Each process's time not already
    covered by an earlier one goes to its group, and a shorter gap to the group of the share that
    ended before it, so the groups add up to the time from the first start to the last end without
    the pauses and restarts, however their processes interleave.

    A gap is mostly the exit of the process before it (its last record is written before it ends):
    in the committed grids the length of a gap follows the kind of process before it (over a second
    after a speed-ladder process or the compile job, a fraction of one after a course cell), not the
    kind after it (bench/grid_time_notes.md)."""
    groups: dict[str, float] = {}
    pauses, paused_s, restarts, restart_s, end, end_group = 0, 0.0, 0, 0.0, None, None
    for start, stop, group in sorted(intervals):
        share = (stop - start).total_seconds() if end is None else max(0.0, (stop - max(start, end)).total_seconds())
        gap = 0.0 if end is None else (start - end).total_seconds()
        if gap > 0.0 and run_began_between(run_starts, end, start):
            restarts, restart_s = restarts + 1, restart_s + gap
        elif gap > PAUSE_S:
            pauses, paused_s = pauses + 1, paused_s + gap
        elif gap > 0.0:
            groups[end_group] = groups.get(end_group, 0.0) + gap
        groups[group] = groups.get(group, 0.0) + share
        if end is None or stop > end:
            end, end_group = stop, group
    return groups, pauses, paused_s, restarts, restart_s


def _union_s(intervals: list[tuple[dt.datetime, dt.datetime]]) -> float:
    """Seconds covered by the intervals, overlaps counted once (processes of one kind running at
    once, such as the compile job's)."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += (stop - start).total_seconds()
            end = stop
        elif stop > end:
            total += (stop - end).total_seconds()
            end = stop
    return total


def grid_timing(records: list[dict], run_starts: list[dt.datetime] = ()) -> dict:
    """Wall time of the grid and per kind (cell processes, from provenance) and e2e's median start-up.

    ``wall_s`` runs from the first cell process's start to the last one's end; ``busy_s`` leaves out
    the stretches when no cell ran in which a Snakemake run began (``run_starts``: restarts, e.g.
    between device calls) and the other ones over ``PAUSE_S`` (pauses); ``course_busy_s``,
    ``additions_busy_s``, ``ladder_busy_s`` and ``scaleout_busy_s`` split it between Part 1's own
    configurations, this project's additions, the speed ladder and the scale-out check
    (``grid_part`` of each record, over its share of its process, split where its course's part ends:
    ``record_parts``; a short gap goes with the process before it: `_busy`), so a ladder run between
    course cells, and its exit, do not count as the course's time."""
    written: dict[tuple, list[tuple[float, str]]] = {}  # process -> (age at writing, grid part) per record
    untimed = 0
    for r in records:
        prov = r["provenance"]
        if "process_start_time" not in prov or prov.get("process_age_s") is None:
            untimed += 1
            continue
        written.setdefault((r["kind"], prov["process_start_time"]), []).extend(record_parts(r))
    processes = {key: sorted(rows) for key, rows in written.items()}  # each process's records, in writing order
    wall = None
    intervals = {}
    for key, rows in processes.items():
        start = _parse_time(key[1])
        intervals[key] = (start, start + dt.timedelta(seconds=rows[-1][0]))
    per_kind = {kind: _union_s([v for (k, _), v in intervals.items() if k == kind]) for kind, _ in intervals}
    if processes:
        first = min(start for start, _ in intervals.values())
        last = max(stop for _, stop in intervals.values())
        wall = (last - first).total_seconds()
    # each record's share of its process's time (from the previous record's writing, or the process's
    # start, to its own), so a process that writes course and addition records splits between them
    shares = []
    for key, rows in processes.items():
        start, before = intervals[key][0], 0.0
        for age, part in rows:
            shares.append((start + dt.timedelta(seconds=before), start + dt.timedelta(seconds=age), part))
            before = age
    groups, pauses, paused_s, restarts, restart_s = _busy(shares, sorted(run_starts))
    busy_s = sum(groups.values())
    course_s, ladder_s = groups.get("course", 0.0), groups.get("ladder", 0.0)
    e2e = [r["metrics"] for r in records if r["kind"] == "e2e"]
    startup = [m["process_start_to_first_step_s"] for m in e2e if m.get("process_start_to_first_step_s") is not None]
    to_measured = [
        m["process_start_to_first_measured_step_s"]
        for m in e2e
        if m.get("process_start_to_first_measured_step_s") is not None
    ]
    return {
        "wall_s": wall,
        "busy_s": busy_s,
        "pauses": pauses,
        "paused_s": paused_s,
        "restarts": restarts,
        "restart_s": restart_s,
        "course_busy_s": course_s,
        "additions_busy_s": groups.get("additions", 0.0),
        "ladder_busy_s": ladder_s,
        "scaleout_busy_s": groups.get("scaleout", 0.0),
        "per_kind_s": per_kind,
        "processes": len(processes),
        "untimed_records": untimed,
        "startup_median_s": statistics.median(startup) if startup else None,
        "startup_n": len(startup),
        "to_first_measured_median_s": statistics.median(to_measured) if to_measured else None,
        "to_first_measured_n": len(to_measured),
    }


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _time_split(t: dict) -> str:
    """' (the course's grid …, this project's additions …, the speed ladder …, the scale-out check …)' where
    more than one ran, else ''."""
    names = (("course_busy_s", "the course's grid"), ("additions_busy_s", "this project's additions"))
    names += (("ladder_busy_s", "the speed ladder"),)
    names += (("scaleout_busy_s", "the scale-out check"),)
    parts = [f"{name} {_minutes(t[key])}" for key, name in names if t[key]]
    return f" ({', '.join(parts)})" if len(parts) > 1 else ""


def _split_sentence(records: list[dict]) -> str:
    """'; … split …' naming the records whose share of their process splits between the course and
    this project's additions (``record_parts``), else ''."""
    timed = [r for r in records if r["provenance"].get("process_age_s") is not None]
    split = [r for r in timed if len(record_parts(r)) > 1]
    first = sorted(
        {
            _label({**r.get("cell", {}), "kind": r["kind"]}, ["kind", "test", "implementation"])
            for r in split
            if (r.get("metrics") or {}).get("course_part_process_age_s") is not None
        }
    )
    sentence = ""
    if first:
        rest = "the rest of its process counts" if len(first) == 1 else "the rest of their processes count"
        sentence += f"; {', '.join(first)} ran the course's part first, and {rest} as this project's additions"
    if any(r["kind"] == "nsys" for r in split):
        sentence += "; the nsys profiles' timing of the NVTX ranges' cost counts as this project's additions"
    return sentence


def timing_lines(records: list[dict], run_starts: list[dt.datetime] = ()) -> list[str]:
    """Header lines: the grid's wall time, per-kind totals and the median per-cell start-up.

    The times are those of every record's cell process, the time between runs left out (restarts,
    from ``run_starts``, and pauses): what measuring the grid as it stands took. Where the records
    come from several commits (cells re-measured after a change to their code, in a later sitting), a
    second line gives each commit's records and time."""
    t = grid_timing(records, run_starts)
    lines = []
    if t["wall_s"] is None:
        lines.append("- Grid wall time: not recorded (these records predate `process_start_time` in provenance)")
    else:
        kinds = ", ".join(f"{k} {_minutes(s)}" for k, s in sorted(t["per_kind_s"].items(), key=lambda kv: -kv[1]))
        left_out = []
        if t["restarts"]:
            left_out.append(
                f"{t['restarts']} restart{'s' if t['restarts'] != 1 else ''} of {_minutes(t['restart_s'])} in all "
                "(from a run's last cell to the next run's first, a Snakemake run having begun between them)"
            )
        if t["pauses"]:
            left_out.append(
                f"{t['pauses']} pause{'s' if t['pauses'] != 1 else ''} of {_minutes(t['paused_s'])} in all when no "
                f"cell ran for over {PAUSE_S:.0f} s (between runs)"
            )
        pauses = f", leaving out {' and '.join(left_out)}" if left_out else ""
        lines.append(
            f"- Grid wall time: {_minutes(t['busy_s'])}{_time_split(t)} from the first cell process's start to the "
            f"last one's end{pauses} ({t['processes']} cell processes); per kind, the time its processes ran "
            f"(overlaps counted once): {kinds}"
            + (f"; {t['untimed_records']} records carry no process times" if t["untimed_records"] else "")
            + _split_sentence(records)
        )
    commits: dict[str, list[dict]] = {}
    for r in records:
        commits.setdefault(r["provenance"].get("git_commit") or "unknown", []).append(r)
    if len(commits) > 1:
        parts = []
        for commit, group in sorted(commits.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            g = grid_timing(group, run_starts)
            took = f", {_minutes(g['busy_s'])}{_time_split(g)}" if g["wall_s"] is not None else ""
            parts.append(f"`{commit[:7]}` {len(group)} record{'s' if len(group) != 1 else ''}{took}")
        lines.append(
            f"- Measured from {len(commits)} commits (a change re-measures only the cells whose code it "
            f"touches, in a sitting of their own): " + "; ".join(parts)
        )
    if t["startup_median_s"] is not None:
        lines.append(
            f"- Per-cell start-up (e2e, process start → first step, warm-up excluded): median "
            f"{t['startup_median_s']:.1f} s over {t['startup_n']} cells; → first measured step "
            f"(warm-up included): {fmt(t['to_first_measured_median_s'], 1)} s"
        )
    elif t["to_first_measured_median_s"] is not None:
        lines.append(
            f"- Per-cell start-up (e2e, process start → first measured step, warm-up included): median "
            f"{t['to_first_measured_median_s']:.1f} s over {t['to_first_measured_n']} cells"
        )
    return lines
