"""lmperf.kinds.flash."""
