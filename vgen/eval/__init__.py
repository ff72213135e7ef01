"""Evaluation: benchmarks (and, with the eval issue, FID/KID/IS and FVD)."""
