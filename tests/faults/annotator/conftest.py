"""The annotator test stack (real Prometheus over a simulated fleet, annotators as child processes), reused."""

from tests.integration.annotator.conftest import stack, start_annotator

__all__ = ["stack", "start_annotator"]
