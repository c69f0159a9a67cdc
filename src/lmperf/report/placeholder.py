"""Outputs of a report rule whose kind has no record on this device yet (report-only mode).

``python -m lmperf.report.placeholder --kind nsys --device h100 --outputs …`` writes, for each
output, a section saying nothing was measured and how to measure it, an image saying the same, or
an empty table, so that the device's report still builds and lists the missing cells in its header.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lmperf.report.common import empty_figure, write_text


def message(kind: str, device: str) -> str:
    return (
        f"No `{kind}` records on `{device}` yet: `snakemake --cores 1 all` on that device measures them "
        "(the report's header lists the missing cells)."
    )


def write_placeholder(path: Path, kind: str, device: str) -> None:
    text = message(kind, device)
    if path.suffix == ".md":
        write_text(path, f"_{text}_\n")
    elif path.suffix == ".png":
        empty_figure(path, text)
    elif path.suffix == ".csv":
        write_text(path, "")
    else:
        raise ValueError(f"no placeholder for {path} (a .md, .png or .csv output)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--outputs", nargs="+", required=True, type=Path)
    args = p.parse_args(argv)
    for path in args.outputs:
        if path.suffix != ".stamp":  # the rule writes its stamp after this command
            write_placeholder(path, args.kind, args.device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
