"""The code fingerprint: which code a record was measured with, computed from the code itself.

A cell's fingerprint hashes the import closure of its module inside ``lmperf`` (every ``lmperf``
module it imports, directly or through others, at any depth, wherever the import statement sits,
plus the packages on the way), read with ``ast`` and never imported (the workflow stays free of
torch), in a normalised form: without docstrings, comments, line numbers or layout. Data a
module reads as code (tile tables) counts too: a module-level ``CODE_DATA = ("tuned/*.json", …)``
adds the files those globs match beside it.

Some code runs only when a setting picks it by name: our flash kernels run in a whole-model cell
only when its ``attention`` is ``flash``. Such imports (``CHOSEN_IMPORTS``) stay out of the
closure, and the implementation names in a job's settings (``CHOSEN_BY_NAME``) bring them back in.
So a kernel edit re-measures the cells that run the kernels, and no other.

``fingerprint(cell_module, settings)`` is the one function: the runner calls it when it writes a
record (``provenance.code_version``), the workflow when it checks one.
"""

from __future__ import annotations

import ast
import hashlib
import json
from functools import cache
from pathlib import Path

PACKAGE = "lmperf"
# src/lmperf of this checkout; the workflow passes its own copy's directory explicitly
DEFAULT_ROOT = Path(__file__).resolve().parents[1]


def module_file(name: str, root: Path = DEFAULT_ROOT) -> Path | None:
    """The source file of module ``name`` (``lmperf.x.y``) under ``root`` (src/lmperf), or None."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    base = Path(root).joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _packages_of(name: str) -> list[str]:
    """'lmperf.kernels.flash.bench' -> ['lmperf', 'lmperf.kernels.flash']: the packages importing it runs first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module name an ``from X import …`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


# {importing module: the lmperf modules whose code it runs only when a setting picks them by name}
CHOSEN_IMPORTS = {
    "lmperf.attention": ("lmperf.kernels.flash",),
    "lmperf.kinds.attention.cell": (
        "lmperf.kernels.flash",
        "lmperf.kernels.flash.products",
        "lmperf.kernels.flash.warm",
    ),
}
# {implementation name, as a value in a job's settings: the modules it runs}
OUR_KERNELS = ("lmperf.kernels.flash", "lmperf.kernels.flash.products", "lmperf.kernels.flash.warm")
CHOSEN_BY_NAME = {"flash": OUR_KERNELS, "compiled_flash": OUR_KERNELS}


def direct_imports(name: str, root: Path = DEFAULT_ROOT) -> set[str]:
    """The ``lmperf`` modules that module ``name`` imports anywhere in its text, less its chosen
    imports (``CHOSEN_IMPORTS``, see the module docstring)."""
    return imports_in_text(name, root) - set(CHOSEN_IMPORTS.get(name, ()))


def imports_in_text(name: str, root: Path = DEFAULT_ROOT) -> set[str]:
    """Every ``lmperf`` module that module ``name`` imports anywhere in its text, chosen or not."""
    path = module_file(name, root)
    if path is None:
        return set()
    stat = path.stat()
    modules = set()
    for candidate in _names_imported(name, path, stat.st_mtime_ns, stat.st_size):
        if candidate.split(".")[0] != PACKAGE:
            continue
        for full in (*_packages_of(candidate), candidate):
            if module_file(full, root) is not None:
                modules.add(full)
    return modules


@cache
def _names_imported(name: str, path: Path, mtime_ns: int, size: int) -> frozenset[str]:
    """Every module name module ``name`` (file ``path``) imports, resolved, whether it exists or not;
    parsed once per version of the file (the workflow asks again for every record)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve_from(name, path.name == "__init__.py", node)
            found.add(target)
            # `from lmperf import nvtx`, `from lmperf.kernels.flash import bench`: submodules by name
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return frozenset(found)


def closure(entry: str, root: Path = DEFAULT_ROOT, choices: tuple[str, ...] = ()) -> list[str]:
    """Every ``lmperf`` module that running ``entry`` can import (``entry`` and its packages included),
    with the modules of ``choices`` (chosen imports the job makes, see the module docstring) and theirs."""
    for name in (entry, *choices):
        if module_file(name, root) is None:
            raise ValueError(f"no module {name!r} under {root}")
    seen: set[str] = set()
    todo = [entry, *_packages_of(entry)] + [m for c in choices for m in (c, *_packages_of(c))]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(direct_imports(name, root) - seen)
    return sorted(seen)


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return tree


def canonical(node) -> str:
    """A syntax tree as text that every Python version (3.10 on) writes alike.

    ``ast.dump`` is not that: 3.12 adds ``type_params=[]`` to every function and class, 3.13
    leaves empty fields out. Here fields that are None or empty are always left out, so the same
    code gets the same version on the GPU machine's Python as on this one's.
    """
    if isinstance(node, ast.AST):
        fields = []
        for name in node._fields:
            value = getattr(node, name, None)
            if value is None or value == []:
                continue
            fields.append(f"{name}={canonical(value)}")
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return f"[{', '.join(canonical(item) for item in node)}]"
    return repr(node)


@cache
def _normalized(path: Path, mtime_ns: int, size: int) -> str:
    tree = ast.parse(path.read_text(), filename=str(path))
    return canonical(_strip_docstrings(tree))


def normalized(path: Path) -> str:
    """The module's syntax tree as text, without docstrings, comments, line numbers or layout."""
    stat = Path(path).stat()
    return _normalized(Path(path), stat.st_mtime_ns, stat.st_size)


@cache
def _declared_globs(path: Path, mtime_ns: int, size: int) -> tuple[str, ...]:
    globs: list[str] = []
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "CODE_DATA" for t in node.targets)
            and isinstance(node.value, (ast.Tuple, ast.List))
        ):
            globs += [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return tuple(globs)


def data_files(name: str, root: Path = DEFAULT_ROOT) -> list[Path]:
    """The files module ``name`` declares as part of its code: its top-level ``CODE_DATA`` tuple of
    globs, relative to the module's directory, read statically (once per file version)."""
    path = module_file(name, root)
    if path is None:
        return []
    stat = path.stat()
    globs = _declared_globs(path, stat.st_mtime_ns, stat.st_size)
    return sorted({f for pattern in globs for f in path.parent.glob(pattern) if f.is_file()})


def _data_text(path: Path) -> str:
    text = path.read_text()
    if path.suffix == ".json":
        try:
            return json.dumps(json.loads(text), sort_keys=True)
        except ValueError:
            pass  # not valid JSON: hashed as text (and the module reading it will say so)
    return text


def chosen_modules(settings) -> tuple[str, ...]:
    """The modules the implementation names among ``settings``' values (at any depth) choose."""
    found: set[str] = set()

    def walk(value):
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, str) and value in CHOSEN_BY_NAME:
            found.update(CHOSEN_BY_NAME[value])

    walk(settings)
    return tuple(sorted(found))


def fingerprint(entry: str, settings: dict, root: Path = DEFAULT_ROOT) -> str:
    """The fingerprint of cell module ``entry`` run with ``settings``."""
    return code_version(entry, root, chosen_modules(settings))


@cache
def code_version(entry: str, root: Path = DEFAULT_ROOT, choices: tuple[str, ...] = ()) -> str:
    """16 hex digits naming the code ``entry`` runs (its import closure inside lmperf, with the
    modules of ``choices`` and the data files its modules declare in CODE_DATA)."""
    digest = hashlib.sha256()
    for name in closure(entry, root, choices):
        digest.update(name.encode() + b"\0")
        digest.update(normalized(module_file(name, root)).encode() + b"\0")
        for data in data_files(name, root):
            digest.update(data.name.encode() + b"\0" + _data_text(data).encode() + b"\0")
    return digest.hexdigest()[:16]


def code_version_of(entries) -> str:
    """One fingerprint for several entry modules (e.g. every report module)."""
    digest = hashlib.sha256()
    for entry in sorted(entries):
        digest.update(entry.encode() + b"\0" + code_version(entry).encode() + b"\0")
    return digest.hexdigest()[:16]
