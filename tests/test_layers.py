"""The layers of src/lmperf hold: who may import whom, no cycles, no torch where none belongs.

- core's pure modules (PURE_CORE) import no torch, and of lmperf only each other and the kinds'
  registry (``lmperf.kinds``);
- each kind's report side (its ``grid``, ``report`` and ``compare`` and every module they import)
  imports no torch and no cell module (``lmperf.kinds.CELLS``);
- ``lmperf.kernels`` imports nothing of lmperf but core's pure modules;
- no kind imports another kind, except the pure labels ``lmperf.kinds.flash.products``;
- the core, the model and the kernels import no kind (but the registry) and no report.

Imports are read statically (every ``import`` in a module, at any depth, lazy ones included), so a
violation is caught wherever it hides; "no torch" is checked by importing for real.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from lmperf.kinds import CELLS, KINDS

SRC = Path(__file__).resolve().parents[1] / "src"
PURE_CORE = {
    f"lmperf.core.{m}" for m in ("sizes", "flops", "units", "peaks", "stats", "plan", "fingerprint", "record", "config")
}
REGISTRY = "lmperf.kinds"
SHARED_ACROSS_KINDS = {"lmperf.kinds.flash.products"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((SRC / "lmperf").rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """The lmperf modules module ``name`` imports anywhere (a name imported from a package counts as
    its submodule when there is one, else as the package)."""
    path = MODULES[name]
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = (
                ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".")
                if node.level
                else node.module
            )
            found.update(f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names)
    return {m for m in found if m.split(".")[0] == "lmperf" and m != name}


GRAPH = {name: imports_of(name) for name in MODULES}


def closure(starts) -> set[str]:
    seen, todo = set(), list(starts)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(GRAPH.get(name, ()))
    return seen


def kind_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "kinds" else None


def report_side(kind: str) -> set[str]:
    return closure(m for m in (f"lmperf.kinds.{kind}.{part}" for part in ("grid", "report", "compare")) if m in MODULES)


def test_the_graph_sees_relative_lazy_and_package_imports():
    # independent reference: lines of these files read by eye
    assert "lmperf.kernels.flash.inputs" in GRAPH["lmperf.kernels.flash.reference"]  # from .inputs import …
    assert "lmperf.kernels.flash" in GRAPH["lmperf.attention"]  # inside flash_attention()
    assert "lmperf.core.sizes" in GRAPH["lmperf.core.flops"]
    assert all(f"lmperf.kinds.{kind}.grid" in MODULES for kind in KINDS)
    assert set(CELLS.values()) <= set(MODULES)


def test_each_layer_imports_only_what_it_may():
    problems = []
    for importer, imported in GRAPH.items():
        for target in sorted(imported):
            kind, their_kind = kind_of(importer), kind_of(target)
            if importer in PURE_CORE and target not in PURE_CORE | {REGISTRY}:
                problems.append("core's pure modules import only each other and the kinds' registry")
            elif (
                importer.startswith("lmperf.kernels")
                and not target.startswith("lmperf.kernels")
                and target not in PURE_CORE
            ):
                problems.append("the kernels import only core's pure modules")
            elif kind and their_kind and kind != their_kind and target not in SHARED_ACROSS_KINDS:
                problems.append("a kind imports no other kind")
            elif not kind and their_kind and not importer.startswith("lmperf.report"):
                problems.append("only the reports import a kind (besides the registry)")
            elif not importer.startswith("lmperf.report") and target.startswith("lmperf.report") and not kind:
                problems.append("the core, the model and the kernels import no report")
            else:
                continue
            problems[-1] = f"{importer} imports {target}: {problems[-1]}"
    assert not problems, "\n".join(problems)


def test_a_kinds_report_side_imports_no_cell():
    cells = set(CELLS.values())
    found = {kind: sorted(report_side(kind) & cells) for kind in KINDS}
    assert not any(found.values()), {kind: modules for kind, modules in found.items() if modules}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    return next((cycle for node in sorted(graph) if node not in state and (cycle := visit(node))), None)


def test_no_import_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert find_cycle(GRAPH) is None, f"import cycle: {find_cycle(GRAPH)}"


def test_pure_core_and_every_kinds_report_side_import_no_torch():
    """Imported in a fresh interpreter where every import of torch is noted and refused, guarded or
    not (the model last, to show the check can fail)."""
    torch_free = sorted(PURE_CORE | {REGISTRY}.union(*(report_side(kind) for kind in KINDS)))
    code = (
        "import importlib, json, sys\n"
        "asked = []\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            asked.append(name)\n"
        "            raise ImportError('torch refused')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "found = []\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError:\n"
        "        if not asked:\n"
        "            raise\n"
        "    if asked:\n"
        "        found.append(name)\n"
        "        asked.clear()\n"
        "print(json.dumps(found))\n"
    )
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"}
    run = subprocess.run(
        [sys.executable, "-c", code, *torch_free, "lmperf.model"], capture_output=True, text=True, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout) == ["lmperf.model"], "these pull in torch (directly or through an import)"
