"""Shared test fixtures: the repository root, a fresh random seed per test, and bench/ scripts as modules."""

from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture
def fresh_seed() -> int:
    """A different seed every run, printed so a failure can be reproduced."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    random.seed(seed)
    return seed


@pytest.fixture
def bench_module():
    """Loads a script of bench/ (not a package) as a module: `bench_module("flash_host_probe")`."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
