"""Per-device reports, the front page's Across devices section and the header's timing, on synthetic records."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest

from lmperf.core.record import load_record, make_record, write_record
from lmperf.report import answers, devices

START = dt.datetime(2026, 11, 22, 10, 0, 0, tzinfo=dt.timezone.utc)


def provenance(device: str, start_s: float = 0.0, age_s: float = 10.0) -> dict:
    start = START + dt.timedelta(seconds=start_s)
    return {
        "device_slug": device,
        "device_name": f"NVIDIA {device.upper()}",
        "torch_version": "2.11",
        "git_commit": "0" * 40,
        "git_dirty": False,
        "settings": {},
        "start_time": (start + dt.timedelta(seconds=age_s)).isoformat(timespec="seconds"),
        "process_start_time": start.isoformat(timespec="milliseconds"),
        "process_age_s": age_s,
    }


def write_grid(
    root: Path, device: str, time_scale: float, memory_mib: float = 80_000, oom_from: int = 8192, offset_s: float = 0.0
) -> None:
    """A small grid of every compared kind; every time is the H100-like base time times ``time_scale``."""
    out = root / device

    def put(kind, name, cell, metrics, status="ok", reason=None, start_s=0.0, age_s=10.0):
        record = make_record(kind, cell, status, metrics, provenance(device, offset_s + start_s, age_s), reason)
        write_record(out / kind / f"{name}.json", record)

    for i, (model, ctx) in enumerate([("small", 128), ("medium", 256)]):
        base = 40.0 * (i + 1)
        put(
            "e2e",
            f"{model}_{ctx}",
            {"model": model, "context_length": ctx, "precision": "fp32", "compile": "eager", "warmup_steps": 5},
            {
                "forward_ms_mean": base / 3 * time_scale,
                "backward_ms_mean": base / 2 * time_scale,
                "training_step_ms_mean": base * time_scale,
                "training_step_mfu": 0.3 / time_scale,
                "process_start_to_first_step_s": 3.0 + i,
                "process_start_to_first_measured_step_s": 4.0 + i,
            },
            start_s=20.0 * i,
            age_s=15.0,
        )
        phases = {
            p: {
                "kernel_ms_per_step": base * f * time_scale,
                "matmul_share": 0.7,
                "top_kernels": [{"share": 0.5, "name": "gemm"}],
            }
            for p, f in (("forward", 0.3), ("backward", 0.6), ("optimizer_step", 0.1))
        }
        put(
            "nsys",
            f"{model}_{ctx}_training",
            {"model": model, "context_length": ctx, "precision": "fp32", "mode": "training"},
            {"phases": phases},
            start_s=60.0,
            age_s=30.0,
        )
        put(
            "memory",
            f"{model}_{ctx}",
            {"model": model, "context_length": ctx, "precision": "fp32", "mode": "training"},
            {"peak_allocated_mib": 1000.0 * (i + 1)},
            start_s=100.0 + i,
            age_s=5.0,
        )
    for n in (1024, 4096, 8192, 16384):
        cell = {"implementation": "plain", "head_dim": 64, "sequence_length": n, "batch_size": 8, "precision": "fp32"}
        if n >= oom_from:
            put(
                "attention",
                f"plain_d64_n{n}",
                cell,
                {},
                status="oom",
                reason="CUDA out of memory",
                start_s=120.0,
                age_s=40.0,
            )
        else:
            put(
                "attention",
                f"plain_d64_n{n}",
                cell,
                {"forward_ms_mean": n / 1000 * time_scale},
                start_s=120.0,
                age_s=40.0,
            )
        flash = {
            "test": "benchmark",
            "implementation": "flash_triton",
            "precision": "bf16",
            "head_dim": 64,
            "sequence_length": n,
            "batch_size": 1,
            "causal": True,
        }
        ms = n / 4096 * time_scale
        put(
            "flash",
            f"bench_d64_n{n}",
            flash,
            {"forward_backward_ms_median": ms, "forward_backward_tflops": n * n * 1e-6 / ms},
            start_s=170.0,
            age_s=20.0,
        )
    put(
        "flash",
        "leaderboard",
        {"test": "leaderboard"},
        {
            "flash_triton_forward_backward_ms_median": 5.0 * time_scale,
            "ratio_flash_triton_over_sdpa_flash": 0.7,
            "ratio_flash_triton_over_sdpa_cudnn": 1.1,
        },
        start_s=190.0,
        age_s=30.0,
    )
    del memory_mib


def sentences(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("- ")]


def test_sentences_follow_the_numbers(tmp_path):
    # h200 1.43x faster everywhere: the memory-bandwidth ratio of the datasheets (4800/3350 GB/s)
    write_grid(tmp_path / "a", "h100", 1.0)
    write_grid(tmp_path / "a", "h200", 3350 / 4800, oom_from=16384)
    text = devices.across_devices(tmp_path / "a", "h100")
    said = "\n".join(sentences(text))
    # the grid's two e2e cells have no cell at twice their context: the launch-bound test cannot tell,
    # so neither e2e sentence speaks for them (test_launch_bound_cells_are_compared_apart); nsys does
    assert "2 of 2 cells are in neither sentence" in said
    assert "Profiled GPU kernel time per step, forward (fp32): `h200` is 1.43× as fast as `h100`" in said
    assert "bandwidth-bound" in said and "compute-bound" not in said
    assert "`h200` and `h100` differ in 1 of 1 groups" in said  # h200 runs N=8192, h100 runs out
    assert "| plain | fp32 | 64 | 4,096 / 8,192 | 8,192 / 16,384 |" in text
    assert "agree within 0.0% over 2 cells" in said
    # the same times: h200 gains nothing from its bandwidth -> the FLOP/s ratio (1.0) explains it
    write_grid(tmp_path / "b", "h100", 1.0)
    write_grid(tmp_path / "b", "h200", 1.0)
    said = "\n".join(sentences(devices.across_devices(tmp_path / "b", "h100")))
    assert "`h200` is about as fast as `h100`" in said and "compute-bound" in said and "bandwidth-bound" not in said
    assert "agree in all 1 groups" in said
    # h200 slower, seen from h200's report: the reference flips too
    write_grid(tmp_path / "c", "h100", 1.0)
    write_grid(tmp_path / "c", "h200", 2.0)
    said = "\n".join(sentences(devices.across_devices(tmp_path / "c", "h200")))
    assert "`h100` is 2.00× as fast as `h200`" in said
    said = "\n".join(sentences(devices.across_devices(tmp_path / "c", "h100")))
    assert "`h200` is slower than (2.00× the time of) `h100`" in said and "outside both datasheet ratios" in said


def test_bound_words_between_and_equal_ratios():
    assert "between the datasheet ratios" in devices.bound_words(1.2, 1.0, 1.43)
    assert "memory-bandwidth ratio: bandwidth-bound" in devices.bound_words(1.4, 1.0, 1.43)
    assert "peak FLOP/s ratio: compute-bound" in devices.bound_words(1.02, 1.0, 1.43)
    assert "cannot tell" in devices.bound_words(1.5, 1.5, 1.5)
    assert "no datasheet rates" in devices.bound_words(1.5, None, 1.5)


def test_side_by_side_rows_and_ratios(tmp_path):
    write_grid(tmp_path, "h100", 1.0)
    write_grid(tmp_path, "h200", 0.5)
    text = devices.across_devices(tmp_path, "h100", report_dir=tmp_path)
    # e2e: small ctx128 forward 13.33/6.67, backward 20/10, step 40/20, speed-up 2x, MFU 30%/60%
    assert (
        "| small ctx128 fp32 eager w5 | 13.33 | 6.67 | 20.00 | 10.00 | 40.00 | 20.00 | 2.00× | 30.0% | 60.0% |" in text
    )
    assert text.index("| small ctx128") < text.index("| medium ctx256")  # models in size order
    assert "| small ctx128 fp32 training | backward | 24.00 | 12.00 | 2.00× | 70.0% | 70.0% | 50.0% | 50.0% |" in text
    assert "[`h100`](h100/answers.md), [`h200`](h200/answers.md)" in text
    assert "| ours fwd+bwd ms | 5.00 | 2.50 |" in text
    # a device without a second one: nothing to compare
    only = tmp_path / "only"
    write_grid(only, "h100", 1.0)
    assert "nothing to compare yet" in devices.across_devices(only, "h100")


def test_a_local_cpu_run_is_left_out_of_the_gpu_front_page(tmp_path):
    """results/cpu/ (git-ignored) beside committed GPU records changes nothing on a GPU's front page."""
    write_grid(tmp_path, "h100", 1.0)
    write_grid(tmp_path, "h200", 0.5)
    without = devices.across_devices(tmp_path, "h100", report_dir=tmp_path)
    write_grid(tmp_path, "cpu", 50.0)
    with_cpu = devices.across_devices(tmp_path, "h100", report_dir=tmp_path)
    assert with_cpu == without and "cpu" not in with_cpu


def test_cells_that_ran_different_code_are_counted(tmp_path):
    """Different code on two devices: different code versions where one record is stale (measured with
    older code, as the workflow judges). Different labels on two current records are the same code (a
    clean commit's record whose cell code is unchanged since keeps its older label)."""
    write_grid(tmp_path, "h100", 1.0)
    write_grid(tmp_path, "h200", 0.5)
    by_device = devices.device_records(tmp_path)
    for records in by_device.values():
        for r in records:
            r["provenance"]["code_version"] = "v1"
    same = devices.code_sentence(by_device, ["h100", "h200"])
    assert same.startswith("Every compared cell ran the same code") and "`h200`, commit `0000000`" in same
    compared = [r for r in by_device["h200"] if r["kind"] in devices.COMPARED_KINDS][:3]
    compared[0]["provenance"]["code_version"] = "v0"
    del compared[1]["provenance"]["code_version"]
    compared[2]["provenance"]["code_version"] = "v0"
    # relabelled but current on both devices: still the same code
    assert devices.code_sentence(by_device, ["h100", "h200"]).startswith("Every compared cell ran the same code")

    def key(device, record):
        return (device, record["kind"], devices.compared_cell(record))

    # stale on h200 (the first two), or on h100 (the third): different code
    stale = {key("h200", compared[0]), key("h200", compared[1]), key("h100", compared[2])}
    total = sum(len(devices._shared(by_device, kind)[0]) for kind in devices.COMPARED_KINDS)
    assert devices.code_sentence(by_device, ["h100", "h200"], stale).startswith(
        f"**3 of {total} compared cells ran different code on different devices**"
    )
    # both stale, with equal labels: they ran the same (older) code
    compared[0]["provenance"]["code_version"] = "v1"
    assert devices.code_sentence(by_device, ["h100", "h200"], stale | {key("h100", compared[0])}).startswith(
        f"**2 of {total} compared"
    )
    assert devices.code_sentence({"h100": by_device["h100"]}, ["h100"]) == ""


def test_whole_model_cells_with_another_attention_are_rows_of_their_own(tmp_path):
    """attention_compare's e2e cells share their cell with the plain one (the attention is in their
    settings): each is compared with its own kind on the other device, never in the plain row's place."""
    cell = {"model": "small", "context_length": 1024, "precision": "bf16", "compile": "eager", "warmup_steps": 5}
    times = {"plain": 80.0, "flash": 30.0, "sdpa": 50.0}
    for device, scale in (("h100", 1.0), ("h200", 0.5)):
        for attention, step_ms in times.items():
            prov = provenance(device)
            if attention != "plain":
                prov["settings"] = {"attention": attention}
            metrics = {"forward_ms_mean": step_ms / 3, "backward_ms_mean": step_ms / 2}
            metrics["training_step_ms_mean"] = step_ms * scale
            suffix = "" if attention == "plain" else f"_{attention}"
            write_record(
                tmp_path / device / "e2e" / f"small{suffix}.json", make_record("e2e", cell, "ok", metrics, prov)
            )
    text = devices.across_devices(tmp_path, "h100")
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| small")}
    assert set(rows) == {
        "small ctx1024 bf16 eager w5",
        "small ctx1024 bf16 eager w5 flash",
        "small ctx1024 bf16 eager w5 sdpa",
    }
    for label, attention in (("small ctx1024 bf16 eager w5", "plain"), ("small ctx1024 bf16 eager w5 flash", "flash")):
        cells = [c.strip() for c in rows[label].split("|")]
        assert f"{times[attention]:.2f}" in cells and f"{times[attention] / 2:.2f}" in cells, rows[label]


def test_a_stale_record_path_of_either_device_counts_its_cell_as_different_code(tmp_path):
    """across_devices takes the stale records as paths of any device (as the workflow names them)."""
    write_grid(tmp_path, "h100", 1.0)
    write_grid(tmp_path, "h200", 0.5)
    h200_paths = sorted((tmp_path / "h200" / "e2e").glob("*.json"))
    h100_memory = sorted((tmp_path / "h100" / "memory").glob("*.json"))[0]
    for path in tmp_path.glob("*/*/*.json"):  # one label, but on two records
        record = load_record(path)
        record["provenance"]["code_version"] = "older" if path in (h200_paths[0], h100_memory) else "v1"
        write_record(path, record)
    assert "Every compared cell ran the same code" in devices.across_devices(tmp_path, "h100")
    text = devices.across_devices(tmp_path, "h100", stale=[str(h200_paths[0]), str(h100_memory)])
    assert re.search(r"\*\*2 of \d+ compared cells ran different code", text)
    # a stale record whose label equals the other device's ran the same code: not counted
    text = devices.across_devices(tmp_path, "h100", stale=[str(h200_paths[1])])
    assert "Every compared cell ran the same code" in text


def test_header_gives_grid_wall_time_per_kind_totals_and_start_up(tmp_path):
    write_grid(tmp_path, "h100", 1.0, offset_s=0.0)
    records = devices.device_records(tmp_path)["h100"]
    timing = devices.grid_timing(records)
    # processes: e2e 2x15 s, nsys 2 records of one process (start 60 s) 30 s, memory 2x5 s starting 1 s
    # apart (6 s: a kind's overlapping processes count once), attention one
    # process 40 s, flash benches one process 20 s + leaderboard 30 s; the last ends at 190 + 30 s
    assert timing["wall_s"] == pytest.approx(220.0)
    assert timing["per_kind_s"] == pytest.approx(
        {"e2e": 30.0, "nsys": 30.0, "memory": 6.0, "attention": 40.0, "flash": 50.0}
    )
    assert timing["startup_median_s"] == pytest.approx(3.5) and timing["to_first_measured_median_s"] == 4.5
    lines = devices.timing_lines(records)
    assert lines[0].startswith("- Grid wall time: 3.7 min") and "attention 0.7 min" in lines[0]
    assert "median 3.5 s over 2 cells" in lines[1]
    assert "pause" not in lines[0] and "speed ladder" not in lines[0]


def test_a_kinds_overlapping_processes_count_once(tmp_path):
    """The compile job's processes run side by side: a kind's time is the span they cover, not their sum."""
    cell = {"model": "small", "context_length": 128, "precision": "fp32"}
    compiles = [
        make_record("e2e_compile", cell, "ok", {"compile_cache_hits": 0}, provenance("h100", start, age), None)
        for start, age in ((0.0, 50.0), (10.0, 30.0), (40.0, 30.0), (100.0, 5.0))
    ]
    timing = devices.grid_timing(compiles)
    assert timing["per_kind_s"] == pytest.approx({"e2e_compile": 75.0})  # 0-70 s and 100-105 s
    assert timing["processes"] == 4 and timing["wall_s"] == pytest.approx(105.0)


def ladder_record(prov: dict) -> dict:
    """One speed-ladder rung's record with the given provenance."""
    cell = {"model": "small", "context_length": 1024, "rung": "baseline"}
    return make_record("ladder", cell, "ok", {"step_ms": 1.0}, prov, None)


def test_pauses_between_runs_and_the_ladder_are_told_apart(tmp_path):
    write_grid(tmp_path, "h100", 1.0, offset_s=0.0)
    records = devices.device_records(tmp_path)["h100"]
    # the grid above ends at 220 s; a second run starts 300 s later with a ladder process of 100 s
    ladder = ladder_record(provenance("h100", 520.0, 100.0))
    timing = devices.grid_timing([*records, ladder])
    assert timing["wall_s"] == pytest.approx(620.0)
    assert timing["busy_s"] == pytest.approx(320.0) and timing["pauses"] == 1 and timing["paused_s"] == 300.0
    assert timing["course_busy_s"] == pytest.approx(220.0) and timing["ladder_busy_s"] == pytest.approx(100.0)
    line = devices.timing_lines([*records, ladder])[0]
    assert line.startswith("- Grid wall time: 5.3 min (the course's grid 3.7 min, the speed ladder 1.7 min)")
    assert "leaving out 1 pause of 5.0 min" in line


def test_a_gap_in_which_a_run_began_is_a_restart_however_short(tmp_path):
    """The restarts between device calls (21-30 s in the H100's and H200's grids) are under the 30 s
    pause; with the runs' starts noted (lmperf.core.run_log) the header leaves them out all the same, and
    a run's own gaps of the same length stay in."""
    write_grid(tmp_path, "h100", 1.0, offset_s=0.0)
    records = devices.device_records(tmp_path)["h100"]  # ends at 220 s
    later = [ladder_record(provenance("h100", 245.0, 10.0)), ladder_record(provenance("h100", 280.0, 10.0))]
    before = devices.grid_timing([*records, *later])
    assert before["restarts"] == 0 and before["pauses"] == 0 and before["busy_s"] == pytest.approx(290.0)
    started = [START + dt.timedelta(seconds=240.0), START - dt.timedelta(seconds=5.0)]  # the first run's too
    timing = devices.grid_timing([*records, *later], started)
    # 220-245 s held a run's start: left out; 255-280 s (25 s, no run began) is the ladder's own gap
    assert timing["restarts"] == 1 and timing["restart_s"] == pytest.approx(25.0) and timing["pauses"] == 0
    assert timing["busy_s"] == pytest.approx(265.0) and timing["ladder_busy_s"] == pytest.approx(45.0)
    line = devices.timing_lines([*records, *later], started)[0]
    assert "leaving out 1 restart of 0.4 min in all" in line and "pause" not in line
    # a long gap with a run's start in it is a restart, not a pause as well
    far = [ladder_record(provenance("h100", 600.0, 10.0))]
    timing = devices.grid_timing([*records, *far], [START + dt.timedelta(seconds=590.0)])
    assert (timing["restarts"], timing["pauses"]) == (1, 0) and timing["restart_s"] == pytest.approx(380.0)


def test_the_header_reads_the_runs_noted_beside_the_records(tmp_path):
    from lmperf.core import run_log

    write_grid(tmp_path, "h100", 1.0, offset_s=0.0)
    write_record(tmp_path / "h100" / "ladder" / "a.json", ladder_record(provenance("h100", 245.0, 10.0)))
    assert "restart" not in answers.header("h100", tmp_path / "h100")
    run_log.note_start(tmp_path / "h100", START + dt.timedelta(seconds=230.0))
    assert "leaving out 1 restart of 0.4 min in all" in answers.header("h100", tmp_path / "h100")


def build(root: Path, device: str, front: bool) -> None:
    """What the answers rule runs, from inside ``root`` (paths relative, as Snakemake gives them)."""
    import os

    cwd = os.getcwd()
    os.chdir(root)
    try:
        sections = sorted(str(p.relative_to(root)) for p in (root / "results" / device / "sections").glob("*.md"))
        argv = [
            "--device",
            device,
            "--results",
            f"results/{device}",
            "--output",
            f"report/{device}/answers.md",
            "--sections",
            *sections,
            "--missing",
            "",
        ]
        answers.main(argv + (["--front", "report/answers.md"] if front else []))
    finally:
        os.chdir(cwd)


def test_reports_rebuild_byte_identically_with_working_relative_links(tmp_path):
    texts = []
    for attempt in ("one", "two"):
        root = tmp_path / attempt
        for device, scale in (("h100", 1.0), ("h200", 0.7)):
            write_grid(root / "results", device, scale)
            (root / "results" / device / "figures").mkdir(parents=True)
            (root / "results" / device / "figures" / "e2e_warmup.png").write_bytes(b"png")
            (root / "results" / device / "sections").mkdir(parents=True)
            (root / "results" / device / "sections" / "benchmarking_script.md").write_text(
                f"### (a)\n![warm-up](../results/{device}/figures/e2e_warmup.png)\n"
            )
        build(root, "h200", front=False)
        build(root, "h100", front=True)
        texts.append({p.relative_to(root): p.read_bytes() for p in sorted((root / "report").rglob("*.md"))})
    assert texts[0] == texts[1]
    assert set(texts[0]) == {Path("report/answers.md"), Path("report/h100/answers.md"), Path("report/h200/answers.md")}
    root = tmp_path / "one"
    for path, data in texts[0].items():
        text = data.decode()
        assert str(tmp_path) not in text  # no absolute paths
        links = [link for link in re.findall(r"\]\(([^)#][^)]*)\)", text)]  # files, not #anchors
        assert links and all((root / path).parent.joinpath(link).resolve().exists() for link in links), links
    front = texts[0][Path("report/answers.md")].decode()
    assert "(`h100`)" in front.split("## ")[0] and front.rstrip().splitlines()[-1].startswith(("|", "</details>"))
    assert "## Across devices" in front and "## Across devices" not in texts[0][Path("report/h100/answers.md")].decode()
    assert "- Grid wall time: 3.7 min" in front
    # one click from the top to every part, Across devices included; every #anchor link has its target
    contents = front.split("## Contents")[1].split("\n\n<a id=")[0]
    assert "- [Across devices](#across-devices): " in contents
    for target in re.findall(r"\]\(#([^)]+)\)", front):
        assert f'<a id="{target}"></a>' in front, target


def test_the_header_times_every_record_and_names_each_commits_share(tmp_path):
    write_grid(tmp_path, "h100", 1.0, offset_s=0.0)
    records = devices.device_records(tmp_path)["h100"]
    # one record kept from an older commit, measured a day before: its process counts, the day does not
    older = ladder_record({**provenance("h100", -86_400.0, 100.0), "git_commit": "1" * 40})
    lines = devices.timing_lines([*records, older])
    assert lines[0].startswith("- Grid wall time: 5.3 min (the course's grid 3.7 min, the speed ladder 1.7 min) from")
    assert "leaving out 1 pause of 1438.3 min" in lines[0]
    assert lines[1] == (
        "- Measured from 2 commits (a change re-measures only the cells whose code it touches, in a sitting "
        f"of their own): `0000000` {len(records)} records, 3.7 min; `1111111` 1 record, 1.7 min"
    )
    assert len(devices.timing_lines(records)) == 2 and "Measured from" not in "".join(devices.timing_lines(records))


def test_the_scale_out_check_is_timed_apart_from_the_course_and_the_ladder(tmp_path):
    """The scale-out check runs outside `all`, on a machine of several GPUs: its own share of the time."""
    write_grid(tmp_path, "h100", 1.0, offset_s=0.0)
    records = devices.device_records(tmp_path)["h100"]
    scaleout = {**ladder_record(provenance("h100", 1000.0, 90.0)), "kind": "scaleout"}  # timing reads kind, provenance
    timing = devices.grid_timing([*records, scaleout])
    assert timing["scaleout_busy_s"] == pytest.approx(90.0) and timing["course_busy_s"] == pytest.approx(220.0)
    assert devices.timing_lines([*records, scaleout])[0].startswith(
        "- Grid wall time: 5.2 min (the course's grid 3.7 min, the scale-out check 1.5 min) from"
    )


def test_a_ladder_run_between_course_cells_is_not_the_course_time():
    # `snakemake all` interleaves kinds: a course cell over 0-50 s, a ladder process over 55-85 s, a
    # course cell over 91-151 s. A short gap goes with the process before it (mostly that process's
    # exit): the ladder's 30 s and the 6 s gap after it are the ladder's time, the 5 s gap after the
    # first course cell the course's.
    def course(start, age):
        cell = {"model": "small", "context_length": 128, "precision": "fp32", "compile": "eager", "warmup_steps": 5}
        return make_record("e2e", cell, "ok", {"forward_ms_mean": 1.0}, provenance("h100", start, age), None)

    records = [course(0.0, 50.0), ladder_record(provenance("h100", 55.0, 30.0)), course(91.0, 60.0)]
    timing = devices.grid_timing(records)
    assert timing["busy_s"] == pytest.approx(151.0)
    assert timing["ladder_busy_s"] == pytest.approx(36.0) and timing["course_busy_s"] == pytest.approx(115.0)


def test_a_cell_that_runs_the_course_first_splits_its_process_where_it_says():
    """The leaderboard and the flash correctness check run the course's part first in one process and
    keep the process's age when it ended (``course_part_process_age_s``): the header counts up to it
    as the course's grid, the rest as this project's additions. A record that is not the course's, or
    whose age lies outside its share, keeps one part."""

    def flash(test, start, age, course_end=None):
        metrics = {"cell_wall_s": age} | ({"course_part_process_age_s": course_end} if course_end else {})
        return make_record("flash", {"test": test}, "ok", metrics, provenance("h100", start, age), None)

    board = flash("leaderboard", 0.0, 90.0, course_end=25.0)
    assert devices.record_parts(board) == [(25.0, "course"), (90.0, "additions")]
    assert devices.record_parts(flash("leaderboard", 0.0, 90.0)) == [(90.0, "course")]
    assert devices.record_parts(flash("correctness", 0.0, 50.0, course_end=60.0)) == [(50.0, "course")]
    records = [board, flash("correctness", 92.0, 50.0, course_end=20.0)]
    timing = devices.grid_timing(records)
    assert timing["busy_s"] == pytest.approx(142.0) and timing["per_kind_s"] == pytest.approx({"flash": 140.0})
    # the leaderboard's 25 s and the correctness check's first 20 s are the course's; the 2 s gap
    # between them follows the leaderboard's additions, which ended its process
    assert timing["course_busy_s"] == pytest.approx(45.0) and timing["additions_busy_s"] == pytest.approx(97.0)
    line = devices.timing_lines(records)[0]
    assert line.startswith("- Grid wall time: 2.4 min (the course's grid 0.8 min, this project's additions 1.6 min)")
    assert line.endswith(
        "; flash correctness, flash leaderboard ran the course's part first, and the rest of their processes "
        "count as this project's additions"
    )


def test_an_nsys_profiles_nvtx_cost_timing_counts_as_an_addition():
    """The course asks for NVTX ranges in its nsys profiles, not for their cost: each size's records
    are written right after that size's forwards timed with the ranges off and on
    (``stage_s.nvtx_overhead``), so that stretch of a course profile's share is this project's
    addition. A bf16 profile is an addition whole; a record without the stage keeps one part."""

    def nsys(precision, size, start, age, nvtx_s=None):
        cell = {"model": size, "context_length": 128, "precision": precision, "mode": "training"}
        metrics = {"stage_s": {"profile": 50.0} | ({"nvtx_overhead": nvtx_s} if nvtx_s else {})}
        return make_record("nsys", cell, "ok", metrics, provenance("h100", start, age), None)

    big, small = nsys("fp32", "large", 0.0, 60.0, nvtx_s=4.0), nsys("fp32", "small", 0.0, 63.0, nvtx_s=2.0)
    assert devices.record_parts(big) == [(56.0, "course"), (60.0, "additions")]
    assert devices.record_parts(nsys("fp32", "small", 0.0, 63.0)) == [(63.0, "course")]
    assert devices.record_parts(nsys("bf16", "small", 0.0, 30.0, nvtx_s=1.0)) == [(30.0, "additions")]
    timing = devices.grid_timing([big, small])
    # 0-56 s the profiles (course), 56-60 s large's NVTX timing, 60-61 s small's records being made
    # from the trace (course), 61-63 s small's NVTX timing
    assert timing["course_busy_s"] == pytest.approx(57.0) and timing["additions_busy_s"] == pytest.approx(6.0)
    assert devices.timing_lines([big, small])[0].endswith(
        "; the nsys profiles' timing of the NVTX ranges' cost counts as this project's additions"
    )


def test_fp32_rows_say_what_each_implementation_multiplied_in_per_device():
    def rec(device, kind, impl, status="ok", dot=None, tf32=False):
        prov = provenance(device)
        prov["matmul_allow_tf32"] = tf32
        prov["settings"] = {"dot_precision": dot} if dot else {}
        return {
            "kind": kind,
            "cell": {"implementation": impl, "precision": "fp32"},
            "status": status,
            "provenance": prov,
        }

    by_device = {
        "h100": [
            rec("h100", "flash", "flash_triton", dot="tf32x3"),
            rec("h100", "flash", "plain"),
            rec("h100", "flash", "sdpa_cudnn", status="unsupported"),
        ],
        "h200": [
            rec("h200", "flash", "flash_triton", dot="tf32"),
            rec("h200", "flash", "plain"),
            rec("h200", "attention", "plain", tf32=True),
        ],
    }
    line = devices.fp32_products_line(by_device, ["h100", "h200"], "flash")
    assert "`flash_triton` 3xTF32 (`h100`), TF32 (`h200`)" in line
    assert "`plain` IEEE" in line and "IEEE (`h100`)" not in line  # the same on both: said once
    assert "sdpa_cudnn" not in line  # it did not run in fp32
    assert "`plain` TF32" in devices.fp32_products_line(by_device, ["h100", "h200"], "attention")
    assert devices.fp32_products_line({"h100": []}, ["h100"], "flash") == ""


def test_the_course_and_this_projects_additions_are_timed_apart():
    """A record's share of its process counts to Part 1's configurations or to what the grid adds."""

    def rec(kind, cell, start, age, **settings):
        prov = provenance("h100", start, age)
        prov["settings"] = settings
        return make_record(kind, cell, "ok", {"wall_s": float(age)}, prov, None)

    records = [
        # one attention process: the course's length (0-30 s), then a longer one that finds the
        # out-of-memory boundary (30-50 s)
        rec("attention", {"implementation": "plain", "sequence_length": 16384}, 0.0, 30.0),
        rec("attention", {"implementation": "plain", "sequence_length": 32768}, 0.0, 50.0),
        # an SDPA attention process (the course times plain and compiled attention only)
        rec("attention", {"implementation": "sdpa", "sequence_length": 1024}, 50.0, 10.0),
        # the flash benchmark: a course row (ours, bf16) and a tf32 row, one process
        rec("flash", {"test": "benchmark", "implementation": "flash_triton", "precision": "bf16"}, 60.0, 5.0),
        rec("flash", {"test": "benchmark", "implementation": "flash_triton", "precision": "tf32"}, 60.0, 8.0),
        # e2e cells: the course's attention, and our kernels in the model
        rec("e2e", {"model": "small", "context_length": 128}, 68.0, 4.0, attention="plain"),
        rec("e2e", {"model": "small", "context_length": 128}, 72.0, 6.0, attention="flash"),
        # nsys: the course's fp32 profile of a size, and a bf16 one (tensor-core kernels, ours)
        rec("nsys", {"model": "small", "context_length": 128, "precision": "fp32"}, 78.0, 7.0),
        rec("nsys", {"model": "small", "context_length": 128, "precision": "bf16"}, 85.0, 2.0),
    ]
    assert [devices.grid_part(r) for r in records] == [
        "course",
        "additions",
        "additions",
        "course",
        "additions",
        "course",
        "additions",
        "course",
        "additions",
    ]
    timing = devices.grid_timing(records)
    assert timing["course_busy_s"] == pytest.approx(30 + 5 + 4 + 7)
    assert timing["additions_busy_s"] == pytest.approx(20 + 10 + 3 + 6 + 2)
    assert timing["per_kind_s"]["attention"] == pytest.approx(60.0)
    line = devices.timing_lines(records)[0]
    assert "(the course's grid 0.8 min, this project's additions 0.7 min)" in line


def test_launch_bound_cells_are_compared_apart():
    """A cell whose forward barely grows when the context doubles is launch-bound on that device: its
    speed-up across devices compares the hosts and gets a sentence of its own."""

    def e2e(device, ctx, forward_ms, step_ms, attention="plain"):
        cell = {"model": "small", "context_length": ctx, "precision": "bf16", "compile": "eager", "warmup_steps": 5}
        prov = provenance(device)
        prov["settings"] = {"attention": attention}
        metrics = {"forward_ms_median": forward_ms, "forward_ms_mean": forward_ms, "training_step_ms_mean": step_ms}
        return make_record("e2e", cell, "ok", metrics, prov, None)

    by_device = {
        # h100: 128 -> 256 grows 1.1x (launch-bound at 128), 256 -> 512 grows 2x
        "h100": [e2e("h100", 128, 10.0, 30.0), e2e("h100", 256, 11.0, 33.0), e2e("h100", 512, 22.0, 66.0)],
        # h200: every doubling grows 2x; our kernels' cell at 128 has no cell at 256, so no test
        "h200": [
            e2e("h200", 128, 5.0, 20.0),
            e2e("h200", 256, 10.0, 22.0),
            e2e("h200", 512, 20.0, 46.2),
            e2e("h200", 128, 5.0, 20.0, attention="flash"),
        ],
    }
    # 512 has no cell at 1024: not launch-bound, since 256 -> 512 grew the time 2x
    h100 = devices.launch_bound_test(by_device["h100"])
    assert {json.loads(k)["context_length"]: v for k, v in h100.items()} == {128: True, 256: False, 512: False}
    h200 = devices.launch_bound_test(by_device["h200"])
    assert sorted(json.loads(k)["context_length"] for k, v in h200.items() if not v) == [128, 256, 512]
    # a longest context whose own doubling barely grew cannot be told
    slow_growth = [e2e("h100", 256, 10.0, 30.0), e2e("h100", 512, 11.0, 33.0)]
    assert {json.loads(k)["context_length"]: v for k, v in devices.launch_bound_test(slow_growth).items()} == {
        256: True
    }
    text = devices.e2e_part(by_device, ["h100", "h200"])
    # launch-bound on h100: 30 / 20 = 1.50x, alone in its sentence
    assert "End-to-end training step (bf16), launch-bound cells: `h200` is 1.50× as fast as `h100`" in text
    # launch-bound on neither: 256 (33 / 22 = 1.50x) and 512 (66 / 46.2 = 1.43x), median 1.46x
    assert "(bf16), cells launch-bound on neither device: `h200` is 1.46× as fast as `h100`" in text
    assert "in neither sentence" not in text
    assert "| on `h100` |" in text and "| no |" in text
