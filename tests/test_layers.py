"""The layers of src/lmperf hold: who may import whom, no cycles, no torch where none belongs.

The layer map below is the one docs/ARCHITECTURE.md draws. Imports are read statically (every
``import`` in a module, at any depth, lazy ones included), so a violation is caught wherever it
hides; the torch-free modules are also imported for real in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "lmperf"

# Layer of every module, by name or package prefix (the longest match wins). Lower layers know
# nothing of higher ones.
LAYERS: dict[str, str] = {
    # pure: plain Python facts and arithmetic, no torch (reports and the workflow import these)
    "lmperf": "pure",  # the package's __init__
    "lmperf.core.sizes": "pure",  # size registry, parameter counts
    "lmperf.core.flops": "pure",  # FLOP counts, TFLOP/s
    "lmperf.core.units": "pure",  # MiB, GiB, bytes per element
    "lmperf.kinds.attention.memory_model": "pure",  # predicted memory of attention
    "lmperf.kinds.memory.snapshot": "pure",  # snapshot analysis
    "lmperf.kinds.memory.account": "pure",  # the analytic memory account of the model
    "lmperf.core.peaks": "pure",  # datasheet peak rates
    "lmperf.profiling": "pure",  # package __init__
    "lmperf.profiling.kernels": "pure",  # kernel classes by name
    "lmperf.profiling.phases": "pure",  # kernels to phases by NVTX range
    # records: reading, validating and writing records; what the workflow reads (no torch)
    "lmperf.core.record": "records",
    "lmperf.core.config": "records",
    "lmperf.core.fingerprint": "records",
    "lmperf.core.run_log": "records",  # when each Snakemake run began (the header's grid time)
    # model and kernels: torch modules that compute
    "lmperf.model": "model",
    "lmperf.attention": "model",
    "lmperf.nvtx": "model",
    "lmperf.core.dtypes": "model",
    "lmperf.kernels.flash": "kernels",
    # measuring: timing, out of memory, devices, profilers, probes
    "lmperf.core.timing": "measuring",
    "lmperf.core.oom": "measuring",
    "lmperf.core.device": "measuring",
    "lmperf.core.gpu_claim": "measuring",
    "lmperf.kinds.precision.probes": "measuring",
    "lmperf.profiling.nsys": "measuring",
    "lmperf.profiling.torch_fallback": "measuring",
    "lmperf.benchmarks": "measuring",  # harnesses that time kernels (beside the cells, outside the kernels)
    # cells: one CLI per kind of measurement, writing records
    "lmperf.cells": "cells",
    # reporting: records in, tables, figures and text out
    "lmperf.report": "report",
}

# What each layer may import (besides itself).
MAY_IMPORT: dict[str, set[str]] = {
    "pure": set(),
    "records": {"pure"},
    "model": {"pure", "kernels"},
    "kernels": {"pure"},  # kernels are leaves: lmperf.kernels.flash uses nothing of lmperf but the pure layer
    "measuring": {"pure", "records", "model", "kernels"},
    "cells": {"pure", "records", "model", "kernels", "measuring"},
    "report": {"pure", "records"},
}
# Layers whose modules must import without torch.
TORCH_FREE = {"pure", "records", "report"}

# Known violations, each removed by the change that fixes it (the lead checks at the end that
# this is empty). (importer, imported module) pairs.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


MODULES = all_modules()


def resolve(importer: str, is_package: bool, node: ast.AST) -> list[str]:
    """The lmperf modules an import statement names (a name imported from a package counts as the
    submodule when there is one, else as the package)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == PACKAGE]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = importer.split(".") if is_package else importer.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != PACKAGE:
        return []
    out = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        out.append(sub if sub in MODULES else target)
    return out


def imports_of(name: str) -> set[str]:
    path = MODULES[name]
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(resolve(name, path.name == "__init__.py", node))
    found.discard(name)
    return found


def layer_of(name: str) -> str:
    keys = [k for k in LAYERS if name == k or name.startswith(k + ".")]
    if not keys:
        raise KeyError(f"{name} has no layer: add it to LAYERS here and to docs/ARCHITECTURE.md")
    return LAYERS[max(keys, key=len)]


GRAPH = {name: imports_of(name) for name in MODULES}


def test_every_module_has_a_layer():
    missing = [name for name in MODULES if not any(name == k or name.startswith(k + ".") for k in LAYERS)]
    assert not missing, f"modules without a layer (add them to LAYERS and docs/ARCHITECTURE.md): {missing}"


def test_the_resolver_sees_relative_and_lazy_imports():
    # independent reference: lines of two files read by eye
    assert "lmperf.kernels.flash.inputs" in GRAPH["lmperf.kernels.flash.reference"]  # from .inputs import ...
    assert "lmperf.kernels.flash" in GRAPH["lmperf.attention"]  # inside flash_attention()
    assert "lmperf.core.sizes" in GRAPH["lmperf.core.flops"]


def violations() -> set[tuple[str, str]]:
    found = set()
    for importer, imported in GRAPH.items():
        mine = layer_of(importer)
        for target in imported:
            theirs = layer_of(target)
            if theirs != mine and theirs not in MAY_IMPORT[mine]:
                found.add((importer, target))
    return found


def test_layers_import_only_downwards():
    unexpected = violations() - KNOWN_VIOLATIONS
    assert not unexpected, "imports against the layer map (docs/ARCHITECTURE.md):\n" + "\n".join(
        f"  {a} ({layer_of(a)}) imports {b} ({layer_of(b)})" for a, b in sorted(unexpected)
    )


def test_known_violations_are_still_real():
    """An entry fixed by its owner must leave the allow-list with the fix."""
    fixed = KNOWN_VIOLATIONS - violations()
    assert not fixed, f"fixed, so remove from KNOWN_VIOLATIONS: {sorted(fixed)}"


def unit(name: str) -> str:
    """A module, or the subpackage it belongs to (lmperf.kinds.e2e.cell -> lmperf.cells)."""
    parts = name.split(".")
    return ".".join(parts[:2])


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles_between_modules_or_packages():
    known = KNOWN_VIOLATIONS
    modules = {a: {b for b in bs if (a, b) not in known} for a, bs in GRAPH.items()}
    assert find_cycle(modules) is None, f"import cycle between modules: {find_cycle(modules)}"
    packages: dict[str, set[str]] = {}
    for a, bs in modules.items():
        packages.setdefault(unit(a), set()).update(unit(b) for b in bs if unit(b) != unit(a))
    packages.pop(PACKAGE, None)  # lmperf/__init__ imports nothing; every module "is in" it
    for deps in packages.values():
        deps.discard(PACKAGE)
    assert find_cycle(packages) is None, f"import cycle between packages: {find_cycle(packages)}"


def _imports_torch(modules: list[str]) -> dict[str, bool]:
    """Import each module in a fresh interpreter; whether torch got imported."""
    code = (
        "import importlib, json, sys\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "    out[name] = 'torch' in sys.modules\n"
        "print(json.dumps(out))\n"
    )
    result = {}
    for name in modules:  # one interpreter per module: one import must not hide another's
        proc = subprocess.run(
            [sys.executable, "-c", code, name],
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"},
        )
        assert proc.returncode == 0, f"importing {name} failed:\n{proc.stderr}"
        result.update(json.loads(proc.stdout.splitlines()[-1]))
    return result


def torch_free_modules() -> list[str]:
    known_importers = {a for a, _ in KNOWN_VIOLATIONS}
    return [name for name in MODULES if layer_of(name) in TORCH_FREE and name not in known_importers]


@pytest.mark.slow
def test_pure_records_and_report_modules_import_no_torch():
    # report modules import pandas and matplotlib: a second or two each
    imported = _imports_torch(torch_free_modules())
    offenders = sorted(name for name, torch_loaded in imported.items() if torch_loaded)
    assert not offenders, f"these modules pull in torch (directly or through an import): {offenders}"


def test_the_torch_check_can_fail():
    assert _imports_torch(["lmperf.model"]) == {"lmperf.model": True}
