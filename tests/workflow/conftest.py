"""One real CPU run of the tiny grid, shared by every workflow test; each test works in a copy of it
(``copy``, with Snakemake's .snakemake/) or in a fresh clone of it (``clone``).

The run's directory name holds shell metacharacters: any path that reaches a shell unquoted
would run them (``$(touch pwned)``) or break the run (the space)."""

from __future__ import annotations

import shutil
import sys

import pytest

from .pipeline import copy_checkout, fresh_clone, ok, snakemake

ODD_NAME = "run; $(touch pwned) `touch pwned`"


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory):
    if not sys.platform.startswith("linux"):
        pytest.skip("the workflow's runs need Linux (/proc, PR_SET_PDEATHSIG)")
    work = copy_checkout(tmp_path_factory.mktemp("workflow") / ODD_NAME)
    ok(snakemake(work, "all"))
    return work


@pytest.fixture
def copy(pipeline, tmp_path):
    """The run's directory as it is after the run, Snakemake's records of it included."""
    return shutil.copytree(pipeline, tmp_path / ODD_NAME, symlinks=True)


@pytest.fixture
def clone(pipeline, tmp_path):
    return fresh_clone(pipeline, tmp_path / "clone")
