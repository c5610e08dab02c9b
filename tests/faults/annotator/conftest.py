"""The annotator test stack (real Prometheus over a simulated fleet, annotators as child processes), reused."""

from tests.support.annotator import stack, start_annotator

__all__ = ["stack", "start_annotator"]
