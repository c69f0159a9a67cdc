"""Shared test fixtures: the repository root and a fresh random seed per test."""

from __future__ import annotations

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
