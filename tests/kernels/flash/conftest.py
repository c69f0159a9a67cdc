"""A fresh random generator per test; its seed is in every failure message."""

import os

import pytest
import torch


@pytest.fixture
def rng() -> torch.Generator:
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
