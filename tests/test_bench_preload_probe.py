"""bench/preload_probe.py: it names the first module whose import leaves a `cuda…` thread running.

No CUDA here: a module of the test's own starts a thread named like the driver's at import, under
another module that imports it; the probe must name the inner one, and time the import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

STARTS_A_DRIVER_LIKE_THREAD = """
import ctypes, threading, time
started = threading.Event()

def run():
    ctypes.CDLL(None).prctl(15, b"cuda-EvtHandlr", 0, 0, 0)  # PR_SET_NAME: the thread's comm
    started.set()
    time.sleep(60)

threading.Thread(target=run, daemon=True).start()
started.wait()
"""


@pytest.mark.slow
def test_the_probe_names_the_module_that_started_the_thread(tmp_path):
    (tmp_path / "probe_inner.py").write_text(STARTS_A_DRIVER_LIKE_THREAD)
    (tmp_path / "probe_outer.py").write_text("import json\nimport probe_inner\n")
    (tmp_path / "probe_quiet.py").write_text("import json\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench/preload_probe.py"), "probe_outer", "probe_quiet"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["target"], r["env"]) for r in rows] == [
        ("probe_outer", {}),
        ("probe_outer", {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}),
        ("probe_quiet", {}),
        ("probe_quiet", {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}),
    ]
    for r in rows[:2]:
        assert not r["cuda_before"] and r["cuda_after"] and r["driver_threads"] == ["cuda-EvtHandlr"]
        assert r["first_module_with_cuda_up"] == "probe_inner" and r["import_s"] >= 0
    for r in rows[2:]:
        assert not r["cuda_after"] and r["first_module_with_cuda_up"] is None
