"""Benchmarks: each subpackage runs as ``python -m bench.<name>``."""
