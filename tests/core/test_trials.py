"""lmperf.core.trials: a cell's trials merged into one record, and the margin rule that asks for more."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest

from lmperf.core import stats, trials
from lmperf.core.plan import Job, why_stale
from lmperf.core.record import load_record, make_record, validate, write_record
from tests.kinds.records import provenance as base_provenance

SETTINGS = {"model": "tiny", "measured_steps": 3, "head_dims": [16, 32], "sequence_lengths": [64, 128]}
CODE, START = "0123456789abcdef", "2026-01-01T00:00:00+00:00"


def trial(step_ms, status="ok", label=None, start=START, cell=None, settings=SETTINGS, code=CODE, busy=None):
    """A trial record as a cell writes it (an e2e-like cell: training step time, its samples, …)."""
    metrics = {}
    if status == "ok":
        metrics = {"parameter_count": 123, "training_step_ms_median": step_ms, "training_step_ms_std": step_ms / 50}
        metrics |= {"training_step_ms_samples": [step_ms * 0.99, step_ms, step_ms * 1.01], "label": label}
        metrics |= {"training_step_tokens_per_s": 4096 / step_ms * 1e3, "training_step_mfu": 0.5 / step_ms}
        metrics |= {"gpu_busy_fraction": busy} if busy is not None else {}
    host = {"cpu_model": "x", "cpu_count": 2, "load_avg_1min": 0.5, "gpu_state_start": None}
    host["gpu_state_end"] = {"power_w": step_ms}
    provenance = base_provenance("cpu", "x86_64", torch_version="2.11", git_commit="unknown", git_dirty=True, host=host)
    provenance |= {"start_time": start, "settings": settings, "code_version": code}
    reason = None if status == "ok" else f"{status} in this trial"
    return make_record("e2e", cell or {"model": "tiny", "head_dim": 16}, status, metrics, provenance, reason)


def t95(values: list[float], t: float) -> list[float]:
    """Student's t 95% interval of the geometric mean (``t`` from a t table), widened to the median."""
    logs = [math.log(v) for v in values]
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    low, high = math.exp(statistics.mean(logs) - half), math.exp(statistics.mean(logs) + half)
    return [min(low, statistics.median(values)), max(high, statistics.median(values))]


def test_merge_takes_medians_with_their_interval_and_the_rest_from_the_median_trial(fresh_seed):
    values = [random.uniform(10, 50) for _ in range(3)]
    records = [trial(v, label=f"trial {i}", start=f"2026-01-0{i + 1}T00:00:00+00:00") for i, v in enumerate(values)]
    merged = trials.merge(records)
    validate(merged)
    m = merged["metrics"]
    assert m["training_step_ms_median"] == statistics.median(values)
    low, high = m["training_step_ms_median_interval"]
    assert [low, high] == pytest.approx(t95(values, 4.303))  # t with 2 degrees of freedom
    # a rate's interval is the time's, turned over (the t interval of log times is symmetric)
    rates = [4096 / v * 1e3 for v in values]
    assert m["training_step_tokens_per_s"] == pytest.approx(statistics.median(rates))
    assert m["training_step_tokens_per_s_interval"] == pytest.approx([4096e3 / high, 4096e3 / low])
    assert m["training_step_mfu_interval"] == pytest.approx([0.5 / high, 0.5 / low])
    assert m["interval_method"] == "t" and m["primary_metric"] == "training_step_ms_median"
    middle = sorted(range(3), key=lambda i: values[i])[1]
    assert m["label"] == f"trial {middle}" and m["training_step_ms_std"] == values[middle] / 50
    assert "training_step_ms_std_interval" not in m and "parameter_count_interval" not in m
    assert [t["start_time"] for t in m["trials"]] == [r["provenance"]["start_time"] for r in records]
    assert [t["training_step_ms_samples"] for t in m["trials"]] == [
        r["metrics"]["training_step_ms_samples"] for r in records
    ]
    assert m["trials"][0]["host"]["cpu_model"] == "x" and m["trials"][1]["gpu_state_end"] == {"power_w": values[1]}
    assert m["gpu_state_end"] == {"power_w": values[-1]}
    assert merged["provenance"] == {**records[0]["provenance"], "trials": 3}


def test_five_trials_or_more_give_a_bootstrap_interval(fresh_seed):
    values = [random.uniform(10, 11) for _ in range(5)]
    m = trials.merge([trial(v) for v in values])["metrics"]
    assert m["interval_method"] == "bootstrap"
    assert m["training_step_ms_median_interval"] == stats.summary(values)["interval"]
    low, high = m["training_step_ms_median_interval"]
    assert min(values) <= low <= statistics.median(values) <= high <= max(values)


def test_status_ok_if_any_trial_is_with_stats_over_the_ok_ones():
    m = trials.merge([trial(None, "oom"), trial(10.0), trial(12.0)])
    assert m["status"] == "ok" and m["metrics"]["training_step_ms_median"] == 11.0
    assert m["metrics"]["training_step_ms_median_interval"] == pytest.approx(t95([10.0, 12.0], 12.706))
    assert [t["status"] for t in m["metrics"]["trials"]] == ["oom", "ok", "ok"]
    single = trials.merge([trial(None, "oom"), trial(10.0)])["metrics"]
    assert single["interval_method"] == "single" and "training_step_ms_median_interval" not in single


def test_no_ok_trial_gives_the_first_trials_status_and_reason():
    merged = trials.merge([trial(None, "unsupported"), trial(None, "oom")])
    validate(merged)
    assert (merged["status"], merged["reason"]) == ("unsupported", "unsupported in this trial")
    assert len(merged["metrics"]["trials"]) == 2 and merged["provenance"]["trials"] == 2


def test_the_merged_record_is_current_for_its_job():
    job = Job("e2e", {"results/cpu/e2e/tiny.json": {"model": "tiny"}}, SETTINGS, "results/cpu/e2e/tiny.json", trials=3)
    merged = trials.merge([trial(v, code=job.fingerprint()) for v in (10.0, 11.0, 12.0)])
    assert why_stale(merged, job) is None
    other = Job("e2e", job.records, {**SETTINGS, "measured_steps": 4}, job.output, trials=3)
    assert "measured_steps" in why_stale(merged, other)


def test_trial_paths_and_arguments():
    assert trials.trial_path("results/h100/e2e/small_ctx128.json", 2) == "results/h100/trials/e2e/small_ctx128.t2.json"
    template = "results/cpu/attention/plain_d{head_dim}_n{seq_len}.json"
    assert trials.trial_path(template, 0) == "results/cpu/trials/attention/plain_d{head_dim}_n{seq_len}.t0.json"
    assert '"output": "results/cpu/trials/attention/plain_d{head_dim}_n{seq_len}.t1.json"' in trials.trial_argument(
        SETTINGS, template, 1
    )
    assert trials.max_trials(2, "cpu") == 2 and trials.max_trials(3, "h100") == trials.MAX_TRIALS
    # a later trial finds its first trial's records; the first trial and a record are no later trials
    later = trials.trial_path("results/h100/ladder/small_ctx1024_{rung}.json", 12)
    assert trials.first_trial_of(later) == "results/h100/trials/ladder/small_ctx1024_{rung}.t0.json"
    assert trials.first_trial_of(trials.trial_path(template, 0)) is None
    assert trials.first_trial_of("results/h100/ladder/small_ctx1024_t1.json") is None


def test_narrow_keeps_the_picked_cells_and_a_ladder_up_to_its_rung():
    settings = {**SETTINGS, "rungs": ["baseline", "tf32", "bf16", "compile"]}
    narrowed = trials.narrow(settings, [{"head_dim": 32, "sequence_length": 64, "rung": "tf32"}])
    assert narrowed == {**settings, "head_dims": [32], "sequence_lengths": [64], "rungs": ["baseline", "tf32"]}
    assert trials.narrow(settings, [{"model": "tiny"}]) == settings
    # a later trial chooses nothing: only the rungs asked for
    assert trials.narrow(settings, [{"rung": "bf16"}], exact=True)["rungs"] == ["bf16"]


def _job_with_trials(root: Path, first: dict[int, list[float]]):
    """Records of head dims 16 and 32 under ``root`` with their first trials written (values by head dim)."""
    template = str(root / "results/cpu/attention/plain_d{head_dim}.json")
    records = {template.format(head_dim=d): {"head_dim": d} for d in first}
    for d, values in first.items():
        for i, v in enumerate(values):
            write_record(trials.trial_path(template.format(head_dim=d), i), trial(v, cell={"head_dim": d}))
    return template, sorted(records)


def fake_runner(values_by_dim: dict[int, list[float]], calls: list):
    """Stands for the runner: writes one trial record per head dim of the settings it is given."""

    def run(cell, device, settings, output, budget_s):
        calls.append(settings)
        for d in settings["head_dims"]:
            write_record(output.format(head_dim=d), trial(values_by_dim[d].pop(0), cell={"head_dim": d}))
        return 0

    return run


def test_disagreeing_trials_get_more_of_their_cells_only_until_the_cap_or_a_failed_one(tmp_path):
    template, records = _job_with_trials(tmp_path, {16: [10.0, 10.1, 10.2], 32: [10.0, 20.0, 30.0]})
    calls = []
    run = fake_runner({32: [5.0, 40.0, 6.0, 39.0]}, calls)
    n = trials.merge_job("attention", "cpu", SETTINGS, template, records, 3, 6, run=run)
    assert n == 6 and len(calls) == 3
    assert all(c["head_dims"] == [32] and c["sequence_lengths"] == SETTINGS["sequence_lengths"] for c in calls)
    d16, d32 = (load_record(p) for p in records)
    assert d16["provenance"]["trials"] == 3 and d32["provenance"]["trials"] == 6
    assert d32["metrics"]["training_step_ms_median"] == statistics.median([10.0, 20.0, 30.0, 5.0, 40.0, 6.0])
    assert d32["provenance"]["settings"] == SETTINGS  # the first trial's: the job's, not the narrowed run's
    assert not any(Path(trials.trial_path(p, i)).exists() for p in records for i in range(3, 7))
    # a failed extra trial ends the extra trials
    template, records = _job_with_trials(tmp_path / "failed", {16: [10.0, 10.1, 10.2], 32: [10.0, 20.0, 30.0]})
    n = trials.merge_job("attention", "cpu", SETTINGS, template, records, 3, 6, run=lambda *args: 1)
    assert n == 3 and load_record(records[1])["provenance"]["trials"] == 3


def test_trials_that_agree_get_no_more(tmp_path):
    template, records = _job_with_trials(tmp_path, {16: [10.0, 10.1, 10.4], 32: [10.0, 10.2, 10.3]})
    calls = []
    assert trials.merge_job("attention", "cpu", SETTINGS, template, records, 3, 6, run=fake_runner({}, calls)) == 3
    interval = load_record(records[1])["metrics"]["training_step_ms_median_interval"]
    assert calls == [] and interval == pytest.approx(t95([10.0, 10.2, 10.3], 4.303))
    assert trials.disagree([trial(v) for v in (10.0, 10.2, 10.6)])  # a spread of 5.9% of 10.2
    assert not trials.disagree([trial(v) for v in (10.0, 10.2, 10.5)]) and not trials.disagree([trial(9.0)])


def test_a_gpu_bound_cell_whose_two_trials_agree_stops_at_two_and_says_why(tmp_path):
    assert trials.passes("e2e", 3) == 2 and trials.passes("attention", 3) == 3 and trials.passes("e2e", 1) == 1
    # (busy share, two step times, status): which cells get their third trial
    cells = {
        16: (0.95, [100.0, 100.2], "ok"),  # GPU-bound, a stable interval from two: they suffice
        256: (0.95, [100.0, 101.0], "ok"),  # GPU-bound within 5%, but two trials 1% apart: unstable
        32: (0.40, [30.0, 30.2], "ok"),  # host-bound: its third trial
        64: (0.95, [100.0, 120.0], "ok"),  # GPU-bound but disagreeing: more, as any cell
        128: (None, [1.0, 1.0], "oom"),  # out of memory twice: nothing to time
    }
    template = str(tmp_path / "results/cpu/e2e/cell_d{head_dim}.json")
    records = {template.format(head_dim=d): d for d in cells}
    for path, d in records.items():
        busy, values, status = cells[d]
        for i, v in enumerate(values):
            write_record(trials.trial_path(path, i), trial(v, status, cell={"head_dim": d}, busy=busy))
    calls = []

    def run(cell, device, settings, output, budget_s):
        calls.append(sorted(settings["head_dims"]))
        for d in settings["head_dims"]:
            busy, values, _ = cells[d]
            write_record(output.format(head_dim=d), trial(values[0], cell={"head_dim": d}, busy=busy))
        return 0

    settings = {**SETTINGS, "head_dims": sorted(cells)}
    n = trials.merge_job("e2e", "h100", settings, template, sorted(records), 2, 6, run=run, required=3)
    assert calls[0] == [32, 64, 256] and all(c == [64] for c in calls[1:]) and n == 6
    merged = {d: load_record(path) for path, d in records.items()}
    assert [len(merged[d]["metrics"]["trials"]) for d in cells] == [2, 3, 3, 6, 2]  # 16, 256, 32, 64, 128
    assert merged[16]["metrics"]["fewer_trials_because"] == "gpu_bound"
    assert merged[128]["metrics"]["fewer_trials_because"] == "same_outcome"
    assert "fewer_trials_because" not in merged[32]["metrics"]
