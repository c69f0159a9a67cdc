"""Code versions read from the code: import closures found statically, hashed without comments,
docstrings or layout (lmperf.core.fingerprint)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from lmperf.core import fingerprint as cv

SRC = Path(cv.__file__).resolve().parent


def test_e2e_cell_closure_holds_what_it_imports_through_the_model():
    closure = set(cv.closure("lmperf.kinds.e2e.cell", SRC))
    # e2e -> model -> attention -> nvtx (the issue: nvtx.py was missing from the hand-kept list)
    assert {
        "lmperf.kinds.e2e.cell",
        "lmperf.model",
        "lmperf.attention",
        "lmperf.nvtx",
        "lmperf.core.record",
        "lmperf.core.device",
        "lmperf.core.timing",
        "lmperf.core.cell",
        "lmperf.cells",
        "lmperf",
    } <= closure
    # every member is a real file of the package, and nothing from the reports
    assert all(cv.module_file(name, SRC) is not None for name in closure)
    assert not any(name.startswith("lmperf.report") for name in closure)


def test_report_closure_reads_records_not_torch_code():
    closure = set(cv.closure("lmperf.kinds.e2e.report", SRC))
    assert {"lmperf.kinds.e2e.report", "lmperf.report.common", "lmperf.core.record", "lmperf.report"} <= closure
    assert "lmperf.model" not in closure and "lmperf.kinds.e2e.cell" not in closure


@pytest.fixture
def package(tmp_path):
    """A tiny lmperf package: a -> b (absolute, inside a function), b -> sub.c (relative), d alone."""
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


def test_closure_follows_late_relative_and_package_imports(package):
    assert cv.closure("lmperf.a", package) == ["lmperf", "lmperf.a", "lmperf.b", "lmperf.sub", "lmperf.sub.c"]
    assert cv.closure("lmperf.d", package) == ["lmperf", "lmperf.d"]


def test_a_chosen_import_counts_only_for_the_jobs_that_choose_it(package, monkeypatch):
    """e picks d by name (CHOSEN_IMPORTS): d is out of e's closure unless chosen, and a change to d
    changes only the versions that choose it, or reach it by a plain import."""
    (package / "e.py").write_text(
        'def pick(name):\n    if name == "d":\n        from lmperf import d\n        return d.X\n'
    )
    (package / "f.py").write_text("from lmperf import e, d\n")  # imports d plainly too
    assert cv.closure("lmperf.e", package) == ["lmperf", "lmperf.d", "lmperf.e"]
    monkeypatch.setattr(cv, "CHOSEN_IMPORTS", {"lmperf.e": ("lmperf.d",)})
    assert cv.closure("lmperf.e", package) == ["lmperf", "lmperf.e"]
    assert cv.closure("lmperf.e", package, ("lmperf.d",)) == ["lmperf", "lmperf.d", "lmperf.e"]
    assert "lmperf.d" in cv.closure("lmperf.f", package)
    versions = {c: cv.code_version("lmperf.e", package, c) for c in ((), ("lmperf.d",))}
    f = cv.code_version("lmperf.f", package)
    assert versions[()] != versions[("lmperf.d",)]
    (package / "d.py").write_text("X = 2\n")
    assert cv.code_version("lmperf.e", package) == versions[()]
    assert cv.code_version("lmperf.e", package, ("lmperf.d",)) != versions[("lmperf.d",)]
    assert cv.code_version("lmperf.f", package) != f
    with pytest.raises(ValueError, match="no module 'lmperf.nothing'"):
        cv.closure("lmperf.e", package, ("lmperf.nothing",))


def test_our_kernels_are_chosen_by_attention_not_imported_by_every_cell():
    # every entry of the list is an import its module really makes, by choice
    for module, chosen in cv.CHOSEN_IMPORTS.items():
        assert set(chosen) <= cv.imports_in_text(module, SRC) - cv.direct_imports(module, SRC)
    assert "lmperf.kernels.flash" not in cv.closure("lmperf.kinds.e2e.cell", SRC)
    assert "lmperf.kernels.flash" in cv.closure("lmperf.kinds.e2e.cell", SRC, ("lmperf.kernels.flash",))
    assert "lmperf.kernels.flash" in cv.closure("lmperf.kinds.flash.benchmark", SRC)  # imports it plainly
    # the attention cell calls the kernels' warm-up and labels only for `flash` (record_choices)
    chosen = ("lmperf.kernels.flash", "lmperf.kinds.flash.common", "lmperf.kernels.flash.products")
    assert not {"lmperf.kernels.flash", "lmperf.kinds.flash.common"} & set(
        cv.closure("lmperf.kinds.attention.cell", SRC)
    )
    assert {"lmperf.kernels.flash.triton_backward", "lmperf.kernels.flash.warm"} <= set(
        cv.closure("lmperf.kinds.attention.cell", SRC, chosen)
    )


def test_comments_docstrings_and_layout_do_not_change_the_version(package):
    before = cv.code_version("lmperf.a", package)
    (package / "a.py").write_text(
        textwrap.dedent('''\
        """Module a, its docstring rewritten."""


        def f():
            """A new docstring."""
            from lmperf import b   # another comment
            return (b.g())
        ''')
    )
    (package / "sub/c.py").write_text("import os\n\n\n# a comment\ndef h():\n    return os.sep  # same\n")
    assert cv.code_version("lmperf.a", package) == before


def test_a_code_change_in_the_closure_changes_the_version_and_only_there(package):
    a, d = cv.code_version("lmperf.a", package), cv.code_version("lmperf.d", package)
    (package / "sub/c.py").write_text("import os\n\ndef h():\n    return os.sep + '/'\n")
    assert cv.code_version("lmperf.a", package) != a
    assert cv.code_version("lmperf.d", package) == d


def test_declared_data_files_count_by_content_not_layout(package):
    (package / "tables").mkdir()
    (package / "tables/x.json").write_text('{"a": 1, "b": 2}')
    (package / "sub/c.py").write_text('CODE_DATA = ("../tables/*.json",)\n\ndef h():\n    return 1\n')
    assert [f.name for f in cv.data_files("lmperf.sub.c", package)] == ["x.json"]
    a, d = cv.code_version("lmperf.a", package), cv.code_version("lmperf.d", package)
    (package / "tables/x.json").write_text('{\n "b": 2,\n "a": 1\n}\n')  # layout only
    assert cv.code_version("lmperf.a", package) == a
    (package / "tables/x.json").write_text('{"a": 1, "b": 3}')
    b = cv.code_version("lmperf.a", package)
    assert b != a and cv.code_version("lmperf.d", package) == d
    (package / "tables/y.json").write_text("{}")  # a new table matches the glob
    assert cv.code_version("lmperf.a", package) not in (a, b)


def test_stamp_records_inputs_by_content(tmp_path):
    record = tmp_path / "r.json"
    record.write_text("{}")
    first = cv.stamp("v1", [str(record)], "x")
    assert first == cv.stamp("v1", [str(record)], "x")
    record.write_text('{"changed": 1}')
    assert cv.stamp("v1", [str(record)], "x") != first
    path = tmp_path / "stamps" / "e2e_report.stamp"
    cv.write_stamp(path, first)
    assert cv.read_stamp(path) == first
    assert cv.read_stamp(tmp_path / "absent.stamp") is None


def test_the_normalized_form_is_the_same_on_every_python():
    """ast.dump differs between versions (3.12 adds type_params=[], 3.13 drops empty fields); the
    version must not, or a GPU machine's Python labels the same code differently. Pinned text."""
    import ast

    tree = ast.parse("def f(x, *, y=2):\n    '''doc'''\n    return x + y  # sum\n")
    assert cv.canonical(cv._strip_docstrings(tree)) == (
        "Module(body=[FunctionDef(name='f', args=arguments(args=[arg(arg='x')], kwonlyargs=[arg(arg='y')], "
        "kw_defaults=[Constant(value=2)]), body=[Return(value=BinOp(left=Name(id='x', ctx=Load()), op=Add(), "
        "right=Name(id='y', ctx=Load())))])])"
    )


def test_unchanged_since_a_commit_compares_the_closure_with_git(package):
    import subprocess

    def git(*args):
        return subprocess.run(["git", *args], cwd=package, capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x", "--allow-empty")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code")
    commit = git("rev-parse", "HEAD")
    cv.unchanged_since.cache_clear()
    assert cv.unchanged_since(commit, "lmperf.a", package)
    (package / "d.py").write_text("X = 2\n")  # outside a's closure
    cv.unchanged_since.cache_clear()
    assert cv.unchanged_since(commit, "lmperf.a", package)
    (package / "sub/c.py").write_text("import os\n\ndef h():\n    return os.sep + '/'\n")
    cv.unchanged_since.cache_clear()
    assert not cv.unchanged_since(commit, "lmperf.a", package)
    assert not cv.unchanged_since("0" * 40, "lmperf.d", package)


def test_show_lists_a_closure_with_or_without_a_choice(capsys):
    cv.main(["show", "lmperf.kinds.e2e.cell"])
    plain = capsys.readouterr().out.split()
    cv.main(["show", "lmperf.kinds.e2e.cell", "--choose", "lmperf.kernels.flash"])
    chosen = capsys.readouterr().out.split()
    assert "lmperf.kernels.flash" not in plain and "lmperf.kernels.flash" in chosen
    assert plain[1] == cv.code_version("lmperf.kinds.e2e.cell", SRC) != chosen[1]
