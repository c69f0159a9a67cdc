"""The install path README gives: scripts/install.sh and the versions CI tests (constraints/ci-cpu.txt)."""

from __future__ import annotations

import re
import subprocess

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _name(requirement: str) -> str:
    """'snakemake>=9.19' -> 'snakemake'; names compared the way pip does (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip()).group(0)).lower()


def _pins(repo_root) -> dict[str, str]:
    pins = {}
    for line in (repo_root / "constraints/ci-cpu.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[_name(name)] = version
    return pins


def test_constraints_pin_every_dependency_ci_installs(repo_root):
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in ("test", "cluster", "lint"):  # what .ci/run installs
        wanted += project["optional-dependencies"][extra]
    pins = _pins(repo_root)
    missing = sorted({_name(r) for r in wanted} - set(pins))
    assert not missing, f"pyproject.toml dependencies without a pin in constraints/ci-cpu.txt: {missing}"
    assert pins["torch"].endswith("+cpu"), "CI tests PyTorch's CPU build"


def test_install_script_and_ci_agree(repo_root):
    script = repo_root / "scripts/install.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "-c constraints/ci-cpu.txt" in text and "download.pytorch.org/whl/cpu" in text
    ci = (repo_root / ".ci/run").read_text()
    assert "scripts/install.sh test,cluster,lint" in ci
    readme = (repo_root / "README.md").read_text()
    assert "scripts/install.sh && snakemake --cores 1 all" in readme
    assert "scripts/install.sh test,cluster && python -m pytest -q" in readme
