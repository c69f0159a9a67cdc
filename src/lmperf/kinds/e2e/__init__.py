"""lmperf.kinds.e2e."""
