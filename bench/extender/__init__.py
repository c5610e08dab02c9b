"""Scheduler-extender latency benchmark: ``python -m bench.extender``."""
