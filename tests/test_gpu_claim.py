"""GPU claiming on one host (lmperf.core.gpu_claim), on a CPU with a simulated GPU count.

Each claimant is a real process (``python -m lmperf.core.gpu_claim`` claims, prints the
CUDA_VISIBLE_DEVICES it got, and holds the claim until its stdin closes), so the locks are the
kernel's, released on exit or kill exactly as a cell's would be.
"""

from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from lmperf.core import gpu_claim

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="flock-based claims are tested on Linux")


def _env(lock_dir, **extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CUDA_VISIBLE_DEVICES", "LMPERF_GPUS", "LMPERF_NUM_GPUS", "LMPERF_GPU_WAIT_S", "SLURM_JOB_ID")
    }
    env["LMPERF_GPU_LOCK_DIR"] = str(lock_dir)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _start(env):
    """A claimant process; returns (process, the CUDA_VISIBLE_DEVICES it claimed)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmperf.core.gpu_claim"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc


def _claimed(proc, timeout=30):
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"claimant printed nothing within {timeout} s"
    line = proc.stdout.readline().strip()
    assert line, f"claimant printed nothing; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
    return line


def _finish(proc):
    if proc.poll() is None:
        proc.stdin.close()
        proc.wait(timeout=30)
    return proc.stderr.read()


def test_concurrent_processes_get_distinct_gpus(tmp_path):
    env = _env(tmp_path / "locks", LMPERF_NUM_GPUS=3)
    procs = [_start(env) for _ in range(3)]
    try:
        claimed = [_claimed(p) for p in procs]  # all three hold their claims at this point
    finally:
        for p in procs:
            _finish(p)
    assert sorted(claimed) == ["0", "1", "2"]


def test_a_killed_process_releases_its_gpu(tmp_path):
    env = _env(tmp_path / "locks", LMPERF_NUM_GPUS=1, LMPERF_GPU_WAIT_S=0)
    holder = _start(env)
    assert _claimed(holder) == "0"
    # while it holds the only GPU, a cell that may not wait fails, naming the holder's pid
    busy = subprocess.run(
        [sys.executable, "-m", "lmperf.core.gpu_claim"], env=env, input="", capture_output=True, text=True, timeout=60
    )
    assert busy.returncode != 0
    assert "GpuBusy" in busy.stderr and f"pid {holder.pid}" in busy.stderr
    holder.send_signal(signal.SIGKILL)  # no clean-up code runs: the kernel drops the lock
    holder.wait(timeout=30)
    _finish(holder)
    after = _start(env)
    try:
        assert _claimed(after) == "0"
    finally:
        _finish(after)


def test_set_cuda_visible_devices_is_respected(tmp_path):
    env = _env(tmp_path / "locks", LMPERF_NUM_GPUS=2)
    scheduled = subprocess.run(
        [sys.executable, "-m", "lmperf.core.gpu_claim"],
        env={**env, "CUDA_VISIBLE_DEVICES": "1", "SLURM_JOB_ID": "42"},
        input="",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert scheduled.returncode == 0, scheduled.stderr
    assert scheduled.stdout.strip() == "1"
    # it took no lock: two unscheduled cells still get both GPUs
    procs = [_start(env) for _ in range(2)]
    try:
        assert sorted(_claimed(p) for p in procs) == ["0", "1"]
    finally:
        for p in procs:
            _finish(p)


def test_several_visible_gpus_outside_a_scheduler_are_shared_out(tmp_path):
    """CUDA_VISIBLE_DEVICES=2,3 set by hand: the GPUs this run may use, one cell on each."""
    env = {**_env(tmp_path / "locks", LMPERF_NUM_GPUS=8), "CUDA_VISIBLE_DEVICES": "2,3"}
    procs = [_start(env) for _ in range(2)]
    try:
        assert sorted(_claimed(p) for p in procs) == ["2", "3"]
    finally:
        for p in procs:
            _finish(p)
    # inside a scheduler's job the same list is the job's own: kept whole
    scheduled = subprocess.run(
        [sys.executable, "-m", "lmperf.core.gpu_claim"],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "SLURM_JOB_ID": "7"},
    )
    assert scheduled.stdout.strip() == "2,3"


def test_all_busy_waits_with_progress_then_claims(tmp_path):
    env = _env(tmp_path / "locks", LMPERF_GPUS="3,5")
    holders = [_start(env) for _ in range(2)]
    assert sorted(_claimed(p) for p in holders) == ["3", "5"]
    waiter = _start(env)
    try:
        # the waiter says at once that it waits, naming who holds what
        line = waiter.stderr.readline()
        assert "waiting for a free GPU" in line and "GPU 3: pid" in line and "GPU 5: pid" in line
        freed = holders[1]
        # which index the second holder has is not fixed: its lock file says
        lock_texts = {i: (tmp_path / "locks" / f"gpu{i}.lock").read_text() for i in ("3", "5")}
        freed_index = next(i for i, text in lock_texts.items() if f"pid {freed.pid} " in text)
        _finish(freed)
        assert _claimed(waiter) == freed_index
        assert "claimed GPU" in waiter.stderr.readline()
    finally:
        for p in [*holders, waiter]:
            _finish(p)


def test_acquire_gives_up_after_the_wait_limit(tmp_path):
    lock_dir = tmp_path / "locks"
    got = gpu_claim.try_lock(lock_dir, ["0"])
    assert got is not None
    index, fd = got
    try:
        log = io.StringIO()
        start = time.monotonic()
        with pytest.raises(gpu_claim.GpuBusy, match=rf"pid {os.getpid()} .*within LMPERF_GPU_WAIT_S=0.3 s"):
            gpu_claim.acquire(lock_dir, ["0"], wait_s=0.3, log=log, report_every_s=0.1, poll_s=0.05)
        assert 0.3 <= time.monotonic() - start < 5
        assert log.getvalue().count("waiting for a free GPU") >= 2  # said at once, then repeated
    finally:
        os.close(fd)
    # closing the descriptor is what frees it
    again = gpu_claim.try_lock(lock_dir, ["0"])
    assert again is not None
    os.close(again[1])


def test_check_device_claims_before_cuda_and_still_refuses_a_missing_gpu(tmp_path):
    """On this CPU machine a GPU cell claims a (simulated) GPU first, then fails: never silently."""
    code = textwrap.dedent("""
        import os, torch
        from lmperf.core import device
        assert device.check_device("cpu") == torch.device("cpu")
        assert "CUDA_VISIBLE_DEVICES" not in os.environ      # CPU cells claim nothing
        try:
            device.check_device("h100")
        except device.DeviceMismatch as exc:
            print("mismatch", os.environ["CUDA_VISIBLE_DEVICES"], exc)
    """)
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the test is about a machine without one")
    env = _env(tmp_path / "locks", LMPERF_NUM_GPUS=2)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("mismatch 0 this job writes under results/h100/"), out.stdout


def test_candidates_from_environment_and_nvidia_smi():
    assert gpu_claim.candidate_gpus({"LMPERF_GPUS": "2, 3"}) == ["2", "3"]
    assert gpu_claim.candidate_gpus({"LMPERF_NUM_GPUS": "2", "LMPERF_GPUS": ""}) == ["0", "1"]
    with pytest.raises(ValueError, match="LMPERF_GPUS"):
        gpu_claim.candidate_gpus({"LMPERF_GPUS": "0,gpu1"})
    with pytest.raises(ValueError, match="LMPERF_NUM_GPUS"):
        gpu_claim.candidate_gpus({"LMPERF_NUM_GPUS": "two"})
    smi = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1b2c)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-3d4e)\n"
    assert gpu_claim.parse_nvidia_smi_list(smi) == ["0", "1"]
    assert gpu_claim.parse_nvidia_smi_list("") == []
    # MIG instances are not chosen by GPU index: claim nothing there
    assert gpu_claim.parse_nvidia_smi_list(smi + "  MIG 1g.10gb     Device  0: (UUID: MIG-5f6a)\n") == []
