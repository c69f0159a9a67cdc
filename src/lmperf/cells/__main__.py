"""`python -m lmperf.cells <kind> [args…]`: the one way rules start a cell.

Looks up ``lmperf.cells.<kind>`` and calls its ``main(argv)``. Keeping a single entry point lets
the launcher change (e.g. a pre-imported parent that forks one fresh process per cell) without
touching any rule.
"""

from __future__ import annotations

import importlib
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        print("usage: python -m lmperf.cells <kind> [args…]", file=sys.stderr)
        return 2
    kind, rest = argv[0], argv[1:]
    try:
        module = importlib.import_module(f"lmperf.cells.{kind}")
    except ModuleNotFoundError as error:
        if error.name != f"lmperf.cells.{kind}":
            raise
        print(f"unknown cell kind {kind!r}", file=sys.stderr)
        return 2
    sys.argv = [f"lmperf.cells.{kind}", *rest]
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
