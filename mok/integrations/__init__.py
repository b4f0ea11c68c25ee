"""Adapters that put mok's kernels under other libraries' MoE modules."""
