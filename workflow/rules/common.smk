# Helpers shared by every rule: config validation, device resolution, grid expansion, code
# versions and staleness, cell flags. No torch here: parsing the workflow stays fast.
import functools
import glob
import hashlib
import itertools
import json
import os
import shlex
from pathlib import Path

import lmperf.core.fingerprint
import lmperf.core.config
import lmperf.core.record
import lmperf.core.run_log
import lmperf.core.sizes


class LmperfInputError(Exception):
    """A bad config or record: the message names the file or key and the fix."""


# 1. Validate before any job runs: a bad value fails here, naming its key; the schema's defaults
#    are filled in once (rules read config[...] and repeat no default).
try:
    lmperf.core.config.validate(config)
except lmperf.core.config.ConfigError as error:
    raise LmperfInputError(str(error)) from None


# 2. The device: the slug names results/<device>/ and picks the grid.
def _resolve_device(setting):
    if setting != "auto":
        return setting
    # `auto` is resolved once, by the Snakemake process the user started: cluster jobs re-read
    # this file on their compute node and inherit that answer through the environment (sbatch
    # --export=ALL). On a cluster, name the device: the submitting node usually has no GPU.
    resolved = os.environ.get("LMPERF_AUTO_DEVICE")
    if resolved is None:
        import lmperf.core.device

        resolved = lmperf.core.device.device_slug()
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
# Markdown fragments that the report is assembled from; each rules file adds its own.
SECTION_FILES = []
# Every aggregate rule's stamp (see 4.); `all` asks for each, so every aggregate is checked.
STAMP_FILES = []


# `--config report_only=true` builds tables, figures and the report from the records that are
# present (committed GPU records on a machine without that GPU) and runs no cell (the cell rules
# are not even defined); the report lists the cells of the grid that have no record yet and those
# measured with older code.
REPORT_ONLY = config["report_only"]
RUN_CELLS = not REPORT_ONLY
# Each run that runs jobs notes its start beside the device's records (lmperf.core.run_log; Snakemake
# calls onstart neither in a dry run nor when nothing is to be done, and report-only mode measures
# nothing): the report header leaves the gaps in which a run began out of the grid's time, the time
# between two runs that one `snakemake --cores 1 all` does not have.
RUNS_LOG = f"results/{DEVICE}/{lmperf.core.run_log.RUNS_FILE}"


onstart:
    if RUN_CELLS:
        lmperf.core.run_log.note_start(Path(RUNS_LOG).parent)


def measured(paths):
    """Records that aggregates read: every record of the grid (missing ones run first), or in
    report-only mode just those present. ancient(): see `inputs` below."""
    return inputs(p for p in paths if not REPORT_ONLY or Path(p).exists())


def inputs(paths):
    """Input files whose modification times do not count (ancient()): in a fresh clone they are
    the checkout's order, not the order the files were made in. A job still reruns when a job
    making one of its inputs runs, when an output is missing, or when its flag says it is stale."""
    return [ancient(p) for p in paths]


def grid_records():
    """Every record the grid asks for, all kinds."""
    return (
        e2e_records()
        + e2e_compile_records()
        + nsys_records()
        + memory_records()
        + precision_records()
        + attention_records()
        + flash_records()
        + ladder_records()
    )


def missing_records():
    """Cells of the grid without a record (only in report-only mode; otherwise they run first)."""
    return [p for p in grid_records() if not Path(p).exists()] if REPORT_ONLY else []


# Records that `all` reads but never measures (the scale-out check needs a host with several GPUs
# and is run by name, scaleout.smk): a stale one is named in the report, never re-measured.
KEPT_RECORDS = ["results/{device}/scaleout/e2e.json"]


def kept_records():
    return [p.format(device=DEVICE) for p in KEPT_RECORDS]


def stale_records():
    """Records measured with other code than the current that this run leaves as they are, for the
    report to name: the grid's in report-only mode (otherwise they are re-measured first), and a
    stale kept record in any mode."""
    grid = [p for p in grid_records() if p in STALE_RECORDS] if REPORT_ONLY else []
    return sorted(grid + [p for p in kept_records() if p in STALE_RECORDS])


# 3. Code versions, computed from the code (lmperf.core.fingerprint): the import closure of the
#    module a job runs, read statically from this checkout's src/ and hashed without comments,
#    docstrings or layout. Records keep theirs (provenance.code_version), so staleness travels
#    with the repository: a fresh clone needs no .snakemake/ metadata to know what to rerun.
#    A cell that picks a module its code imports only by choice (our flash kernels, through
#    lmperf.attention's `flash`: lmperf.core.fingerprint.CHOSEN_IMPORTS) names it (`record_choices`),
#    so a kernel change re-measures the cells that run the kernels and no other.
SRC = Path(workflow.basedir) / "src" / "lmperf"
_VERSIONS = {}


def code_version(module, choices=()):
    key = (module, tuple(choices))
    if key not in _VERSIONS:
        _VERSIONS[key] = lmperf.core.fingerprint.code_version(module, SRC, tuple(choices))
    return _VERSIONS[key]


# The records of this device: results/<device>/<kind>/*.json, measured by lmperf.cells.<kind>.
CELL_KINDS = [
    "e2e",
    "e2e_compile",
    "attention",
    "nsys",
    "memory",
    "precision",
    "flash",
    "scaleout",
    "ladder",
    "gemm_peak",
    "ladder_profile",
]


def cell_module(kind):
    return f"lmperf.cells.{kind}"


def record_module(path):
    """The cell module that writes record ``path`` (results/<device>/<kind>/<name>.json)."""
    kind, name = path.split("/")[2], Path(path).name
    if kind == "flash":  # three cells share the directory
        kind = {"correctness": "flash_correctness", "leaderboard.json": "flash_leaderboard"}.get(
            name.split("_")[0], "flash_benchmark"
        )
    return cell_module(kind)


# Chosen imports (lmperf.core.fingerprint) that a cell runs: the speed ladder has a rung with our flash
# kernels and its profile profiles the best rung, whichever it is; an e2e cell runs them when its
# record names `flash` as its attention (attention_compare), an attention job when its
# implementation is `flash` or `compiled_flash` (with their warm-up and product labels).
FLASH_KERNELS = "lmperf.kernels.flash"
KIND_CHOICES = {"ladder": (FLASH_KERNELS,), "ladder_profile": (FLASH_KERNELS,)}
ATTENTION_FLASH_CHOICES = (FLASH_KERNELS, "lmperf.kinds.flash.common", "lmperf.kernels.flash.products")


def attention_runs_our_kernels(implementation):
    """Whether an attention job's implementation ('flash', 'compiled_flash', ...) is our kernels."""
    return implementation.removeprefix("compiled_") == "flash"


def record_choices(path):
    """The chosen imports that the cell writing record ``path`` runs."""
    kind, stem = path.split("/")[2], Path(path).stem
    if kind == "e2e" and stem.endswith("_flash"):
        return (FLASH_KERNELS,)
    if kind == "attention" and attention_runs_our_kernels(stem.rsplit("_", 3)[0]):  # {impl}_{precision}_d{d}_n{n}
        return ATTENTION_FLASH_CHOICES
    return KIND_CHOICES.get(kind, ())


def record_code_version(path):
    """The current code version of the cell that writes record ``path``."""
    return code_version(record_module(path), record_choices(path))


def cell_shell(kind, args, per_record=False):
    """A cell's command: `exec` makes the cell Snakemake's own child (it dies with it, see
    lmperf.core.cell.die_with_parent), and the code version lands in its provenance. A kind whose
    cells differ in their choices (e2e, attention) passes per_record and gives its rule the param
    `code_version` (`cell_version_param`)."""
    if per_record:
        version = "{params.code_version}"
    else:
        version = code_version(cell_module(kind), KIND_CHOICES.get(kind, ()))
    return f"export LMPERF_CODE_VERSION={version}; exec python -m lmperf {kind} {args} > {{log}} 2>&1"


def cell_version_param(wildcards, output):
    """The param `code_version` of a per_record cell rule: that of its first record (every record
    of one job makes the same choices)."""
    return record_code_version(output[0])


def read_records(device, check=True):
    """Every record of ``device``, checked: a truncated, invalid or duplicated one stops the run
    before any job, naming its path and the fix. ``check=False`` only parses them (another device's
    records, which this run reads for the front page only: the answers job validates them as it
    reads them). Validation checks the schema once for all (lmperf.core.record.validator)."""
    records = {}
    for kind in CELL_KINDS:
        for path in sorted(glob.glob(f"results/{device}/{kind}/*.json")):
            try:
                records[path] = lmperf.core.record.load_record(path) if check else json.loads(Path(path).read_text())
            except lmperf.core.record.RecordError as error:
                raise LmperfInputError(str(error)) from None
            except json.JSONDecodeError as error:
                raise LmperfInputError(f"{path}: not valid JSON ({error})") from None
    if check:
        try:
            lmperf.core.record.check_unique(records)
        except lmperf.core.record.RecordError as error:
            raise LmperfInputError(str(error)) from None
    return records


_UNCHANGED = {}


def _same_code_as_clean_commit(record, path):
    """A record from a clean commit whose cell code is unchanged since ran the current code."""
    provenance = record["provenance"]
    commit = provenance.get("git_commit")
    if provenance.get("git_dirty") is not False or not commit or commit == "unknown":
        return False
    key = (commit, record_module(path), record_choices(path))  # one `git diff` per commit and cell code
    if key not in _UNCHANGED:
        _UNCHANGED[key] = lmperf.core.fingerprint.unchanged_since(commit, key[1], SRC, key[2])
    return _UNCHANGED[key]


def _check_choices(records):
    """A record whose cell ran our flash kernels (attention `flash`, or an attention job of
    implementation `flash`) while its code version leaves them out would not go stale when they
    change: record_choices misses its case. Stop, naming it."""
    for path, record in records.items():
        settings = record["provenance"].get("settings") or {}
        ran_flash = settings.get("attention") == "flash" or (
            record["kind"] == "attention" and attention_runs_our_kernels(settings.get("implementation", ""))
        )
        if not ran_flash:
            continue
        if FLASH_KERNELS not in lmperf.core.fingerprint.closure(record_module(path), SRC, record_choices(path)):
            raise LmperfInputError(
                f"{path} ran attention `flash`, but its cell's code version does not cover {FLASH_KERNELS}: "
                "add its case to record_choices (workflow/rules/common.smk)"
            )


def stale_of(records):
    """{record path: (its code version, the current one)} of the records measured with other code
    than the current (no version: older code)."""
    stale = {}
    for path, record in records.items():
        current, recorded = record_code_version(path), record["provenance"].get("code_version")
        if recorded != current and not _same_code_as_clean_commit(record, path):
            stale[path] = (recorded or "none", current)
    return stale


RECORDS = read_records(DEVICE)
_check_choices(RECORDS)
STALE_RECORDS = stale_of(RECORDS)


# A job whose outputs must be redone although they exist gets a flag as input: a file that does
# not exist yet, made by rule `stale` (a no-op), so Snakemake runs the job after it (and deletes
# the old outputs just before; nothing is deleted in a dry run or report-only mode). Flags are
# plain inputs, not ancient(): a flag made by a run that was stopped before the job finished is
# newer than the job's old outputs, so the next run still redoes the job.
STALE_FLAG = "logs/stale/{name}.flag"


def stale_flags(*patterns):
    """Input function of a cell rule: a flag per output (pattern over the rule's wildcards) whose
    record is stale."""

    def flags(wildcards):
        if REPORT_ONLY:
            return []
        outputs = [p.format(**dict(wildcards.items())) for p in _flatten(patterns)]
        return [_flag(o, *STALE_RECORDS[o]) for o in outputs if o in STALE_RECORDS]

    return flags


def _flag(path, old, new):
    """The flag that redoes ``path`` (old -> new version). Flags are not temp(): Snakemake does not
    remake a missing temp file whose consumers look done. So the name also holds the file's mtime:
    a flag left from an earlier rerun never stands for a later one."""
    return STALE_FLAG.format(name=f"{path}.{old}-to-{new}.{Path(path).stat().st_mtime_ns}")


def _flatten(items):
    for item in items:
        if isinstance(item, (list, tuple)):
            yield from _flatten(item)
        else:
            yield item


rule stale:
    output:
        STALE_FLAG,
    localrule: True
    message:
        "{wildcards.name}: made by other code than the current: redoing it"
    shell:
        "touch {output}"


# 4. Aggregates (tables, figures, sections, the report) keep a stamp beside their outputs:
#    results/<device>/stamps/<rule>.stamp (JSON) holds the code version they ran and a digest of
#    each file they read. An aggregate is redone when its stamp differs from now (report code
#    edited, a record re-measured by another run), when one of its records is stale (re-measured
#    first), or for the report, when any aggregate is redone. Aggregates read their inputs
#    ancient() (see `inputs`), and Snakemake then does not pass "an input job reruns" on to them,
#    so this file does it, with flags; a missing input or output reruns a job by itself.
STAMP = "results/{device}/stamps/{name}.stamp"
AGGREGATES = {}  # name -> (module, paths, extra), in the order the rules files register them


def aggregate_stamp(name, device="{device}"):
    """The stamp output of aggregate rule ``name`` (a {device} pattern by default), registered for `all`."""
    STAMP_FILES.append(STAMP.format(device=DEVICE, name=name))
    return STAMP.format(device=device, name=name)


@functools.cache
def _stamp_state(name):
    """(stamp path, stamp held, stamp wanted now) of aggregate ``name``."""
    entry, paths, extra = AGGREGATES[name]
    stamp = STAMP.format(device=DEVICE, name=name)
    want = lmperf.core.fingerprint.stamp(code_version(entry), [p for p in paths if Path(p).exists()], _short(extra))
    return stamp, lmperf.core.fingerprint.read_stamp(stamp), want


def redone(name):
    """Will aggregate ``name`` run in this run? (Its stamp is missing or differs, one of its records
    is stale or missing, or, for the report, another aggregate is redone.)"""
    stamp, have, want = _stamp_state(name)
    if have != want:
        return True
    _, paths, _ = AGGREGATES[name]
    kept = kept_records()
    if not REPORT_ONLY and any((p in STALE_RECORDS and p not in kept) or not Path(p).exists() for p in paths):
        return True  # a record this run re-measures (a stale kept record stays: no rerun on every run)
    return name == "answers" and any(redone(other) for other in AGGREGATES if other != "answers")


def stamp_flag(name, module, paths, extra=""):
    """Input function of aggregate rule ``name``: a flag when it must be redone although its
    outputs exist (see `redone`). ``module`` is the report module it runs, ``paths`` what it
    reads, ``extra`` its other settings. Registered for `all` too (see all_flags)."""
    AGGREGATES[name] = (module, list(_flatten(paths)), extra)

    def flag(wildcards):
        stamp, have, want = _stamp_state(name)
        if have is None or not redone(name):
            return []  # no stamp: an output is missing, which reruns the job by itself
        digest = lmperf.core.fingerprint.stamp_digest
        return [_flag(stamp, digest(have), digest(want))]

    STAMP_FLAG_FUNCTIONS.append(flag)
    return flag


STAMP_FLAG_FUNCTIONS = []


def all_flags(wildcards):
    """Every flag of this run, for `all`: Snakemake makes a missing file only when something needs
    it, so the flags are targets themselves; the job that takes one as input then reruns."""
    flags = [] if REPORT_ONLY else [_flag(p, *STALE_RECORDS[p]) for p in grid_records() if p in STALE_RECORDS]
    for function in STAMP_FLAG_FUNCTIONS:
        flags += function(wildcards)
    return flags


def report_shell(kind, command):
    """A report rule's command, or placeholders for its outputs when its kind has no record on this
    device yet (report-only mode before the first run there; lmperf.report.placeholder)."""
    return (
        f'if [ -n "{{input.records}}" ]; then {command}; else python -m lmperf.report.placeholder'
        f" --kind {kind} --device {{wildcards.device}} --outputs {{output}} > {{log}} 2>&1; fi"
    )


def stamp_shell(name, module, inputs="{input.records}", extra=""):
    """Shell suffix that writes the stamp once the aggregate succeeded."""
    return (
        f" && python -m lmperf.core.fingerprint stamp --output {{output.stamp}} --code-version {code_version(module)}"
        f" --extra '{_short(extra)}' --inputs {inputs}"
    )


def _short(extra):
    """The rule's other settings as a digest (no braces or quotes reach the shell command)."""
    return hashlib.sha256(extra.encode()).hexdigest()[:16] if extra else ""


# 5. One source of truth per setting: a rule passes its config slice (defaults already filled from
#    the schema) and the cell's flags are generated from it, key `max_phase_seconds` becoming
#    `--max-phase-seconds 1.5`.
def _flag_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "x".join(map(str, value))  # a shape: 2x1024x1024
    return shlex.quote(str(value))


def cell_flags(settings, skip=(), prefix=""):
    """`--key-name value …` for every key of a config slice except ``skip`` (grid axes, which
    become wildcards); lists give several values, booleans --key / --no-key, None nothing, and
    nested tables prefix their keys (toy_model.in_features: --toy-model-in-features)."""
    parts = []
    for key, value in settings.items():
        if key in skip or value is None:
            continue
        flag = (prefix + key).replace("_", "-")
        if isinstance(value, dict):
            parts.append(cell_flags(value, prefix=f"{prefix}{key}_"))
        elif isinstance(value, bool):
            parts.append(f"--{flag}" if value else f"--no-{flag}")
        elif isinstance(value, list):
            parts.append(f"--{flag} " + " ".join(map(_flag_value, value)))
        else:
            parts.append(f"--{flag} {_flag_value(value)}")
    return " ".join(p for p in parts if p)


# Host memory and time limits follow the model's parameter count (lmperf.core.sizes), not its name.
def size_parameters(model):
    return lmperf.core.sizes.parameter_count(lmperf.core.sizes.config_from_name(model))


def parameters(wildcards):
    return size_parameters(wildcards.model)


def cells(pattern, grid, **extra):
    """Expand a grid dict (models, context_lengths, precisions, …) into record paths."""
    return sorted(
        set(
            pattern.format(device=DEVICE, model=m, ctx=c, precision=p, **dict(zip(extra, combo)))
            for m, c, p in itertools.product(grid["models"], grid["context_lengths"], grid["precisions"])
            for combo in itertools.product(*extra.values())
        )
    )


# 6. Each kind's grid expanded into its record paths (one section per kind).

# -- e2e: plain attention's records carry no suffix; another implementation's end in _<name>
E2E = GRID["e2e"]
E2E_RECORD = "results/{device}/e2e/{model}_ctx{ctx}_{precision}_{compile}_w{warmup}{attention}.json"
E2E_ATTENTIONS = E2E["attention_compare"]["attentions"] if "attention_compare" in E2E else []


def e2e_records():
    w = E2E["warmup_steps"]
    paths = cells(E2E_RECORD, E2E["main"], compile=["eager"], warmup=[w], attention=[""])
    if "attention_compare" in E2E:
        suffixes = ["" if name == "plain" else f"_{name}" for name in E2E_ATTENTIONS]
        paths += cells(E2E_RECORD, E2E["attention_compare"], compile=["eager"], warmup=[w], attention=suffixes)
    if "compile" in E2E:
        paths += cells(E2E_RECORD, E2E["compile"], compile=["eager", "compiled"], warmup=[w], attention=[""])
    if "warmup_sweep" in E2E:
        sweep = E2E["warmup_sweep"]
        paths += cells(
            E2E_RECORD, sweep, compile=["eager"], warmup=sorted(set(sweep["warmup_steps"]) | {w}), attention=[""]
        )
    return sorted(set(paths))


# The compile job (one job, a record per compiled e2e cell): each compiled cell's graphs compiled
# cold into its own cache directory, several cells at once, before the measured cells load them.
E2E_COMPILE_RECORD = "results/{device}/e2e_compile/{model}_ctx{ctx}_{precision}.json"
# torch.compile's on-disk caches of one compiled cell (git-ignored; on a cluster, on the shared file
# system the compute nodes see, like the rest of the checkout)
E2E_COMPILE_CACHE = ".cache/torch_compile/{device}/{model}_ctx{ctx}_{precision}"


E2E_COMPILE_CELLS = (
    sorted(itertools.product(E2E["compile"]["models"], E2E["compile"]["context_lengths"], E2E["compile"]["precisions"]))
    if "compile" in E2E
    else []
)


def e2e_compile_records():
    return sorted(
        E2E_COMPILE_RECORD.format(device=DEVICE, model=m, ctx=c, precision=p) for m, c, p in E2E_COMPILE_CELLS
    )


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
    return sorted(
        path
        for impl in ATTENTION["implementations"]
        for path in attention_outputs(DEVICE, impl, ATTENTION["precision"])
    )


# -- nsys
NSYS = GRID.get("nsys")
NSYS_RECORD = "results/{device}/nsys/{model}_ctx{ctx}_{precision}_{mode}.json"
NSYS_MODES = ["inference", "training"]


def nsys_precisions():
    """{precision: its sizes} over the nsys grids (main: fp32 every size; tensor_cores: bf16), each
    precision's sizes largest first: one nsys process per precision profiles them in that order, so
    the size nearest the memory limit runs in a fresh process (lmperf.kinds.nsys.cell)."""
    if not NSYS:
        return {}
    grids = [NSYS["main"]] + ([NSYS["tensor_cores"]] if "tensor_cores" in NSYS else [])
    models = {}
    for grid in grids:
        for precision in grid["precisions"]:
            models.setdefault(precision, set()).update(grid["models"])
    return {
        precision: sorted(names, key=lambda m: (-size_parameters(m), m)) for precision, names in sorted(models.items())
    }


def nsys_outputs(device, precision):
    """One precision's job: a record per size × context length × mode (one nsys process)."""
    return [
        NSYS_RECORD.format(device=device, model=model, precision=precision, ctx=c, mode=m)
        for model in nsys_precisions()[precision]
        for c in sorted(NSYS["context_lengths"])
        for m in NSYS_MODES
    ]


def nsys_records():
    return sorted(path for p in nsys_precisions() for path in nsys_outputs(DEVICE, p))


def nsys_e2e_records():
    """The e2e records of the same fp32 cells (the forward-time cross-check), where the e2e grid has them."""
    if not NSYS or not E2E:
        return []
    wanted = {
        E2E_RECORD.format(
            device=DEVICE, model=m, ctx=c, precision="fp32", compile="eager", warmup=E2E["warmup_steps"], attention=""
        )
        for m in nsys_precisions().get("fp32", [])
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
    return sorted(
        p for precision in FLASH["benchmarking"]["precisions"] for p in flash_bench_outputs(DEVICE, precision)
    )


def flash_leaderboard_records():
    return [FLASH_LEADERBOARD_RECORD.format(device=DEVICE)] if FLASH and "leaderboard" in FLASH else []


def flash_records():
    return flash_correctness_records() + flash_bench_records() + flash_leaderboard_records()
