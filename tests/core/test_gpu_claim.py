"""One GPU per cell on a host with several (lmperf.core.gpu_claim), on a CPU with simulated GPUs.

Each claimant is a real process (``python -m lmperf.core.gpu_claim`` claims, prints the
CUDA_VISIBLE_DEVICES it got and holds the claim until its stdin closes), so the locks are the
kernel's, released on exit or kill exactly as a cell's. The lock directory is private to the user.
"""

from __future__ import annotations

import io
import os
import re
import select
import signal
import stat
import subprocess
import sys

import pytest
import torch

from lmperf.core import device, gpu_claim

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="flock-based claims are tested on Linux")
CLAIM = [sys.executable, "-m", "lmperf.core.gpu_claim"]


def env_for(lock_dir, **extra) -> dict:
    drop = ("CUDA_VISIBLE_DEVICES", "LMPERF_GPUS", "LMPERF_NUM_GPUS", "LMPERF_GPU_WAIT_S", "SLURM_JOB_ID")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "LMPERF_GPU_LOCK_DIR": str(lock_dir), **{k: str(v) for k, v in extra.items()}}


def start(env) -> subprocess.Popen:
    pipe = subprocess.PIPE
    return subprocess.Popen(CLAIM, env=env, stdin=pipe, stdout=pipe, stderr=pipe, text=True)


def claimed(proc, timeout_s: float = 30) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"the claimant printed nothing within {timeout_s} s"
    return proc.stdout.readline().strip()


def finish(*procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=30)


def run_once(env) -> subprocess.CompletedProcess:
    return subprocess.run(CLAIM, env=env, input="", capture_output=True, text=True, timeout=60)


def test_concurrent_cells_get_distinct_gpus(tmp_path):
    procs = [start(env_for(tmp_path / "locks", LMPERF_NUM_GPUS=3)) for _ in range(3)]
    try:
        assert sorted(claimed(p) for p in procs) == ["0", "1", "2"]  # all three hold their claims here
    finally:
        finish(*procs)


def test_a_killed_cell_releases_its_gpu_and_a_cell_that_may_not_wait_names_the_holder(tmp_path):
    env = env_for(tmp_path / "locks", LMPERF_NUM_GPUS=1, LMPERF_GPU_WAIT_S=0)
    holder = start(env)
    assert claimed(holder) == "0"
    busy = run_once(env)
    assert busy.returncode != 0 and "GpuBusy" in busy.stderr and f"pid {holder.pid}" in busy.stderr
    holder.send_signal(signal.SIGKILL)  # no clean-up code runs: the kernel drops the lock
    holder.wait(timeout=30)
    after = start(env)
    try:
        assert claimed(after) == "0"
    finally:
        finish(holder, after)


def test_cuda_visible_devices_from_a_scheduler_is_kept_and_a_list_by_hand_is_shared_out(tmp_path):
    env = env_for(tmp_path / "locks", LMPERF_NUM_GPUS=8)
    assert run_once({**env, "CUDA_VISIBLE_DEVICES": "1"}).stdout.strip() == "1"  # one GPU pinned by hand
    assert run_once({**env, "CUDA_VISIBLE_DEVICES": "2,3", "SLURM_JOB_ID": "7"}).stdout.strip() == "2,3"
    procs = [start({**env, "CUDA_VISIBLE_DEVICES": "2,3"}) for _ in range(2)]
    try:  # several listed outside a scheduler: the GPUs this run may use, one cell on each
        assert sorted(claimed(p) for p in procs) == ["2", "3"]
    finally:
        finish(*procs)


def test_when_every_gpu_is_taken_a_cell_waits_saying_so_then_claims_the_one_freed(tmp_path):
    env = env_for(tmp_path / "locks", LMPERF_GPUS="3,5")
    holders = [start(env) for _ in range(2)]
    waiter = None
    try:
        got = {claimed(p): p for p in holders}
        assert sorted(got) == ["3", "5"]
        waiter = start(env)
        line = waiter.stderr.readline()
        assert "waiting for a free GPU" in line and "GPU 3: pid" in line and "GPU 5: pid" in line
        finish(got["5"])
        assert claimed(waiter) == "5" and "claimed GPU 5" in waiter.stderr.readline()
    finally:
        finish(*holders, *([waiter] if waiter else []))


def test_acquire_gives_up_after_the_wait_limit_naming_the_holder(tmp_path):
    lock_dir = tmp_path / "locks"
    index, fd = gpu_claim.try_lock(lock_dir, ["0"])
    try:
        log = io.StringIO()
        with pytest.raises(gpu_claim.GpuBusy, match=rf"pid {os.getpid()} .*within LMPERF_GPU_WAIT_S=0.2 s"):
            gpu_claim.acquire(lock_dir, ["0"], wait_s=0.2, log=log, report_every_s=0.05, poll_s=0.02)
        assert log.getvalue().count("waiting for a free GPU") >= 2  # said at once, then again
    finally:
        os.close(fd)
    index, fd = gpu_claim.try_lock(lock_dir, ["0"])  # closing the descriptor freed it
    os.close(fd)


@pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without a GPU")
def test_a_gpu_cell_claims_before_cuda_and_still_refuses_a_missing_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_claim, "_claim", None)
    monkeypatch.setattr(gpu_claim, "_held_fds", [])
    for name, value in env_for(tmp_path / "locks", LMPERF_NUM_GPUS=2).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("LMPERF_GPUS_PER_CELL", raising=False)
    try:
        assert device.check_device("cpu") == torch.device("cpu")
        assert "CUDA_VISIBLE_DEVICES" not in os.environ  # a CPU cell claims nothing
        with pytest.raises(device.DeviceMismatch, match="this job writes under results/h100/"):
            device.check_device("h100")
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
    finally:
        for fd in gpu_claim._held_fds:
            os.close(fd)


def test_candidate_gpus_from_the_environment_and_nvidia_smi():
    assert gpu_claim.candidate_gpus({"LMPERF_GPUS": "2, 3"}) == ["2", "3"]
    assert gpu_claim.candidate_gpus({"LMPERF_NUM_GPUS": "2", "LMPERF_GPUS": ""}) == ["0", "1"]
    for name, bad in (("LMPERF_GPUS", "0,gpu1"), ("LMPERF_NUM_GPUS", "two")):
        with pytest.raises(ValueError, match=name):
            gpu_claim.candidate_gpus({name: bad})
    smi = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1b2c)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-3d4e)\n"
    assert gpu_claim.parse_nvidia_smi_list(smi) == ["0", "1"] and gpu_claim.parse_nvidia_smi_list("") == []
    # MIG instances are not chosen by GPU index: claim nothing there
    assert gpu_claim.parse_nvidia_smi_list(smi + "  MIG 1g.10gb     Device  0: (UUID: MIG-5f6a)\n") == []


def test_the_lock_directory_is_the_users_own_created_private_and_refused_when_it_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert gpu_claim.default_lock_dir({}) == tmp_path / ".cache" / "lmperf" / "gpu-locks"
    assert str(gpu_claim.default_lock_dir({"XDG_RUNTIME_DIR": "/run/user/7"})) == "/run/user/7/lmperf-gpu-locks"
    assert str(gpu_claim.default_lock_dir({"LMPERF_GPU_LOCK_DIR": "/x", "XDG_RUNTIME_DIR": "/y"})) == "/x"
    lock_dir = tmp_path / "locks"
    os.close(gpu_claim.try_lock(lock_dir, ["0"])[1])
    assert stat.S_IMODE(os.lstat(lock_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(lock_dir / "gpu0.lock").st_mode) == 0o600
    shared, link, theirs = tmp_path / "shared", tmp_path / "link", tmp_path / "theirs"
    shared.mkdir()
    os.chmod(shared, 0o755)
    link.symlink_to(lock_dir)
    refused = {shared: "has mode 755", link: "is a symlink"}
    if os.geteuid() == 0:  # making a directory another user's needs root
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        refused[theirs] = "belongs to uid 65534"
    for directory, why in refused.items():
        with pytest.raises(PermissionError, match=re.escape(f"{directory} {why}")):
            gpu_claim.try_lock(directory, ["0"])
    assert not list(shared.iterdir())
    # a symlink in place of a lock file is not followed: its target stays as it was
    (tmp_path / "victim").write_text("precious\n")
    (lock_dir / "gpu1.lock").symlink_to(tmp_path / "victim")
    with pytest.raises(OSError):
        gpu_claim.try_lock(lock_dir, ["1"])
    assert (tmp_path / "victim").read_text() == "precious\n"
