"""The HTML report (`snakemake --report report/report.html`) in a real headless browser (issue 52):
it opens, every kind's category holds its answer sections and its figures, the answers pages are
there with the device report's every section, and no image fails to load.

The report is built in ``built`` (conftest.py: a temporary copy of the checkout where report-only
runs drew every device's report from the committed records), as a reader would build it. The
browser is Debian's Chromium with its driver (`apt-get install -y chromium chromium-driver`, which
.ci/run does); without them, or without selenium, the test skips and says why.
"""

from __future__ import annotations

import base64
import importlib
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from lmperf.core import config as lmperf_config
from lmperf.kinds import KINDS

from .conftest import DEVICES, REPO, snakemake

DEVICE = DEVICES[0]  # the front page's device
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1000",
)
WAIT_S = 20


def browser_or_skip():
    """Chromium's path and its driver's, or a skip naming what is missing."""
    pytest.importorskip("selenium", reason="selenium is not installed (pyproject.toml's `test` extra)")
    found = {name: shutil.which(name) for name in ("chromium", "chromedriver")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        pytest.skip(
            f"{' and '.join(missing)} not found: `apt-get install -y chromium chromium-driver` (as .ci/run does)"
        )
    return found["chromium"], found["chromedriver"]


def expected_items() -> dict[str, tuple[list[str], list[str]]]:
    """Per kind of the device's grid: (its section fragments, its figures) as the report names them."""
    config = lmperf_config.validate(yaml.safe_load((REPO / "config.yaml").read_text()))
    grid = lmperf_config.grid(config, DEVICE)
    out = {}
    for kind in (k for k in KINDS if k in grid):
        module = importlib.import_module(f"lmperf.kinds.{kind}.report")
        sections = [f"results/{DEVICE}/sections/{s}.md" for s in module.SECTIONS]
        out[kind] = (sections, [f"results/{DEVICE}/{p}" for p in module.outputs(grid[kind]) if p.endswith(".png")])
    return out


@pytest.fixture(scope="module")
def report_html(built) -> Path:
    browser_or_skip()
    snakemake(built, "--report", "report/report.html", "--config", f"device={DEVICE}", "report_only=true")
    return built / "report" / "report.html"


@pytest.fixture(scope="module")
def browser(report_html):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = browser_or_skip()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    page = webdriver.Chrome(options=options, service=Service(driver))
    try:
        page.get(report_html.as_uri())
        yield page
    finally:
        page.quit()
        shutil.rmtree(profile, ignore_errors=True)


def click_text(page, text: str) -> None:
    """Click the menu entry or breadcrumb that reads ``text``, once it is there."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    xpath = (
        f"//a[normalize-space(.)={json.dumps(text)}] | //*[not(self::a)][normalize-space(text())={json.dumps(text)}]"
    )
    WebDriverWait(page, WAIT_S).until(ec.element_to_be_clickable((By.XPATH, xpath))).click()


def open_list(page, kind: str, subcategory: str) -> None:
    """Show ``kind``'s list of ``subcategory`` (a category with one subcategory shows its files at once)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    click_text(page, "Results")
    click_text(page, kind)
    entry = f"//*[normalize-space(text())={json.dumps(subcategory)}]"
    WebDriverWait(page, WAIT_S).until(
        lambda p: p.find_elements(By.XPATH, entry) or p.find_elements(By.XPATH, "//tr/td")
    )
    if page.find_elements(By.XPATH, entry):
        click_text(page, subcategory)


def listed_files(page, expected: list[str]) -> list[str]:
    """The file names of the results list on show (its FILE column), once it is ``expected`` or the wait ends."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def names(p) -> list[str]:
        try:
            return sorted(td.text.strip() for td in p.find_elements(By.XPATH, "//tr/td[1]") if td.text.strip())
        except StaleElementReferenceException:  # the list was drawn anew while read
            return []

    try:
        WebDriverWait(page, WAIT_S).until(lambda p: names(p) == sorted(expected))
    except TimeoutException:
        pass
    return names(page)


def shown_image_loads(page, name: str) -> bool:
    """Open ``name``'s view (its eye button) and wait for the image it shows to finish loading."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    row = page.find_element(By.XPATH, f"//tr[td[1][normalize-space(.)={json.dumps(name)}]]")
    row.find_element(By.CSS_SELECTOR, "a[iconname=eye]").click()
    script = (
        "const img = [...document.images].find(i => i.src === results[arguments[0]].data_uri);"
        "return img && img.complete ? img.naturalWidth : null;"
    )
    return WebDriverWait(page, WAIT_S).until(lambda p: p.execute_script(script, name) is not None) and (
        page.execute_script(script, name) > 0
    )


def test_the_html_report_shows_every_section_and_every_figure(browser, report_html):
    page = browser
    assert page.title == "Snakemake Report"
    kinds = expected_items()
    click_text(page, "answers")
    pages = ["report/answers.md", f"report/{DEVICE}/answers.md"]
    assert listed_files(page, pages) == sorted(pages), "the answers pages"
    for path in pages:  # the pages as embedded, byte for byte
        embedded = page.execute_script("return results[arguments[0]].data_uri", path)
        on_disk = (report_html.parent.parent / path).read_bytes()
        assert base64.b64decode(embedded.split("base64,", 1)[1]) == on_disk, f"{path} differs in the report"
    failed = []
    for kind, (sections, figures) in kinds.items():
        open_list(page, kind, "answer sections")
        assert listed_files(page, sections) == sorted(sections), f"{kind}'s answer sections"
        if figures:
            open_list(page, kind, "figures")
            assert listed_files(page, figures) == sorted(figures), f"{kind}'s figures"
            failed += [name for name in figures if not shown_image_loads(page, name)]
    assert not failed, f"images that did not load: {failed}"
    broken = page.execute_script("return [...document.images].filter(i => i.complete && !i.naturalWidth).length")
    assert broken == 0, "an image on the page failed to load"
    errors = [e["message"] for e in page.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"the browser reported errors: {errors}"
