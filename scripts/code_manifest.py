"""Check that a copy of the working tree runs exactly the code of a commit (for a GPU machine's copy).

``python scripts/code_manifest.py write DIR [COMMIT]`` (in the git checkout) writes DIR/commit and
DIR/manifest.txt: the commit (HEAD unless named) and the git blob id of every file of that commit
under the code paths. Naming an earlier commit lets a grid begun from it go on after commits that
only add records: the check passes as long as no code file changed since.
``python scripts/code_manifest.py check DIR`` (in the copy, git not needed) recomputes the blob ids
of the same paths, and of any code file the manifest does not list, and exits 0 only when they all
match. Provenance may then say ``git_dirty: false`` for that commit (``LMPERF_GIT_COMMIT``,
``LMPERF_GIT_DIRTY``, read by ``lmperf.core.device.git_state``).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

CODE_PATHS = ["src", "workflow", "Snakefile", "config.yaml", "pyproject.toml", "scripts"]


def blob_id(path: Path) -> str:
    """git's object id of a file's content (``git hash-object``), without git."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def code_files(root: Path) -> set[str]:
    """Code files present in a copy (caches and bytecode are not code)."""
    found = set()
    for name in CODE_PATHS:
        top = root / name
        paths = [top] if top.is_file() else top.rglob("*") if top.is_dir() else []
        for p in paths:
            skip = "__pycache__" in p.parts or any(part.endswith(".egg-info") for part in p.parts) or p.suffix == ".pyc"
            if p.is_file() and not skip:
                found.add(p.relative_to(root).as_posix())
    return found


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def write(out: Path, commit: str = "HEAD") -> int:
    try:
        sha = git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").strip()
    except subprocess.CalledProcessError:
        print(f"not a commit here: {commit}", file=sys.stderr)
        return 2
    # `ls-tree -r`: "<mode> blob <id>\t<path>" for every file of the commit under the code paths
    rows = [row.split("\t", 1) for row in git("ls-tree", "-r", sha, "--", *CODE_PATHS).splitlines()]
    lines = [f"{fields.split()[2]} {path}" for fields, path in rows]
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.txt").write_text("\n".join(lines) + "\n")
    (out / "commit").write_text(sha + "\n")
    print(f"{len(lines)} code files of {sha[:12]} in {out}")
    return 0


def check(manifest_dir: Path, root: Path = Path(".")) -> int:
    expected = dict(reversed(line.split(" ", 1)) for line in (manifest_dir / "manifest.txt").read_text().splitlines())
    problems = []
    for path, blob in sorted(expected.items()):
        if not (root / path).is_file():
            problems.append(f"missing: {path}")
        elif blob_id(root / path) != blob:
            problems.append(f"differs: {path}")
    problems += [f"not in the commit: {path}" for path in sorted(code_files(root) - set(expected))]
    commit = (manifest_dir / "commit").read_text().strip()
    for line in problems:
        print(line, file=sys.stderr)
    print(f"code {'matches' if not problems else 'does not match'} commit {commit[:12]} ({len(expected)} files)")
    return 0 if not problems else 1


if __name__ == "__main__":
    if (
        len(sys.argv) not in (3, 4)
        or sys.argv[1] not in ("write", "check")
        or (sys.argv[1] == "check" and len(sys.argv) == 4)
    ):
        sys.exit("usage: code_manifest.py write DIR [COMMIT] | code_manifest.py check DIR")
    verb, folder = sys.argv[1], Path(sys.argv[2])
    sys.exit(write(folder, *sys.argv[3:]) if verb == "write" else check(folder))
