"""Learned estimates against the factor estimate on one scale-up (``python -m bench.estimates``)."""
