"""mok benchmarks: one script per op (see common.py for the shared helpers)."""
