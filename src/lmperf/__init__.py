"""lmperf: reproducible systems measurements of Transformer LMs (CS336 systems, Part 1)."""
