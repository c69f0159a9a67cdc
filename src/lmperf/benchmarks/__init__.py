"""Measuring harnesses that sit above the kernels and the model (kernels never import these)."""
