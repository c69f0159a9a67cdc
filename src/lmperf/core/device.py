"""Which accelerator a cell runs on (its slug names ``results/<slug>/``), and a record's provenance."""

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

from lmperf.core.lifetime import proc_age_s
from lmperf.core.peaks import PEAKS

_KNOWN_GPUS = [("H100", "h100"), ("H200", "h200"), ("A100", "a100"), ("A10", "a10"), ("4090", "rtx4090")]


def slug_from_name(device_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; unknown names become a lowercase token."""
    for marker, slug in _KNOWN_GPUS:
        if re.search(rf"\b{marker}", device_name):
            return slug
    token = re.sub(r"[^a-z0-9]+", "-", device_name.lower().replace("nvidia", "")).strip("-")
    return token or "gpu"


def device_slug() -> str:
    return slug_from_name(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "cpu"


class DeviceMismatch(RuntimeError):
    pass


def check_device(expected_slug: str) -> torch.device:
    """The torch device for ``expected_slug``; raises if this machine is not that device."""
    from lmperf.core import gpu_claim

    # before any torch.cuda call; CPU cells claim a (simulated) GPU only where tests ask them to
    if expected_slug != "cpu" or int(os.environ.get(gpu_claim.ENV_GPUS_PER_CELL) or 0) > 0:
        gpu_claim.claim_gpu()
    if expected_slug == "cpu":
        return torch.device("cpu")
    actual = device_slug()
    if actual != expected_slug:
        raise DeviceMismatch(
            f"this job writes under results/{expected_slug}/ but runs on {actual!r}"
            f" ({torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device'});"
            " run it on that device or set config device: to this machine's slug"
        )
    return torch.device("cuda")


def peak_tflops(slug: str, precision: str) -> float | None:
    """Dense peak TFLOP/s of a precision on a device (fp32 as TF32 where matmuls may use it); None on a CPU."""
    if precision == "fp32" and torch.backends.cuda.matmul.allow_tf32:
        precision = "tf32"
    return PEAKS.get(slug, {}).get(precision)


def _git(*args: str) -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=here)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict:
    """Commit and dirtiness of the code that runs: ``LMPERF_GIT_COMMIT`` / ``LMPERF_GIT_DIRTY`` (0 or 1)
    where the checkout cannot tell (a copy of the tree on a GPU machine), else git's answer."""
    if os.environ.get("LMPERF_GIT_COMMIT"):
        return {
            "git_commit": os.environ["LMPERF_GIT_COMMIT"],
            "git_dirty": os.environ.get("LMPERF_GIT_DIRTY", "unknown") not in ("0", "false", "False"),
        }
    return dict(_checkout_git_state())


@functools.cache
def _checkout_git_state() -> dict:
    """Asked once per process: a cell runs the code it loaded, and each git call costs 20-50 ms."""
    commit = _git("rev-parse", "HEAD")
    if commit is not None:
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
        return {"git_commit": commit, "git_dirty": dirty}
    return {"git_commit": "unknown", "git_dirty": True}


@functools.cache
def _driver_version() -> str | None:
    command = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


_HOST: dict = {}  # this process's start reading (host_facts)


def host_facts(slug: str | None = None) -> dict:
    """The host in a record's provenance: CPU model, cores, the 1-minute load at the cell's start and,
    on CUDA, the GPU's clocks (MHz), temperature (C) and power (W) from nvidia-smi at its start and
    end. Without a slug (at import, and in each forked cell) it takes the start reading; with one, it
    returns the facts, reading the end at most every 10 s."""

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
    """Where and how a record was made; ``cell`` (a name of lmperf.kinds.CELLS) picks its fingerprint."""
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
    """Seconds since this process started (/proc, else since import); a forked cell counts from its
    client's start (``LMPERF_PROCESS_START`` = ``<pid>:<epoch s>``, honoured only in that pid)."""
    started = os.environ.get("LMPERF_PROCESS_START", "")
    pid, _, epoch = started.partition(":")
    if pid == str(os.getpid()) and epoch:
        return time.time() - float(epoch)
    age = proc_age_s()
    return time.monotonic() - _IMPORT_TIME if age is None else age


_IMPORT_TIME = time.monotonic()


def process_clock() -> dict:
    age = process_age_s()
    start = _dt.datetime.fromtimestamp(time.time() - age, _dt.timezone.utc)
    return {"process_start_time": start.isoformat(timespec="milliseconds"), "process_age_s": round(age, 3)}
