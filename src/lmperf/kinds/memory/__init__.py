"""lmperf.kinds.memory."""
