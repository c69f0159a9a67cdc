"""A record's provenance (lmperf.core.device): device, versions, settings, the code's fingerprint,
git's state (named by the environment where the checkout cannot tell), and the process's start."""

from __future__ import annotations

import datetime as dt
import os

import torch

from lmperf.core import device as devices
from lmperf.core.fingerprint import fingerprint


def test_provenance_names_device_versions_settings_and_the_cells_fingerprint():
    settings = {"probes": ["accumulation"], "attention": "flash"}
    p = devices.provenance("cpu", settings, "precision")
    assert (p["device_slug"], p["torch_version"], p["settings"]) == ("cpu", torch.__version__, settings)
    assert p["code_version"] == fingerprint("lmperf.kinds.precision.cell", settings)


def test_git_state_named_by_the_environment_wins_and_git_is_asked_once(monkeypatch):
    monkeypatch.setenv("LMPERF_GIT_COMMIT", "a" * 40)
    for dirty, expected in (("0", False), ("1", True)):
        monkeypatch.setenv("LMPERF_GIT_DIRTY", dirty)
        assert devices.git_state() == {"git_commit": "a" * 40, "git_dirty": expected}
    monkeypatch.delenv("LMPERF_GIT_COMMIT")
    calls = []
    answers = {"rev-parse": "b" * 40, "status": ""}
    monkeypatch.setattr(devices, "_git", lambda *args: calls.append(args[0]) or answers[args[0]])
    devices._checkout_git_state.cache_clear()
    try:
        devices.git_state()["git_dirty"] = True  # a caller's copy: the process's answer stays
        assert devices.git_state() == {"git_commit": "b" * 40, "git_dirty": False}
        assert calls == ["rev-parse", "status"]
    finally:
        devices._checkout_git_state.cache_clear()


def test_a_start_named_in_the_environment_counts_only_in_its_own_process(monkeypatch):
    epoch = 1700000000.0
    monkeypatch.setenv("LMPERF_PROCESS_START", f"{os.getpid()}:{epoch}")
    start = devices.process_clock()["process_start_time"]
    assert abs(dt.datetime.fromisoformat(start).timestamp() - epoch) < 1e-3
    monkeypatch.setenv("LMPERF_PROCESS_START", f"{os.getpid() + 1}:{epoch}")  # inherited from another process
    assert dt.datetime.fromisoformat(devices.process_clock()["process_start_time"]).timestamp() > epoch + 1e6
    assert devices.slug_from_name("NVIDIA H100 80GB HBM3") == "h100"
    assert devices.slug_from_name("Some GPU") == "some-gpu"
