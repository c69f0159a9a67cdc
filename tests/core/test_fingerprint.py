"""The code fingerprint (lmperf.core.fingerprint): a cell's import closure inside lmperf, read with
``ast``, hashed without comments, docstrings or layout, plus the implementations a job's settings
choose by name. Edits are made to a small package of its own or to a copy of src/lmperf."""

from __future__ import annotations

import ast
import os
import shutil
import textwrap
from pathlib import Path

import pytest
from conftest import cpu_grid

from lmperf.core import fingerprint as fp
from lmperf.kinds import grid_module

SRC = fp.DEFAULT_ROOT


def edit(path: Path, text: str) -> None:
    """Write ``text``, its mtime a second on (the parse caches key on mtime and size), and forget
    the versions computed so far."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    os.utime(path, ns=(before + 10**9, before + 10**9))
    fp.code_version.cache_clear()


@pytest.fixture
def package(tmp_path) -> Path:
    """A tiny lmperf: a -> b (absolute, inside a function), b -> sub.c (relative), d alone."""
    root = tmp_path / "lmperf"
    files = {
        "__init__.py": "",
        "a.py": '"""Module a."""\n\ndef f():\n    from lmperf import b  # late import\n    return b.g()\n',
        "b.py": "from .sub import c\n\ndef g():\n    return c.h()\n",
        "sub/__init__.py": "",
        "sub/c.py": "import os\n\ndef h():\n    return os.sep\n",
        "d.py": "X = 1\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_closure_follows_late_relative_and_package_imports(package):
    assert fp.closure("lmperf.a", package) == ["lmperf", "lmperf.a", "lmperf.b", "lmperf.sub", "lmperf.sub.c"]
    assert fp.closure("lmperf.d", package) == ["lmperf", "lmperf.d"]
    with pytest.raises(ValueError, match="no module 'lmperf.nothing'"):
        fp.closure("lmperf.a", package, ("lmperf.nothing",))


def test_comments_docstrings_and_layout_leave_the_version_and_code_changes_it_only_in_the_closure(package):
    a, d = fp.code_version("lmperf.a", package), fp.code_version("lmperf.d", package)
    rewritten = '''\
        """Module a, its docstring rewritten."""


        def f():
            """A new docstring."""
            from lmperf import b   # another comment
            return (b.g())
        '''
    edit(package / "a.py", textwrap.dedent(rewritten))
    edit(package / "sub/c.py", "import os\n\n\n# a comment\ndef h():\n    return os.sep  # same\n")
    assert fp.code_version("lmperf.a", package) == a
    edit(package / "sub/c.py", "import os\n\ndef h():\n    return os.sep + '/'\n")
    assert fp.code_version("lmperf.a", package) != a
    assert fp.code_version("lmperf.d", package) == d


def test_declared_data_files_count_by_content_not_layout(package):
    (package / "tables").mkdir()
    (package / "tables/x.json").write_text('{"a": 1, "b": 2}')
    edit(package / "sub/c.py", 'CODE_DATA = ("../tables/*.json",)\n\ndef h():\n    return 1\n')
    assert [f.name for f in fp.data_files("lmperf.sub.c", package)] == ["x.json"]
    a, d = fp.code_version("lmperf.a", package), fp.code_version("lmperf.d", package)
    edit(package / "tables/x.json", '{\n "b": 2,\n "a": 1\n}\n')  # layout only
    assert fp.code_version("lmperf.a", package) == a
    edit(package / "tables/x.json", '{"a": 1, "b": 3}')
    b = fp.code_version("lmperf.a", package)
    assert b != a and fp.code_version("lmperf.d", package) == d
    edit(package / "tables/y.json", "{}")  # a new table matches the glob
    assert fp.code_version("lmperf.a", package) not in (a, b)


def test_the_normalized_form_is_the_same_on_every_python():
    """ast.dump differs between versions (3.12 adds type_params=[], 3.13 drops empty fields); the
    fingerprint must not, or a GPU machine's Python names the same code differently. Pinned text."""
    tree = ast.parse("def f(x, *, y=2):\n    '''doc'''\n    return x + y  # sum\n")
    assert fp.canonical(fp._strip_docstrings(tree)) == (
        "Module(body=[FunctionDef(name='f', args=arguments(args=[arg(arg='x')], kwonlyargs=[arg(arg='y')], "
        "kw_defaults=[Constant(value=2)]), body=[Return(value=BinOp(left=Name(id='x', ctx=Load()), op=Add(), "
        "right=Name(id='y', ctx=Load())))])])"
    )


def test_a_cells_closure_holds_what_it_runs_and_nothing_of_the_reports():
    closure = set(fp.closure("lmperf.kinds.e2e.cell", SRC))
    # e2e -> model -> attention -> nvtx, at any depth
    assert {"lmperf.model", "lmperf.attention", "lmperf.nvtx", "lmperf.core.record", "lmperf.core.cell"} <= closure
    assert all(fp.module_file(name, SRC) is not None for name in closure)
    assert not [n for n in closure if n.startswith(("lmperf.report", "lmperf.kernels.flash")) or n.endswith(".report")]
    report = set(fp.closure("lmperf.kinds.e2e.report", SRC))
    assert "lmperf.core.record" in report and not {"lmperf.model", "lmperf.kinds.e2e.cell"} & report


def test_chosen_imports_are_real_imports_left_out_of_the_closure():
    for module, chosen in fp.CHOSEN_IMPORTS.items():
        assert set(chosen) <= fp.imports_in_text(module, SRC) - fp.direct_imports(module, SRC), module
    for modules in fp.CHOSEN_BY_NAME.values():
        assert all(fp.module_file(name, SRC) is not None for name in modules)
    assert fp.chosen_modules({"a": {"b": ["plain", "flash"]}}) == tuple(sorted(fp.CHOSEN_BY_NAME["flash"]))
    assert fp.chosen_modules({"attention": "plain", "x": 1}) == ()


def test_an_edit_changes_the_fingerprints_of_exactly_the_jobs_that_run_it(tmp_path):
    """In a copy of src/lmperf, the real CPU grid's jobs: an edit to our Triton forward kernel
    changes the fingerprint of every job whose settings choose ``flash`` and of the flash kind's
    jobs, and no other; an edit to the model changes every whole-model job's and no precision probe's."""
    root = tmp_path / "lmperf"
    shutil.copytree(SRC, root, ignore=shutil.ignore_patterns("__pycache__"))
    grid, kinds = cpu_grid(), ("e2e", "precision", "attention", "flash")
    jobs = [job for kind in kinds for job in grid_module(kind).jobs(grid[kind], "cpu")]

    def fingerprints():
        fp.code_version.cache_clear()
        return {job.name: job.fingerprint(root) for job in jobs}

    before = fingerprints()
    assert before == {job.name: job.fingerprint() for job in jobs}  # the copy is the same code
    kernel = root / "kernels" / "flash" / "triton_forward.py"
    edit(kernel, kernel.read_text() + "\nEDITED = True\n")
    after = fingerprints()
    runs_ours = {job.name for job in jobs if fp.chosen_modules(job.settings) or job.cell.startswith("flash_")}
    assert {name for name in before if after[name] != before[name]} == runs_ours
    assert any(job.cell == "e2e" for job in jobs if job.name in runs_ours)  # attention_compare's flash cell
    assert any(job.cell == "e2e" for job in jobs if job.name not in runs_ours)
    model = root / "model.py"
    edit(model, model.read_text() + "\nEDITED = True\n")
    changed = {name for name, version in fingerprints().items() if version != after[name]}
    assert {job.name for job in jobs if job.cell == "e2e"} <= changed
    assert not {job.name for job in jobs if job.cell == "precision"} & changed
