"""The record paths of a device's grid of `all`, in the three target lists of a re-measure sitting.

`bench/grid_run.sh DEVICE DRAIN LIMIT TARGET...` measures the records it is given (deleted from the
working tree first: an existing record is not redone by naming it). A re-measure goes in three
lists (bench/grid_time_notes.md, "The next sittings"):

- ``t1``: the compile job's records and the compiled e2e cells that load its graphs: one call on
  the machine that compiles (the graphs stay on that machine's disk);
- ``t2``: the rest of the course's grid and this project's additions, in drained calls;
- ``t3``: the speed ladder (ladder, gemm_peak, ladder_profile), which reports its time apart.

The lists are read from the device's committed records (every kind of `all`; the scale-out check is
not part of it), so they are the grid as last measured; a grid value changed since is not in them.

    python bench/grid_targets.py h100 .gpu      # writes .gpu/h100_t1, _t2, _t3 and prints their sizes
"""

from __future__ import annotations

import sys
from pathlib import Path

# the report header's split of a grid: the speed ladder's kinds, and the scale-out check (not in `all`)
from lmperf.report.devices import LADDER_KINDS, SCALEOUT_KINDS

ROOT = Path(__file__).resolve().parents[1]


def target_lists(device: str, root: Path = ROOT) -> dict[str, list[str]]:
    """{"t1", "t2", "t3"}: the device's record paths (relative to ``root``), split as the module says."""
    results = root / "results" / device
    if not results.is_dir():
        raise SystemExit(
            f"no results/{device}/ here: which device? ({', '.join(sorted(p.name for p in (root / 'results').iterdir()))})"
        )
    lists: dict[str, list[str]] = {"t1": [], "t2": [], "t3": []}
    for path in sorted(results.glob("*/*.json")):  # records only: the reports' files are not JSON
        kind = path.parent.name
        if kind in SCALEOUT_KINDS:
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
    if len(argv) != 2:
        print("usage: python bench/grid_targets.py DEVICE OUT_DIR", file=sys.stderr)
        return 2
    device, out = argv[0], Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, paths in target_lists(device).items():
        (out / f"{device}_{name}").write_text("".join(p + "\n" for p in paths))
        print(f"{out / f'{device}_{name}'}: {len(paths)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
