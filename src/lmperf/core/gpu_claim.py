"""One GPU per cell on a host with several: ``claim_gpu`` (first thing in ``device.check_device``).

A ``CUDA_VISIBLE_DEVICES`` set by a scheduler (SLURM, PBS, LSF) or naming one GPU is kept. Else the cell
takes the first free GPU (of a listing ``CUDA_VISIBLE_DEVICES``, ``LMPERF_GPUS``, ``LMPERF_NUM_GPUS``
or ``nvidia-smi -L``) by a non-blocking ``flock`` held for the life of the process, in a private lock
directory (``LMPERF_GPU_LOCK_DIR``); all taken, it waits, saying so, up to ``LMPERF_GPU_WAIT_S``.
``python -m lmperf.core.gpu_claim`` claims, prints the GPU and holds it until stdin closes.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import re
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

ENV_CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"
ENV_GPUS = "LMPERF_GPUS"
ENV_NUM_GPUS = "LMPERF_NUM_GPUS"
ENV_LOCK_DIR = "LMPERF_GPU_LOCK_DIR"
ENV_WAIT_S = "LMPERF_GPU_WAIT_S"
# GPUs a CPU-grid cell holds (0 unless set: tests simulate GPU scheduling with it; common.smk reads it too)
ENV_GPUS_PER_CELL = "LMPERF_GPUS_PER_CELL"
REPORT_EVERY_S = 60.0
POLL_S = 0.5
# a job of one of these schedulers got its CUDA_VISIBLE_DEVICES from the scheduler
SCHEDULER_JOB_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")


class GpuBusy(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class Claim:
    visible: str  # the CUDA_VISIBLE_DEVICES value this process uses
    source: str  # "environment" (set before the cell started) or "lock" (claimed here)
    lock_path: str | None = None


_claim: Claim | None = None
_held_fds: list[int] = []  # kept open for the life of the process: closing one frees its GPU


def parse_nvidia_smi_list(text: str) -> list[str]:
    """GPU indices from ``nvidia-smi -L`` output; none where a GPU is split into MIG instances
    (chosen by UUID: such a host is left to CUDA, or to a CUDA_VISIBLE_DEVICES set by hand)."""
    if re.search(r"^\s+MIG ", text, flags=re.MULTILINE):
        return []
    return [m.group(1) for m in re.finditer(r"^GPU (\d+):", text, flags=re.MULTILINE)]


def _nvidia_smi_indices() -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        out = None
    if out is not None and out.returncode == 0:
        return parse_nvidia_smi_list(out.stdout)
    # no nvidia-smi: the driver lists one directory per GPU
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def candidate_gpus(environ=os.environ) -> list[str]:
    listed = [part.strip() for part in environ.get(ENV_GPUS, "").split(",") if part.strip()]
    count = environ.get(ENV_NUM_GPUS, "").strip()
    if not all(i.isdigit() for i in listed) or (count and not listed and not count.isdigit()):
        name = ENV_GPUS if listed else ENV_NUM_GPUS
        raise ValueError(f"{name}={environ[name]!r}: GPU indices and counts are non-negative integers")
    if listed:
        return listed
    return [str(i) for i in range(int(count))] if count else _nvidia_smi_indices()


def default_lock_dir(environ=os.environ) -> Path:
    if environ.get(ENV_LOCK_DIR):
        return Path(environ[ENV_LOCK_DIR])
    if environ.get("XDG_RUNTIME_DIR"):
        return Path(environ["XDG_RUNTIME_DIR"]) / "lmperf-gpu-locks"
    return Path.home() / ".cache" / "lmperf" / "gpu-locks"


def open_lock_dir(lock_dir: Path) -> int:
    """A descriptor of the lock directory (created 0700); PermissionError where it is a symlink, not a
    directory, not this user's, or open to others."""
    lock_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(lock_dir, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(lock_dir)
    problem = None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        problem = "is a symlink or not a directory"
    elif info.st_uid != os.geteuid():
        problem = f"belongs to uid {info.st_uid}, not to this user ({os.geteuid()})"
    elif stat.S_IMODE(info.st_mode) & 0o077:
        problem = f"has mode {stat.S_IMODE(info.st_mode):o}, open to group or others"
    if problem is None:
        fd = os.open(lock_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        if (os.fstat(fd).st_ino, os.fstat(fd).st_dev) == (info.st_ino, info.st_dev):
            return fd
        os.close(fd)
        problem = "changed while it was checked"
    raise PermissionError(
        f"GPU lock directory {lock_dir} {problem}: refusing it (make it a private directory of yours,"
        f" mode 0700, or set {ENV_LOCK_DIR} to one)"
    )


def _open_lock(lock_dir: Path, index: str) -> int:
    directory = open_lock_dir(lock_dir)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:  # O_NOFOLLOW: a symlink in place of a lock file is refused, never written through
        return os.open(lock_path(lock_dir, index).name, flags, 0o600, dir_fd=directory)
    finally:
        os.close(directory)


def lock_path(lock_dir: Path, gpu: str) -> Path:
    """The lock file of a GPU (an index, or a UUID as CUDA_VISIBLE_DEVICES may name it)."""
    return lock_dir / f"gpu{re.sub(r'[^A-Za-z0-9_.-]', '_', gpu)}.lock"


def _holder(lock_dir: Path, index: str) -> str:
    try:
        return lock_path(lock_dir, index).read_text().strip() or "unknown holder"
    except OSError:
        return "unknown holder"


def try_lock(lock_dir: Path, indices: Sequence[str]) -> tuple[str, int] | None:
    """Lock the first free index: (index, open fd holding its lock), or None when all are taken."""
    for index in indices:
        fd = _open_lock(lock_dir, index)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                continue
            raise
        # who holds it, for the messages of cells that wait
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}\n".encode(), 0)
        return index, fd
    return None


def acquire(
    lock_dir: Path,
    indices: Sequence[str],
    wait_s: float | None,
    log: TextIO = sys.stderr,
    report_every_s: float = REPORT_EVERY_S,
    poll_s: float = POLL_S,
) -> tuple[str, int]:
    """Lock a free GPU index, waiting (None: without limit) while every one is taken."""
    start = time.monotonic()
    next_report = start
    while True:
        got = try_lock(lock_dir, indices)
        if got is not None:
            if next_report > start:  # we waited and said so: say when it ended
                print(f"lmperf: claimed GPU {got[0]} after {time.monotonic() - start:.0f} s", file=log, flush=True)
            return got
        now = time.monotonic()
        holders = "; ".join(f"GPU {i}: {_holder(lock_dir, i)}" for i in indices)
        if wait_s is not None and now - start >= wait_s:
            raise GpuBusy(
                f"all {len(indices)} GPUs are claimed by other lmperf cells ({holders}; locks in"
                f" {lock_dir}) and none was freed within {ENV_WAIT_S}={wait_s:g} s. Run fewer cells"
                " at once (snakemake --resources gpu=K with K at most the number of GPUs) or wait"
                " for the other run to finish."
            )
        if now >= next_report:
            limit = "without limit" if wait_s is None else f"up to {wait_s:g} s"
            print(f"lmperf: waiting for a free GPU ({limit}): {holders}", file=log, flush=True)
            next_report = now + report_every_s
        time.sleep(poll_s)


def _wait_limit(environ=os.environ) -> float | None:
    value = environ.get(ENV_WAIT_S, "").strip()
    if value and not value.replace(".", "", 1).isdigit():
        raise ValueError(f"{ENV_WAIT_S}={value!r}: must be a number of seconds >= 0")
    return float(value) if value else None


def claim_gpu(log: TextIO = sys.stderr) -> Claim | None:
    """This process's GPU claim (the same one on later calls); None where the host has no GPU."""
    global _claim
    if _claim is not None:
        return _claim
    visible = os.environ.get(ENV_CUDA_VISIBLE)
    listed = [d.strip() for d in (visible or "").split(",") if d.strip()]
    if visible is not None and (len(listed) <= 1 or any(v in os.environ for v in SCHEDULER_JOB_VARS)):
        _claim = Claim(visible=visible, source="environment")
        return _claim
    indices = listed or candidate_gpus()
    if not indices:
        return None
    lock_dir = default_lock_dir()
    index, fd = acquire(lock_dir, indices, _wait_limit(), log=log)
    _held_fds.append(fd)
    os.environ[ENV_CUDA_VISIBLE] = index
    _claim = Claim(visible=index, source="lock", lock_path=str(lock_path(lock_dir, index)))
    return _claim


if __name__ == "__main__":  # python -m lmperf.core.gpu_claim: claim, print, hold until stdin closes
    claim = claim_gpu()
    print(claim.visible if claim else "none", flush=True)
    sys.stdin.read()
