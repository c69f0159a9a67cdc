"""Which accelerator a cell runs on: its slug, its provenance, and its peak rates.

The slug names the directory a record lands in (``results/<slug>/…``); a cell refuses to write
under a slug that is not the device it runs on (``check_device``).
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

# The peak table lives in the pure layer (reports read it without torch); re-exported here.
from lmperf.core.peaks import PEAKS  # noqa: F401

_KNOWN_GPUS = [("H100", "h100"), ("H200", "h200"), ("A100", "a100"), ("A10", "a10"), ("4090", "rtx4090")]


def slug_from_name(device_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; unknown names become a lowercase token."""
    for marker, slug in _KNOWN_GPUS:
        if re.search(rf"\b{marker}", device_name):
            return slug
    token = re.sub(r"[^a-z0-9]+", "-", device_name.lower().replace("nvidia", "")).strip("-")
    return token or "gpu"


def device_slug() -> str:
    """Slug of the accelerator this process would use: a GPU's, or 'cpu'."""
    if torch.cuda.is_available():
        return slug_from_name(torch.cuda.get_device_name(0))
    return "cpu"


class DeviceMismatch(RuntimeError):
    pass


def check_device(expected_slug: str) -> torch.device:
    """The torch device for ``expected_slug``; raises if this machine is not that device."""
    from lmperf.core import gpu_claim

    if expected_slug == "cpu":
        # CPU cells hold no GPU, unless LMPERF_GPUS_PER_CELL asks them to (tests, with simulated
        # GPUs: LMPERF_NUM_GPUS): then they claim one like GPU cells, so one-GPU-per-cell
        # scheduling can be checked on a machine without GPUs (see GPUS_PER_CELL in common.smk).
        if int(os.environ.get(gpu_claim.ENV_GPUS_PER_CELL) or 0) > 0:
            gpu_claim.claim_gpu()
        return torch.device("cpu")
    # One GPU per cell where several cells share a host: before any torch.cuda call (see gpu_claim).
    gpu_claim.claim_gpu()
    actual = device_slug()
    if actual != expected_slug:
        raise DeviceMismatch(
            f"this job writes under results/{expected_slug}/ but runs on {actual!r}"
            f" ({torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device'});"
            " run it on that device or set config device: to this machine's slug"
        )
    return torch.device("cuda")


def peak_tflops(slug: str, precision: str) -> float | None:
    """Dense peak TFLOP/s for a cell's precision on a device, or None where unknown (CPU).

    fp32 counts as TF32 when PyTorch lets matmuls use TF32.
    """
    peaks = PEAKS.get(slug)
    if peaks is None:
        return None
    if precision == "fp32" and torch.backends.cuda.matmul.allow_tf32:
        precision = "tf32"
    return peaks.get(precision)


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10, cwd=Path(__file__).resolve().parent
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict:
    """Commit and dirtiness of the code that runs.

    ``LMPERF_GIT_COMMIT`` (and ``LMPERF_GIT_DIRTY``: 0 or 1) name them where the checkout's own
    .git does not tell the truth or is absent, e.g. a copy of the working tree sent to a GPU
    machine; otherwise ``git`` is asked.
    """
    if os.environ.get("LMPERF_GIT_COMMIT"):
        return {
            "git_commit": os.environ["LMPERF_GIT_COMMIT"],
            "git_dirty": os.environ.get("LMPERF_GIT_DIRTY", "unknown") not in ("0", "false", "False"),
        }
    return dict(_checkout_git_state())


@functools.cache
def _checkout_git_state() -> dict:
    """git's answer, asked once per process (its first record): the code a cell runs is what it
    loaded then, and two git calls per record cost 20-50 ms each."""
    commit = _git("rev-parse", "HEAD")
    if commit is not None:
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
        return {"git_commit": commit, "git_dirty": dirty}
    return {"git_commit": "unknown", "git_dirty": True}


@functools.cache
def _driver_version() -> str | None:
    """The NVIDIA driver's version, from nvidia-smi once per process (a call per record cost about
    20 ms each)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


_HOST: dict = {}  # this process's start reading (host_facts)


def host_facts(slug: str | None = None) -> dict:
    """The host's state in a record's provenance (``host``): CPU model, logical cores, the 1-minute
    load average at the cell's start and, on CUDA, the GPU's SM and memory clocks (MHz),
    temperature (C) and power (W) from nvidia-smi, never from CUDA.

    Called without a slug (at this module's import, and again in each cell the warm parent forks:
    it imported this module long before) it takes the start reading: the load, and nvidia-smi
    started in the background. With the slug (``provenance``, when a record is written) it returns
    the facts: ``gpu_state_start`` from that reading, ``gpu_state_end`` read then (at most one
    query per 10 s: one process may write many records).
    """

    def query():
        command = ["nvidia-smi", "--query-gpu=index,uuid,clocks.sm,clocks.mem,temperature.gpu,power.draw"]
        if not shutil.which("nvidia-smi"):
            return None
        return subprocess.Popen(
            [*command, "--format=csv,noheader,nounits"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )

    def reading(process):
        try:
            rows = [[v.strip() for v in line.split(",")] for line in process.communicate(timeout=20)[0].splitlines()]
        except (AttributeError, OSError, subprocess.SubprocessError, ValueError):
            return None
        visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
        row = next((r for r in rows if visible and visible in r[:2]), rows[0] if rows else None)
        number = lambda v: float(v) if v.replace(".", "", 1).isdigit() else None  # noqa: E731 - "[N/A]" -> None
        names = ("sm_clock_mhz", "memory_clock_mhz", "temperature_c", "power_w")
        return None if row is None or len(row) < 6 else dict(zip(names, map(number, row[2:6])))

    if slug is None:
        _HOST.clear()
        _HOST.update(load=os.getloadavg()[0], gpu=query(), end=(float("-inf"), None))
        return {}
    cuda = slug != "cpu"
    if cuda and not isinstance(_HOST.get("gpu"), (dict, type(None))):
        _HOST["gpu"] = reading(_HOST["gpu"])
    if cuda and time.monotonic() - _HOST["end"][0] > 10:
        _HOST["end"] = (time.monotonic(), reading(query()))
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu_model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu_model = platform.processor() or platform.machine()
    return {
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "load_avg_1min": _HOST["load"],
        "gpu_state_start": _HOST["gpu"] if cuda else None,
        "gpu_state_end": _HOST["end"][1] if cuda else None,
    }


host_facts()
# a cell the warm parent forks (lmperf.core.warm; its argv is still the parent's) takes its own
os.register_at_fork(
    after_in_child=lambda: (
        getattr(getattr(sys.modules["__main__"], "__spec__", None), "name", "") == "lmperf.core.warm"
        and sys.argv[0] == sys.modules["__main__"].__file__
        and host_facts()
    )
)


def provenance(slug: str, settings: dict, cell: str) -> dict:
    """Everything needed to say where and how a record was made; ``cell`` names the cell
    (lmperf.kinds.CELLS) whose code's fingerprint the record keeps."""
    from lmperf.core.fingerprint import fingerprint
    from lmperf.kinds import CELLS

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cuda = torch.cuda.is_available() and slug != "cpu"
    return {
        "device_slug": slug,
        "device_name": torch.cuda.get_device_name(0) if cuda else platform.processor() or platform.machine(),
        "cuda_version": torch.version.cuda,
        "driver_version": _driver_version() if cuda else None,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "torch_version": torch.__version__,
        "triton_version": triton_version,
        "python_version": platform.python_version(),
        "hostname": socket.gethostname(),
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "start_time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": host_facts(slug),
        **git_state(),
        **process_clock(),
        # the code this cell ran with these settings (lmperf.core.fingerprint)
        "code_version": fingerprint(CELLS[cell], settings),
        "settings": settings,
    }


def process_age_s() -> float:
    """Seconds since this process started (from /proc where available, else since import).

    A cell forked by the fork server counts from its client's start (``LMPERF_PROCESS_START``,
    ``<pid>:<epoch seconds>``, honoured only in that pid), so start-up means the same either way.
    """
    started = os.environ.get("LMPERF_PROCESS_START", "")
    pid, _, epoch = started.partition(":")
    if pid == str(os.getpid()) and epoch:
        return time.time() - float(epoch)
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        return uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORT_TIME


_IMPORT_TIME = time.monotonic()


def process_clock() -> dict:
    """Provenance of a record's wall time: when its cell process started and how long it had run."""
    age = process_age_s()
    start = _dt.datetime.fromtimestamp(time.time() - age, _dt.timezone.utc)
    return {"process_start_time": start.isoformat(timespec="milliseconds"), "process_age_s": round(age, 3)}
