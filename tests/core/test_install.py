"""The install path: scripts/install.sh, with the versions CI tests (constraints/ci-cpu.txt)."""

from __future__ import annotations

import re
import subprocess

import tomllib
from conftest import REPO


def name(requirement: str) -> str:
    """'snakemake>=9.19' -> 'snakemake', compared the way pip does (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip()).group(0)).lower()


def test_the_constraints_pin_every_dependency_ci_installs():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = re.search(r"scripts/install.sh (\S+)", (REPO / ".ci/run").read_text()).group(1).split(",")
    wanted = {
        name(r) for r in project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]]
    }
    lines = (line.split("#", 1)[0].strip() for line in (REPO / "constraints/ci-cpu.txt").read_text().splitlines())
    pins = dict(line.split("==") for line in lines if line)
    assert not wanted - {name(p) for p in pins}, "dependencies without a pin in constraints/ci-cpu.txt"
    assert pins["torch"].endswith("+cpu"), "CI tests PyTorch's CPU build"


def test_the_install_script_parses_and_installs_with_the_constraints():
    script = REPO / "scripts/install.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert script.read_text().count("-c constraints/ci-cpu.txt") == 2  # torch, then the package
