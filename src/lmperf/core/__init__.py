"""lmperf.core."""
