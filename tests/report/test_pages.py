"""The reader's pages built from the committed GPU records (issue 52): the front page and each
device's report within their sizes, every figure a report run draws referenced from a section, and
each section's one-line answer where the front page reads it.

Every kind's report runs on the committed ``results/<device>/`` records into a temporary
``results/<device>/`` (report only: no cell runs, no Snakemake), then the assembler writes
``report/<device>/answers.md`` and the front page there, as the workflow's rules do.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lmperf.core import config as lmperf_config
from lmperf.kinds import KINDS, RECORD_FOLDERS
from lmperf.report.answers import PROBLEMS, SUMMARY, SUMMARY_CHARS, fragment_name

REPO = Path(__file__).resolve().parents[2]
DEVICES = ("h100", "h200")  # the committed records; the first is the front page's device
FRONT_BYTES, DEVICE_BYTES = 30_000, 120_000


def record_paths(device: str, kinds) -> list[str]:
    folders = [f for f, kind in RECORD_FOLDERS.items() if kind in kinds]
    return sorted(str(p) for f in folders for p in (REPO / "results" / device / f).glob("*.json"))


def report_commands(device: str, out: Path) -> list[list[str]]:
    """Each kind's report as the workflow runs it: its grid slice and its records (and those it also reads)."""
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    grid = lmperf_config.grid(lmperf_config.validate(config), device)
    commands = []
    for kind in KINDS:
        if kind not in grid:
            continue
        module = __import__(f"lmperf.kinds.{kind}.report", fromlist=["ALSO_READS"])
        owners = {kind, *(RECORD_FOLDERS.get(k, k) for k in module.ALSO_READS)}
        commands.append(
            [sys.executable, "-m", module.__name__, "--device", device, "--out", str(out / "results" / device)]
            + ["--grid", json.dumps(grid[kind]), "--records", *record_paths(device, owners)]
        )
    return commands


def run_all(commands: list[list[str]], cwd: Path) -> None:
    """The commands, as many at once as there are cores; each must succeed."""
    running: list[tuple[list[str], subprocess.Popen]] = []
    for command in commands + [None]:
        while running and (command is None or len(running) >= (os.cpu_count() or 1)):
            done, process = running.pop(0)
            _, err = process.communicate()
            assert process.returncode == 0, f"{' '.join(done[:3])} failed:\n{err[-3000:]}"
        if command is not None:
            running.append((command, subprocess.Popen(command, cwd=cwd, stderr=subprocess.PIPE, text=True)))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A temporary folder with results/<device>/{figures,tables,sections} and report/ of every device."""
    missing = [d for d in DEVICES if not record_paths(d, set(RECORD_FOLDERS.values()))]
    if missing:
        pytest.skip(f"no committed records under results/{missing[0]}/")
    out = tmp_path_factory.mktemp("pages")
    run_all([c for d in DEVICES for c in report_commands(d, out)], out)
    for device in DEVICES:
        front = ["--front", "report/answers.md"] if device == DEVICES[0] else []
        sections = sorted(str(p) for p in (out / "results" / device / "sections").glob("*.md"))
        command = [sys.executable, "-m", "lmperf.report.answers", "--device", device]
        command += ["--results", str(REPO / "results" / device), "--results-root", str(REPO / "results")]
        command += ["--output", f"report/{device}/answers.md", *front, "--sections", *sections]
        subprocess.run(command, cwd=out, check=True)  # cwd: the report's links are relative to it
    return out


def fragments(built: Path, device: str) -> dict[str, str]:
    return {p.stem: p.read_text() for p in sorted((built / "results" / device / "sections").glob("*.md"))}


def test_front_page_and_device_reports_fit_their_sizes(built):
    front = built / "report" / "answers.md"
    assert front.stat().st_size <= FRONT_BYTES, f"the front page is {front.stat().st_size:,} bytes"
    for device in DEVICES:
        report = built / "report" / device / "answers.md"
        assert report.stat().st_size <= DEVICE_BYTES, f"{device}'s report is {report.stat().st_size:,} bytes"


@pytest.mark.parametrize("device", DEVICES)
def test_every_figure_drawn_is_referenced_from_a_section(built, device):
    figures = sorted((built / "results" / device / "figures").glob("*.png"))
    assert figures, "the reports drew no figure"
    text = "\n".join(fragments(built, device).values())
    unreferenced = [f.name for f in figures if f"](../../results/{device}/figures/{f.name})" not in text]
    assert not unreferenced, f"figures no section of {device} links to: {unreferenced}"


@pytest.mark.parametrize("device", DEVICES)
def test_each_section_opens_with_its_answer_in_one_line(built, device):
    for name, text in fragments(built, device).items():
        match = SUMMARY.match(text)
        if match is None:  # only a section that says in one line that nothing was measured
            assert text.strip().count("\n") == 0, f"{name} has no summary line"
            continue
        answer = match.group(1)
        assert "\n" not in answer and 0 < len(answer) <= SUMMARY_CHARS, f"{name}'s summary: {answer!r}"
        assert "<!--" not in text[match.end() :], f"{name} has a second summary"
    report = (built / "report" / device / "answers.md").read_text()
    assert "<!-- summary" not in report, "the device report keeps a summary comment"


def test_the_front_page_answers_every_question_in_one_line_with_a_link(built):
    device = DEVICES[0]
    found = fragments(built, device)
    front = (built / "report" / "answers.md").read_text()
    report = (built / "report" / device / "answers.md").read_text()
    for problem, _, parts in PROBLEMS:
        if not any(fragment_name(problem, p) in found for p in parts):
            continue
        row = next((line for line in front.splitlines() if line.startswith(f"| {problem}: ")), None)
        assert row is not None, f"no row for {problem}"
        _, _, answer, link, _ = (cell.strip() for cell in re.split(r"(?<!\\)\|", row))
        assert answer, f"{problem} has no answer on the front page"
        anchor = re.fullmatch(rf"\[{device}\]\({device}/answers\.md#([a-z-]+)\)", link).group(1)
        assert f'<a id="{anchor}"></a>' in report, f"{problem}'s link lands nowhere"
