"""Tables of the memory report: estimates print with their interval, and unstable ones are marked."""

from __future__ import annotations

from lmperf.core import stats
from lmperf.core.stats import Estimate
from lmperf.kinds.memory import tables, text


def test_an_estimate_prints_alone_or_with_its_interval_and_mark():
    assert tables.gib_estimate(Estimate(1024.0)) == "1.00"
    tight = Estimate(1024.0, 1019.0, 1029.0, 3, "range")
    wide_by = 1024.0 * stats.UNSTABLE_WIDTH  # an interval wider than the unstable width
    wide = Estimate(1024.0, 1024.0 - wide_by, 1024.0 + wide_by, 3, "range")
    assert tables.gib_estimate(tight) == "1.00 [1.00, 1.00]"
    assert tables.gib_estimate(wide).endswith(tables.UNSTABLE_MARK)
    assert text.unstable_note(tables.gib_estimate(tight)) == ""
    assert text.unstable_note(tables.gib_estimate(wide)).startswith(f"{tables.UNSTABLE_MARK} unstable")
