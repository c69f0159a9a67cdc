# Helpers shared by every rule: config validation, device resolution, grid expansion, code hashes.
import hashlib
import itertools
from pathlib import Path

from snakemake.utils import validate as snakemake_validate

import lmperf.config
import lmperf.model

# 1. Validate before any job runs: a bad value fails here, naming its key.
lmperf.config.validate(config)
snakemake_validate(config, "../schemas/config.schema.yaml")


# 2. The device: the slug names results/<device>/ and picks the grid.
def _resolve_device(setting):
    if setting != "auto":
        return setting
    import lmperf.device

    return lmperf.device.device_slug()


DEVICE = _resolve_device(config["device"])
GRID = config["grids"]["cpu" if DEVICE == "cpu" else "gpu"]
# Cells of a GPU grid each hold one GPU (a `gpu` resource: `--resources gpu=K` runs K at once);
# CPU-grid cells hold none.
GPUS_PER_CELL = 0 if DEVICE == "cpu" else 1
# A CPU run never writes report/answers.md, so the committed GPU report is not overwritten.
REPORT_PATH = "report/answers.md" if DEVICE != "cpu" else "report/answers-cpu.md"
# Markdown fragments that report/answers.md is assembled from; each rules file adds its own.
SECTION_FILES = []


wildcard_constraints:
    device="[a-z0-9][a-z0-9-]*",
    model="|".join(map(lambda name: name.replace(".", r"\."), lmperf.model.SIZES)),
    ctx=r"\d+",
    precision="fp32|bf16",
    compile="eager|compiled",
    warmup=r"\d+",


# 3. Code versions: a cell's params carry the hash of the code it runs, so editing one kind of
#    measurement reruns only its cells (Snakemake's params rerun trigger).
SRC = Path(workflow.basedir) / "src" / "lmperf"
CELL_CODE_COMMON = ["record.py", "device.py", "timing.py", "cells/common.py"]


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


def e2e_records():
    w = E2E["warmup_steps"]
    paths = cells(E2E_RECORD, E2E["main"], compile=["eager"], warmup=[w])
    if "compile" in E2E:
        paths += cells(E2E_RECORD, E2E["compile"], compile=["eager", "compiled"], warmup=[w])
    if "warmup_sweep" in E2E:
        sweep = E2E["warmup_sweep"]
        paths += cells(E2E_RECORD, sweep, compile=["eager"], warmup=sorted(set(sweep["warmup_steps"]) | {w}))
    return sorted(set(paths))
