"""The annotator's integration stack (fixtures in ``tests.support.annotator``, shared with the fault suite)."""

from tests.support.annotator import stack, start_annotator

__all__ = ["stack", "start_annotator"]
