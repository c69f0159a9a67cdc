"""Code versions computed from the code: what a cell or a report runs, read statically.

A job's code version is a hash over the import closure of its entry module inside ``lmperf``
(e.g. ``lmperf.cells.e2e``): every ``lmperf`` module it imports, directly or through others, at
any depth and wherever the import statement sits (inside a function too), plus the packages
(``__init__.py``) on the way. Modules are read with ``ast``, never imported (the workflow stays
free of torch), and hashed in a normalized form: the syntax tree without docstrings, so comments,
docstrings and formatting do not change a version; any change to code does. Data a module reads
as code (tile tables) counts too: a module that assigns ``CODE_DATA = ("tuned/*.json", ...)`` at
its top level adds the files those globs match beside it (JSON hashed by content, not layout).

Some imported code runs only when a caller picks it by name: ``lmperf.attention`` imports our flash
kernels (``lmperf.flash``) inside its ``flash`` choice, and the attention cell, which imports the
kernels' warm-up and product labels (``lmperf.cells.flash_common``, ``lmperf.flash.products``) at its
top, calls them only when its implementation is ``flash``. ``CHOSEN_IMPORTS`` lists such imports
per importing module; they stay out of the closure of whatever imports that module, and a job that
makes the choice names the modules among its ``choices``, whose closures its version adds (the
workflow's ``record_choices``). So a kernel edit re-measures the cells that run the kernels, not
every cell whose model or sweep could. The list lives here, not in the importing module, so that
adding to it changes no cell's code.

Records store the version they were measured with (``provenance.code_version``); the workflow
compares it with the current one to find stale records (workflow/rules/common.smk).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import subprocess
from functools import cache
from pathlib import Path

PACKAGE = "lmperf"
# src/lmperf of this checkout; the workflow passes its own copy's directory explicitly
DEFAULT_ROOT = Path(__file__).resolve().parent


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
    """'lmperf.flash.bench' -> ['lmperf', 'lmperf.flash']: the packages importing it runs first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module name an ``from X import …`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


# {importing module: the lmperf modules whose code it runs only when its caller picks them by name}
CHOSEN_IMPORTS = {
    "lmperf.attention": ("lmperf.flash",),
    "lmperf.cells.attention": ("lmperf.cells.flash_common", "lmperf.flash", "lmperf.flash.products"),
}


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
            # `from lmperf import nvtx`, `from lmperf.flash import bench`: submodules by name
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


@cache
def unchanged_since(commit: str, entry: str, root: Path = DEFAULT_ROOT, choices: tuple[str, ...] = ()) -> bool:
    """Whether every file of ``entry``'s import closure (with ``choices``) is the same in the working
    tree as in git commit ``commit`` (False where git cannot tell: no git, unknown commit).

    A record measured from a clean commit whose closure is unchanged since ran the current code,
    whatever version label its Python wrote (records before versions were Python-independent).
    """
    modules = closure(entry, root, choices)
    files = [str(module_file(name, root)) for name in modules]
    files += [str(f) for name in modules for f in data_files(name, root)]
    try:
        result = subprocess.run(
            ["git", "diff", "--quiet", commit, "--", *files], cwd=root, capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


# Stamps: what an aggregate (tables, figures, sections, report) was made from, kept beside it.
def stamp(version: str, inputs: list[str], extra: str = "") -> dict:
    """The code version, each input file's content digest, and the rule's other settings."""
    files = {}
    for path in sorted(set(map(str, inputs))):
        files[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    return {"code_version": version, "inputs": files, "extra": extra}


def stamp_digest(value: dict) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def read_stamp(path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None  # unreadable: differs from any wanted stamp, so the aggregate reruns


def write_stamp(path, value: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="code versions (show) and aggregate stamps (stamp)")
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show", help="a module's version and import closure")
    show.add_argument("modules", nargs="+")
    show.add_argument(
        "--choose", nargs="*", default=[], metavar="MODULE", help="chosen imports the job makes (e.g. lmperf.flash)"
    )
    make = sub.add_parser("stamp", help="write an aggregate's stamp")
    make.add_argument("--output", required=True)
    make.add_argument("--code-version", required=True)
    make.add_argument("--extra", default="")
    make.add_argument("--inputs", nargs="*", default=[])
    args = parser.parse_args(argv)
    if args.command == "show":
        choices = tuple(args.choose)
        for entry in args.modules:
            print(entry, code_version(entry, choices=choices))
            for name in closure(entry, choices=choices):
                print("   ", name)
    else:
        write_stamp(args.output, stamp(args.code_version, [p for p in args.inputs if p], args.extra))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
