"""lmperf.kinds.attention."""
