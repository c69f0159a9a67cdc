# Helpers shared by every rule: config validation, device resolution, grid expansion, code hashes.
import hashlib
import itertools
import os
from pathlib import Path

from snakemake.utils import validate as snakemake_validate

import lmperf.attention
import lmperf.config
import lmperf.model

# 1. Validate before any job runs: a bad value fails here, naming its key.
#    (`--config report_only=true` arrives as a string.)
if isinstance(config.get("report_only"), str):
    config["report_only"] = config["report_only"].lower() in ("true", "1", "yes")
lmperf.config.validate(config)
snakemake_validate(config, "../schemas/config.schema.yaml")


# 2. The device: the slug names results/<device>/ and picks the grid.
def _resolve_device(setting):
    if setting != "auto":
        return setting
    # `auto` is resolved once, by the Snakemake process the user started: cluster jobs re-read
    # this file on their compute node and inherit that answer through the environment (sbatch
    # --export=ALL). On a cluster, name the device: the submitting node usually has no GPU.
    resolved = os.environ.get("LMPERF_AUTO_DEVICE")
    if resolved is None:
        import lmperf.device

        resolved = lmperf.device.device_slug()
        os.environ.update(LMPERF_AUTO_DEVICE=resolved)
    return resolved


DEVICE = _resolve_device(config["device"])
GRID = config["grids"]["cpu" if DEVICE == "cpu" else "gpu"]
# Cells of a GPU grid each hold one GPU (a `gpu` resource: `--resources gpu=K` runs K at once;
# on SLURM, --gpus=1); CPU-grid cells hold none. LMPERF_GPUS_PER_CELL=1 makes CPU cells ask for
# one too: only for testing a scheduler's GPU handling on a CPU machine (tests/test_slurm.py).
GPUS_PER_CELL = int(os.environ.get("LMPERF_GPUS_PER_CELL", 0 if DEVICE == "cpu" else 1))
# CPU threads a cell holds (Snakemake sets OMP_NUM_THREADS to it; SLURM: --cpus-per-task): a GPU
# cell's Python thread launches kernels and a second serves torch.compile and host-side work;
# CPU-grid cells take one each, so `--cores 2` runs two at once.
THREADS_PER_CELL = 1 if DEVICE == "cpu" else 2
# Each device's own report; the front page (report/answers.md: this device's answers, then Across
# devices) is written by GPU runs only, so a CPU run leaves the committed one alone.
REPORT_PATH = f"report/{DEVICE}/answers.md"
FRONT_PATH = "report/answers.md" if DEVICE != "cpu" else None
# Markdown fragments that report/answers.md is assembled from; each rules file adds its own.
SECTION_FILES = []


# `--config report_only=true` builds tables, figures and the report from the records that are
# present (committed GPU records on a machine without that GPU) and runs no cell; the report
# lists the cells of the grid that have no record yet.
REPORT_ONLY = bool(config.get("report_only", False))


def measured(paths):
    """Records that aggregates read: every record of the grid (missing ones run first), or in
    report-only mode just those present."""
    return [p for p in paths if Path(p).exists()] if REPORT_ONLY else list(paths)


def grid_records():
    """Every record the grid asks for, all kinds."""
    return (e2e_records() + nsys_records() + memory_records() + precision_records() + attention_records()
            + flash_records() + ladder_records())


def missing_records():
    """Cells of the grid without a record (only in report-only mode; otherwise they run first)."""
    return [p for p in grid_records() if not Path(p).exists()] if REPORT_ONLY else []


# 3. Code versions: a cell's params carry the hash of the code it runs, so editing one kind of
#    measurement reruns only its cells (Snakemake's params rerun trigger).
SRC = Path(workflow.basedir) / "src" / "lmperf"
CELL_CODE_COMMON = ["record.py", "device.py", "peaks.py", "timing.py", "cells/common.py"]


def code_version(*relative_paths):
    digest = hashlib.sha256()
    for rel in sorted(relative_paths):
        digest.update(rel.encode())
        digest.update((SRC / rel).read_bytes())
    return digest.hexdigest()[:16]


def cells(pattern, grid, **extra):
    """Expand a grid dict (models, context_lengths, precisions, …) into record paths."""
    return sorted(
        set(
            pattern.format(device=DEVICE, model=m, ctx=c, precision=p, **dict(zip(extra, combo)))
            for m, c, p in itertools.product(grid["models"], grid["context_lengths"], grid["precisions"])
            for combo in itertools.product(*extra.values())
        )
    )


# 4. Each kind's grid expanded into its record paths (one section per kind).

# -- e2e
E2E = GRID["e2e"]
E2E_RECORD = "results/{device}/e2e/{model}_ctx{ctx}_{precision}_{compile}_w{warmup}.json"


# the whole model with another attention implementation (plain's cells keep the name above)
E2E_ATTENTION_RECORD = "results/{device}/e2e/{model}_ctx{ctx}_{precision}_{compile}_w{warmup}_{attention}.json"


def e2e_attention_records():
    """The attention_compare cells: plain's are ordinary e2e records, the others carry the name."""
    if "attention_compare" not in E2E:
        return []
    grid = E2E["attention_compare"]
    w = E2E["warmup_steps"]
    paths = []
    for name in grid["attentions"]:
        pattern = E2E_RECORD if name == "plain" else E2E_ATTENTION_RECORD
        paths += cells(pattern, grid, compile=["eager"], warmup=[w], attention=[name])
    return sorted(set(paths))


def e2e_records():
    w = E2E["warmup_steps"]
    paths = cells(E2E_RECORD, E2E["main"], compile=["eager"], warmup=[w]) + e2e_attention_records()
    if "compile" in E2E:
        paths += cells(E2E_RECORD, E2E["compile"], compile=["eager", "compiled"], warmup=[w])
    if "warmup_sweep" in E2E:
        sweep = E2E["warmup_sweep"]
        paths += cells(E2E_RECORD, sweep, compile=["eager"], warmup=sorted(set(sweep["warmup_steps"]) | {w}))
    return sorted(set(paths))


# -- attention
ATTENTION = GRID.get("attention")
ATTENTION_RECORD = "results/{device}/attention/{impl}_{precision}_d{d}_n{n}.json"


def attention_outputs(device="{device}", impl="{impl}", precision="{precision}"):
    """One implementation's records (one job writes them all); wildcards left as patterns by default."""
    return [
        ATTENTION_RECORD.format(device=device, impl=impl, precision=precision, d=d, n=n)
        for d in ATTENTION["head_dims"]
        for n in sorted(ATTENTION["sequence_lengths"])
    ]


def attention_records():
    if not ATTENTION:
        return []
    precision = ATTENTION.get("precision", "fp32")
    return sorted(
        path for impl in ATTENTION["implementations"] for path in attention_outputs(DEVICE, impl, precision)
    )


def attention_code(impl):
    """Code hash of what an attention job runs: flash's kernels only for flash implementations."""
    files = ["cells/attention.py", "attention.py", "attention_memory.py", "nvtx.py", "flops.py", *CELL_CODE_COMMON]
    if "flash" in impl:
        files += sorted(str(p.relative_to(SRC)) for p in (SRC / "flash").glob("*.py"))
    return code_version(*files)


# -- nsys
NSYS = GRID.get("nsys")
NSYS_RECORD = "results/{device}/nsys/{model}_ctx{ctx}_{precision}_{mode}.json"
NSYS_MODES = ["inference", "training"]


def nsys_outputs(device="{device}", model="{model}", precision="{precision}"):
    """One (model, precision) job's records: every context length × mode (one nsys process)."""
    return [
        NSYS_RECORD.format(device=device, model=model, precision=precision, ctx=c, mode=m)
        for c in sorted(NSYS["context_lengths"])
        for m in NSYS_MODES
    ]


def nsys_jobs():
    """(model, precision) pairs of the nsys grids (main: fp32 every size; tensor_cores: bf16)."""
    if not NSYS:
        return []
    grids = [NSYS["main"]] + ([NSYS["tensor_cores"]] if "tensor_cores" in NSYS else [])
    return sorted({(m, p) for g in grids for m in g["models"] for p in g["precisions"]})


def nsys_records():
    return sorted(path for m, p in nsys_jobs() for path in nsys_outputs(DEVICE, m, p))


def nsys_e2e_records():
    """The e2e records of the same fp32 cells (the forward-time cross-check), where the e2e grid has them."""
    if not NSYS or not E2E:
        return []
    wanted = {
        E2E_RECORD.format(device=DEVICE, model=m, ctx=c, precision="fp32", compile="eager", warmup=E2E["warmup_steps"])
        for m, p in nsys_jobs()
        if p == "fp32"
        for c in NSYS["context_lengths"]
    }
    return sorted(wanted & set(e2e_records()))


# -- memory
MEMORY = GRID.get("memory")
MEMORY_RECORD = "results/{device}/memory/{model}_ctx{ctx}_{precision}_{mode}.json"
MEMORY_MODES = ["inference", "training"]


def memory_records():
    """Every (model, context, precision) job writes both modes' records."""
    if not MEMORY:
        return []
    return sorted(path for mode in MEMORY_MODES for path in cells(MEMORY_RECORD, MEMORY, mode=[mode]))


# -- precision
PRECISION = GRID.get("precision")
PRECISION_PROBES = ["accumulation", "toy_model", "layer_norm"]
PRECISION_RECORD = "results/{device}/precision/{probe}.json"


def precision_records():
    if PRECISION is None:
        return []
    return [PRECISION_RECORD.format(device=DEVICE, probe=probe) for probe in PRECISION_PROBES]


# -- flash
FLASH = GRID.get("flash")
FLASH_CORRECTNESS_RECORD = "results/{device}/flash/correctness_{impl}.json"
FLASH_BENCH_RECORD = "results/{device}/flash/bench_{impl}_{precision}_d{d}_n{n}.json"
FLASH_LEADERBOARD_RECORD = "results/{device}/flash/leaderboard.json"


def flash_correctness_records():
    if not FLASH or "correctness" not in FLASH:
        return []
    return [FLASH_CORRECTNESS_RECORD.format(device=DEVICE, impl=i) for i in FLASH["correctness"]["implementations"]]


def flash_bench_outputs(device="{device}", precision="{precision}"):
    """One precision's records (one job writes them all): implementation × head dim × length."""
    bench = FLASH["benchmarking"]
    return [
        FLASH_BENCH_RECORD.format(device=device, impl=impl, precision=precision, d=d, n=n)
        for impl in bench["implementations"]
        for d in bench["head_dims"]
        for n in sorted(bench["sequence_lengths"])
    ]


def flash_bench_records():
    if not FLASH or "benchmarking" not in FLASH:
        return []
    return sorted(p for precision in FLASH["benchmarking"]["precisions"] for p in flash_bench_outputs(DEVICE, precision))


def flash_leaderboard_records():
    return [FLASH_LEADERBOARD_RECORD.format(device=DEVICE)] if FLASH and "leaderboard" in FLASH else []


def flash_records():
    return flash_correctness_records() + flash_bench_records() + flash_leaderboard_records()


def flash_code():
    """Code hash of the flash cells: the cells, the harness, every module and tuned table of lmperf.flash, the FLOP counts."""
    files = sorted(str(p.relative_to(SRC)) for p in (SRC / "flash").glob("*.py"))
    files += sorted(str(p.relative_to(SRC)) for p in (SRC / "flash" / "tuned").glob("*.json"))
    cells = sorted(str(p.relative_to(SRC)) for p in (SRC / "cells").glob("flash_*.py"))
    return code_version(*cells, "benchmarks/flash.py", "flops.py", *files, *CELL_CODE_COMMON)
