"""The reader's pages built from the committed GPU records (issue 52): the front page and each
device's report within their sizes, every figure a report run draws referenced from a section, and
each section's one-line answer where the front page reads it.

The pages are those of ``built`` (conftest.py): a report-only Snakemake run per device on the
committed records, in a temporary copy of the checkout.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lmperf.kinds import RECORD_FOLDERS
from lmperf.report.answers import PROBLEMS, SUMMARY, SUMMARY_CHARS, fragment_name
from lmperf.report.devices import COMPARE_MODULES

from .conftest import DEVICES

FRONT_BYTES, DEVICE_BYTES = 30_000, 120_000


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


def test_the_front_page_says_whether_the_devices_ran_the_same_code(built):
    """Independent of the comparison code: two devices' records at the same path are the same cell; where
    any such pair of a compared kind names different code versions, the front page must not call the code
    the same."""
    roots = [built / "results" / device for device in DEVICES]
    folders = [folder for folder, kind in RECORD_FOLDERS.items() if kind in COMPARE_MODULES]
    pairs = [(p, roots[1] / p.relative_to(roots[0])) for f in folders for p in sorted((roots[0] / f).glob("*.json"))]
    versions = [
        {json.loads(p.read_text())["provenance"]["code_version"] for p in pair} for pair in pairs if pair[1].exists()
    ]
    front = (built / "report" / "answers.md").read_text()
    if any(len(v) > 1 for v in versions):
        assert "compared cells ran different code on different devices" in front
    else:
        assert "Every compared cell ran the same code on each device." in front


@pytest.mark.parametrize("device", DEVICES)
def test_the_latest_committed_verify_run_answers_reproduce(built, device):
    """A verify run beside the records is no record: the report builds, a row per cell of the latest run."""
    runs = sorted((built / "results" / device / "verify").glob("*.json"))
    if not runs:
        pytest.skip(f"no verify run committed for {device}")
    report = (built / "report" / device / "answers.md").read_text()
    section = report[report.index('<a id="reproduce">') :]
    for cell in json.loads(runs[-1].read_text())["cells"]:
        record = "/".join(Path(cell["record"]).with_suffix("").parts[-2:])
        assert f"| {record} | {cell['half']} | {cell['metric']} |" in section
