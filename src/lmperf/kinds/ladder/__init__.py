"""lmperf.kinds.ladder."""
