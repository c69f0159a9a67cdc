"""The record paths of a device's grid of `all`, in the three target lists of a re-measure sitting.

`bench/grid_run.sh DEVICE DRAIN LIMIT TARGET...` measures the records it is given (deleted from the
working tree first: an existing record is not redone by naming it). A re-measure goes in three
lists (bench/grid_time_notes.md, "The next sittings"):

- ``t1``: the compile job's records and the compiled e2e cells that load its graphs: one call on
  the machine that compiles (the graphs stay on that machine's disk);
- ``t2``: the rest of the course's grid and this project's additions, in drained calls;
- ``t3``: the speed ladder (ladder, gemm_peak, ladder_profile), which reports its time apart.

The lists are read from the device's records (every kind of `all`; the scale-out check is not part of
it): those in the working tree and those git tracks that are missing from it (deleted to be
measured, and not measured yet), so they are the grid as last committed; a grid value changed since
is not in them.

    python bench/grid_targets.py h100 .gpu      # writes .gpu/h100_t1, _t2, _t3 and prints their sizes
    python bench/grid_targets.py h200 .gpu --done b33cbba   # only the records a sitting of b33cbba left

A grid measured over several sittings from one commit goes on with ``--done COMMIT``: records that
commit already measured from a clean tree (``provenance.git_commit`` starting with COMMIT,
``git_dirty`` false) are left out of the lists, so deleting the listed records and measuring them
finishes the grid without measuring anything twice. A record still missing (deleted, and a drained
call did not reach it) is listed again, so the lists can be rewritten between calls.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

# the report header's split of a grid: the speed ladder's kinds, and the scale-out check (not in `all`)
from lmperf.report.devices import LADDER_KINDS, SCALEOUT_KINDS

ROOT = Path(__file__).resolve().parents[1]


def measured_by(path: Path, commit: str) -> bool:
    """Whether the record at ``path`` was measured from a clean tree of ``commit`` (a prefix of its hash)."""
    provenance = json.loads(path.read_text()).get("provenance") or {}
    return str(provenance.get("git_commit", "")).startswith(commit) and provenance.get("git_dirty") is False


def record_paths(results: Path, root: Path) -> list[Path]:
    """The records under ``results`` (``results/<device>``): the JSON files of its kinds' folders, and
    the ones git tracks there that the working tree lacks (none outside a git checkout)."""
    paths = set(results.glob("*/*.json"))  # records only: the reports' files are not JSON
    try:
        tracked = subprocess.run(
            ["git", "-C", str(root), "ls-files", "--", str(results.relative_to(root))],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:  # no git here
        return sorted(paths)
    if tracked.returncode == 0:
        for line in tracked.stdout.splitlines():
            path = root / line
            if path.suffix == ".json" and path.parent.parent == results:
                paths.add(path)
    return sorted(paths)


def target_lists(device: str, root: Path = ROOT, done: str | None = None) -> dict[str, list[str]]:
    """{"t1", "t2", "t3"}: the device's record paths (relative to ``root``), split as the module says;
    with ``done``, leaving out the records that commit already measured (see the module's docstring)."""
    results = root / "results" / device
    if not results.is_dir():
        raise SystemExit(
            f"no results/{device}/ here: which device? ({', '.join(sorted(p.name for p in (root / 'results').iterdir()))})"
        )
    lists: dict[str, list[str]] = {"t1": [], "t2": [], "t3": []}
    for path in record_paths(results, root):
        kind = path.parent.name
        if kind in SCALEOUT_KINDS:
            continue
        if done and path.exists() and measured_by(path, done):
            continue
        rel = str(path.relative_to(root))
        if kind == "e2e_compile" or (kind == "e2e" and "_compiled_" in path.name):
            lists["t1"].append(rel)
        elif kind in LADDER_KINDS:
            lists["t3"].append(rel)
        else:
            lists["t2"].append(rel)
    return lists


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device", help="the slug under results/, e.g. h100")
    parser.add_argument("out", type=Path, help="folder for the lists DEVICE_t1, DEVICE_t2, DEVICE_t3")
    parser.add_argument("--done", metavar="COMMIT", help="leave out records this commit measured from a clean tree")
    args = parser.parse_args(argv)
    if args.done is not None and not re.fullmatch(r"[0-9a-f]{7,40}", args.done):
        parser.error(f"--done {args.done!r}: give 7 to 40 lowercase hex digits of the commit")
    args.out.mkdir(parents=True, exist_ok=True)
    for name, paths in target_lists(args.device, done=args.done).items():
        (args.out / f"{args.device}_{name}").write_text("".join(p + "\n" for p in paths))
        print(f"{args.out / f'{args.device}_{name}'}: {len(paths)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
