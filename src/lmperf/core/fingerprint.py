"""The code fingerprint of a record: the normalised ``ast`` text (no docstrings, comments or layout) of
its cell's import closure inside ``lmperf``, read without importing, and the data files a module names
in ``CODE_DATA``. Imports a setting picks by name (``CHOSEN_IMPORTS``: our flash kernels in a
whole-model cell) count only where a job's settings name them (``CHOSEN_BY_NAME``). ``fingerprint`` is
the one function: the runner calls it writing a record, the workflow checking one.
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
    """'lmperf.kernels.flash.bench' -> ['lmperf', 'lmperf.kernels', 'lmperf.kernels.flash']."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


OUR_KERNELS = ("lmperf.kernels.flash", "lmperf.kernels.flash.products", "lmperf.kernels.flash.warm")
# {importing module: the lmperf modules whose code it runs only when a setting picks them by name}
CHOSEN_IMPORTS = {"lmperf.attention": ("lmperf.kernels.flash",), "lmperf.kinds.attention.cell": OUR_KERNELS}
# {implementation name, as a value in a job's settings: the modules it runs}
CHOSEN_BY_NAME = {"flash": OUR_KERNELS, "compiled_flash": OUR_KERNELS}


def direct_imports(name: str, root: Path = DEFAULT_ROOT) -> set[str]:
    """The ``lmperf`` modules that module ``name`` imports, less its ``CHOSEN_IMPORTS``."""
    return imports_in_text(name, root) - set(CHOSEN_IMPORTS.get(name, ()))


def imports_in_text(name: str, root: Path = DEFAULT_ROOT) -> set[str]:
    """Every ``lmperf`` module that module ``name`` imports anywhere in its text, chosen or not."""
    path = module_file(name, root)
    if path is None:
        return set()
    found: set[str] = set()
    for node in _parsed(path)[0]:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        else:  # `from lmperf import nvtx`: a submodule by name
            target = _resolve_from(name, path.name == "__init__.py", node)
            found.update([target, *(f"{target}.{alias.name}" for alias in node.names)])
    inside = (full for c in found if c.split(".")[0] == PACKAGE for full in (*_packages_of(c), c))
    return {full for full in inside if module_file(full, root) is not None}


def _parsed(path: Path) -> tuple[tuple, str, tuple[str, ...]]:
    stat = path.stat()
    return _parse(path, stat.st_mtime_ns, stat.st_size)


@cache
def _parse(path: Path, mtime_ns: int, size: int) -> tuple[tuple, str, tuple[str, ...]]:
    """A module's import nodes, its normalised text and its ``CODE_DATA`` globs, once per file version."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imports = tuple(node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))
    globs = tuple(
        e.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "CODE_DATA" for t in node.targets)
        and isinstance(node.value, (ast.Tuple, ast.List))
        for e in node.value.elts
        if isinstance(e, ast.Constant) and isinstance(e.value, str)
    )
    return imports, canonical(_strip_docstrings(tree)), globs


def closure(entry: str, root: Path = DEFAULT_ROOT, choices: tuple[str, ...] = ()) -> list[str]:
    """Every ``lmperf`` module that running ``entry`` can import (with its packages), with the modules
    of ``choices`` (the chosen imports a job makes) and theirs."""
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
    """A syntax tree as text that every Python from 3.10 writes alike (``ast.dump`` is not: 3.12 adds
    ``type_params=[]``, 3.13 leaves empty fields out): fields that are None or empty are left out."""
    if isinstance(node, ast.AST):
        fields = [(name, getattr(node, name, None)) for name in node._fields]
        text = ", ".join(f"{name}={canonical(value)}" for name, value in fields if value is not None and value != [])
        return f"{type(node).__name__}({text})"
    if isinstance(node, list):
        return f"[{', '.join(canonical(item) for item in node)}]"
    return repr(node)


def data_files(name: str, root: Path = DEFAULT_ROOT) -> list[Path]:
    """The files module ``name`` declares as code: its ``CODE_DATA`` globs, beside the module."""
    path = module_file(name, root)
    globs = _parsed(path)[2] if path is not None else ()
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
    if isinstance(settings, dict):
        settings = list(settings.values())
    if isinstance(settings, (list, tuple)):
        return tuple(sorted({m for value in settings for m in chosen_modules(value)}))
    return tuple(sorted(CHOSEN_BY_NAME.get(settings, ()))) if isinstance(settings, str) else ()


def fingerprint(entry: str, settings: dict, root: Path = DEFAULT_ROOT) -> str:
    return code_version(entry, root, chosen_modules(settings))


@cache
def code_version(entry: str, root: Path = DEFAULT_ROOT, choices: tuple[str, ...] = ()) -> str:
    """16 hex digits naming the code ``entry`` runs with the modules of ``choices``."""
    digest = hashlib.sha256()
    for name in closure(entry, root, choices):
        digest.update(name.encode() + b"\0")
        digest.update(_parsed(module_file(name, root))[1].encode() + b"\0")
        for data in data_files(name, root):
            digest.update(data.name.encode() + b"\0" + _data_text(data).encode() + b"\0")
    return digest.hexdigest()[:16]


def code_version_of(entries) -> str:
    digest = hashlib.sha256()
    for entry in sorted(entries):
        digest.update(entry.encode() + b"\0" + code_version(entry).encode() + b"\0")
    return digest.hexdigest()[:16]
