"""lmperf.kinds.precision."""
