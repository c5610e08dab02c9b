"""Annotator benchmark: one round at fleet scale against an upstream-style round (``python -m bench.annotator``)."""
