"""Records are data, never code (issue 49): a record full of shell metacharacters goes through a dry
run, a report-only run and a real run as data; a field that names a thing (commit, fingerprint,
device), a file or folder with an odd name, an unreadable or misplaced record, a misspelt kind or
an unknown device stop the run before any job, naming the path or key and the fix."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from .pipeline import E2E, FIX, ok, record, refused, snakemake, write_config

RECORD = f"results/cpu/e2e/{E2E[0]}.json"
# every string a record may hold that names no thing: free text, settings and metrics
FREE_TEXT = ("device_name", "torch_version", "triton_version", "python_version", "hostname", "cuda_version")


@pytest.fixture
def probe(tmp_path):
    """(a value that runs `touch MARKER` and truncates VICTIM wherever a shell or an option parser
    reads it, a check that neither happened)."""
    marker, victim = tmp_path / "pwned", tmp_path / "victim"
    victim.write_text("keep")
    evil = f"$(touch {marker}); touch {marker} `touch {marker}` --output={victim}"

    def untouched():
        assert not marker.exists() and victim.read_text() == "keep"

    return evil, untouched


def test_a_record_full_of_shell_metacharacters_is_data(copy, probe):
    evil, untouched = probe
    data = record(copy / RECORD, **dict.fromkeys(FREE_TEXT, evil), cuda_visible_devices=evil)
    data["reason"], data["metrics"][evil] = evil, evil
    data["provenance"]["host"]["cpu_model"] = evil
    data["provenance"]["settings"][evil] = evil  # a setting no job has: the record is stale
    (copy / RECORD).write_text(json.dumps(data))
    for args in (["-n", "all"], ["all", "--config", "report_only=true"], ["all"]):
        ok(snakemake(copy, *args))
        untouched()
    assert evil not in (copy / RECORD).read_text()  # measured again, with the grid's settings


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("git_commit", "--output={victim}", "at provenance/git_commit"),
        ("code_version", "$(touch {marker})", "at provenance/code_version"),
        ("device_slug", "cpu; touch {marker}", "at provenance/device_slug"),
        ("model", "$(touch {marker})", "belongs at"),
    ],
    ids=["commit", "fingerprint", "device", "cell"],
)
def test_a_field_that_names_a_thing_is_checked_when_records_are_read(copy, probe, field, value, problem):
    evil, untouched = probe
    marker, victim = evil.split("(touch ")[1].split(")")[0], evil.rsplit("=", 1)[1]
    value = value.format(marker=marker, victim=victim)
    data = record(copy / RECORD) if field == "model" else record(copy / RECORD, **{field: value})
    data["cell"]["model"] = value if field == "model" else data["cell"]["model"]
    (copy / RECORD).write_text(json.dumps(data))
    runs = (
        [["-n", "all"], ["all", "--config", "report_only=true"], ["all"]] if field == "git_commit" else [["-n", "all"]]
    )
    for args in runs:
        message = refused(snakemake(copy, *args))
        assert f"{RECORD}: " in message and problem in message and "delete it" in message, message
        untouched()


def write_copy_of(src, name):
    def make(folder):
        shutil.copy(folder / src, folder / name)

    return make


def h100_record(folder):
    data = record(folder / f"{E2E[0]}.json", device_slug="h100", device_name="NVIDIA H100 80GB HBM3")
    (folder / f"{E2E[0]}.json").write_text(json.dumps(data))


@pytest.mark.parametrize(
    "name, make, problem",
    [
        ("x; touch pwned.json", write_copy_of(f"{E2E[0]}.json", "x; touch pwned.json"), f"belongs at {RECORD}"),
        (f"{E2E[1]}.json", write_copy_of(f"{E2E[0]}.json", f"{E2E[1]}.json"), f"belongs at {RECORD}"),
        ("x.json", lambda folder: (folder / "x.json").mkdir(), "not a readable UTF-8 file (IsADirectoryError"),
        ("bad.json", lambda folder: (folder / "bad.json").write_bytes(b'{"kind": "e2e\xff"}'), "(UnicodeDecodeError"),
        (f"{E2E[0]}.json", h100_record, "a record measured on 'h100' in the folder of device 'cpu'"),
    ],
    ids=["semicolon", "other-cell", "directory", "bad-utf8", "h100"],
)
def test_an_odd_unreadable_or_misplaced_record_stops_the_run_naming_it(copy, name, make, problem):
    make(copy / "results/cpu/e2e")
    message = refused(snakemake(copy, "all"))
    assert f"results/cpu/e2e/{name}: " in message and problem in message, message
    assert FIX in message or "move it there or delete it" in message, message
    assert not list(copy.rglob("pwned"))


@pytest.mark.parametrize("grid", ["gpu", "cpu"])
def test_a_misspelt_kind_is_an_error_with_a_suggestion(copy, grid):
    config = yaml.safe_load((copy / "config.yaml").read_text())
    config["grids"][grid]["attentoin"] = {"head_dims": [16]}
    write_config(copy, config)
    message = refused(snakemake(copy, "-n", "all"))
    assert f"unknown key grids.{grid}.attentoin: did you mean 'attention'?" in message


@pytest.mark.parametrize("report_only", ["false", "true"])
def test_an_unknown_device_stops_before_any_job_and_leaves_nothing(copy, report_only):
    message = refused(snakemake(copy, "all", "--config", "device=h900", f"report_only={report_only}"))
    assert "device 'h900'" in message
    assert not [path for path in copy.rglob("*") if "h900" in path.name]
