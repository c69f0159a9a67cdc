"""lmperf.kinds.nsys."""
