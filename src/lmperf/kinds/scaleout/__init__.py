"""lmperf.kinds.scaleout."""
