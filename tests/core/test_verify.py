"""lmperf.core.verify: the seeded sample across cells and halves, and `snakemake verify` on a CPU."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lmperf.core import verify
from lmperf.kinds import KINDS
from lmperf.report.answers import main as answers_main
from lmperf.report.answers import reproduce, summary_of

REPO = Path(__file__).resolve().parents[2]


def found(fresh: random.Random) -> dict:
    """Candidates of three timed cells: e2e with GPU busy fractions, attention and ladder by time only."""
    out = {f"e2e/{i}.json": ("e2e", fresh.uniform(5, 500), fresh.random()) for i in range(10)}
    out |= {f"attention/{i}.json": ("attention", fresh.uniform(0.1, 50), None) for i in range(9)}
    out |= {f"ladder/{i}.json": ("ladder", fresh.uniform(50, 900), None) for i in range(3)}
    return out


def test_the_sample_is_seeded(fresh_seed):
    candidates = found(random.Random(fresh_seed))
    picks = verify.sample(candidates, 12, seed=fresh_seed)
    assert picks == verify.sample(dict(reversed(candidates.items())), 12, seed=fresh_seed)
    assert len(picks) == 12 and len({p for p, _ in picks}) == 12
    assert any(verify.sample(candidates, 12, seed=s) != picks for s in range(fresh_seed + 1, fresh_seed + 4))


def test_the_sample_spreads_across_cells_and_their_halves(fresh_seed):
    candidates = found(random.Random(fresh_seed))
    picks = verify.sample(candidates, 7, seed=fresh_seed)
    cells = [candidates[p][0] for p, _ in picks]
    assert sorted(set(cells)) == ["attention", "e2e", "ladder"] and max(map(cells.count, set(cells))) == 3
    for cell, key in (("e2e", 2), ("attention", 1)):  # e2e split by GPU busy fraction, attention by time
        ranked = sorted((p for p in candidates if candidates[p][0] == cell), key=lambda p: candidates[p][key])
        halves = {half for p, half in picks if candidates[p][0] == cell}
        assert halves == {"host", "gpu"}
        for path, half in picks:
            if candidates[path][0] == cell:
                assert (ranked.index(path) < len(ranked) // 2) == (half == "host")
    everything = verify.sample(candidates, 100, seed=fresh_seed)
    assert sorted(p for p, _ in everything) == sorted(candidates)


def digests(root: Path) -> dict:
    files = (p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


TINY = {
    "verify": {"count": 2, "seed": 0},
    "grids": {
        "cpu": {
            "e2e": {"main": {"models": ["tiny"], "context_lengths": [32], "precisions": ["fp32"]}}
            | dict.fromkeys(("compile", "warmup_sweep", "attention_compare")),
            "attention": {"implementations": ["plain"], "head_dims": [16], "sequence_lengths": [64, 128]},
        }
        | dict.fromkeys(("nsys", "memory", "precision", "flash", "ladder", "scaleout")),
    },
}


@pytest.mark.slow
def test_a_ladder_rung_is_timed_as_its_record_chose_it(tmp_path, monkeypatch):
    """The ladder's verify runs the rung alone, with the committed record as its first trial."""
    from lmperf.core import trials
    from lmperf.core.plan import Job

    cell = {"model": "tiny", "context_length": 32, "rung": "max_batch"}
    path = "results/cpu/ladder/tiny_ctx32_max_batch.json"
    settings = {"model": "tiny", "rungs": ["baseline", "bf16", "max_batch", "grad_accum"]}
    job = Job("ladder", {path: cell}, settings, "results/cpu/ladder/tiny_ctx32_{rung}.json", trials=2)
    metrics = {"step_ms_median": 20.0, "step_ms_median_interval": [19, 21]}
    committed = {"cell": cell, "status": "ok", "metrics": metrics, "provenance": {"trials": 2}}
    calls = []

    def fake_run(cell_name, device, settings, output, *rest):
        first = json.loads(Path(trials.first_trial_of(output).format(rung="max_batch")).read_text())
        calls.append((settings["rungs"], first == committed))
        new = {**committed, "metrics": {"step_ms_median": 20.5}, "provenance": {"trials": 1, "start_time": "now"}}
        Path(output.format(rung="max_batch")).write_text(json.dumps(new))
        return 0

    monkeypatch.setattr(verify.T, "run_trial", fake_run)
    monkeypatch.setattr(verify, "load_record", lambda p: json.loads(Path(p).read_text()))
    monkeypatch.setattr(verify.T, "merge", lambda news: {"status": "ok", "metrics": {"step_ms_median": 20.5}})
    entry = verify.remeasure(path, job, committed, "cpu", tmp_path)
    assert calls == [(["max_batch"], True)] * 2  # the rung alone, from the committed choice, in 2 trials
    assert entry["inside"] is True and entry["new"]["median"] == 20.5


def test_verify_on_a_cpu_remeasures_in_a_scratch_folder(tmp_path):
    """A tiny grid's timed records measured (2 trials each), then `snakemake verify` in the same copy."""
    work = tmp_path / "clone"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True)
    for name in listed.stdout.splitlines():
        top = name.split("/")[0] in ("Snakefile", "workflow", "src", "envs", "config.yaml", "pyproject.toml")
        if top and (REPO / name).is_file():  # tracked files deleted in the working tree are listed too
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / name, work / name)
    os.symlink("workflow/profiles", work / "profiles")
    (work / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    env = {**os.environ, "PYTHONPATH": str(work / "src")}
    snakemake = [sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "tiny.yaml"]
    reports = ["answers", *(f"{kind}_report" for kind in KINDS)]  # `all` less its reports: records only
    run = subprocess.run([*snakemake, "--omit-from", *reports, "--", "all"], cwd=work, env=env, capture_output=True)
    assert run.returncode == 0, run.stderr.decode()[-4000:]
    records = sorted(str(p.relative_to(work)) for p in (work / "results/cpu").glob("*/*.json"))
    assert len(records) == 3  # e2e, attention at two lengths
    assert not (work / "results/cpu/trials").exists() or not any((work / "results/cpu/trials").rglob("*.json"))
    before = digests(work / "results")
    run = subprocess.run([*snakemake, "--", "verify"], cwd=work, env=env, capture_output=True)
    assert run.returncode == 0, run.stderr.decode()[-4000:]
    after = digests(work / "results")
    date = dt.datetime.now(dt.timezone.utc).date().isoformat()  # the run's day (unless it crossed midnight)
    assert set(after) - set(before) == {f"cpu/verify/{date}.json"}
    assert {k: after[k] for k in before} == before
    result = json.loads((work / f"results/cpu/verify/{date}.json").read_text())
    assert [c["cell"] for c in result["cells"]] in (["e2e", "attention"], ["attention", "e2e"])
    assert {c["record"] for c in result["cells"]} <= set(records)
    for c in result["cells"]:
        committed, m = json.loads((work / c["record"]).read_text())["metrics"], c["metric"]
        assert c["committed"] == {"median": committed[m], "interval": committed[f"{m}_interval"], "trials": 2}
        low, high = c["committed"]["interval"]
        assert c["new"]["status"] == "ok" and c["inside"] == (low <= c["new"]["median"] <= high)
    assert result["fraction_inside"] == sum(c["inside"] for c in result["cells"]) / 2
    # the report, written after it, reads the records beside it (not it) and answers "reproduce" from it
    answers = ["--device", "cpu", "--results", str(work / "results/cpu"), "--output", str(work / "answers.md")]
    answers_main([*answers, "--verify", str(work / f"results/cpu/verify/{date}.json")])
    report = (work / "answers.md").read_text()
    for c in result["cells"]:  # its reproduce section: a row per re-measured record
        record = "/".join(Path(c["record"]).with_suffix("").parts[-2:])
        assert f"| {record} | {c['half']} | {c['metric']} |" in report[report.index('<a id="reproduce">') :]


def test_the_reproduce_section_says_how_far_outside_a_miss_lies():
    def cell(name, interval, new, inside):
        committed = {"median": 10.0, "interval": interval, "trials": 3}
        new = {"status": "ok", "median": new, "interval": None}
        return dict(record=f"r/e2e/{name}.json", metric="ms", half="gpu", committed=committed, new=new, inside=inside)

    # b: 0.5 below the low end, 5% of the median; c: one trial, nothing to judge
    cells = [cell("a", [9.5, 10.5], 10.2, True), cell("b", [9.5, 10.5], 9.0, False), cell("c", None, 12.0, None)]
    text = reproduce({"device": "h100", "date": "2026-01-02", "seed": 0, "cells": cells})
    assert summary_of(text).startswith("1 of 2 re-measured cells landed inside")
    assert summary_of(text).endswith("; the one outside missed by 5% of the median.")
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| e2e/")]
    assert [(r[0], r[-1]) for r in rows] == [("| e2e/a", "inside |"), ("| e2e/b", "**5%** |"), ("| e2e/c", "— |")]
