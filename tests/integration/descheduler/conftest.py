"""The descheduler's integration stack (fixtures in ``tests.support.descheduler``, shared with the fault suite)."""

from tests.support.descheduler import fleet, scene

__all__ = ["fleet", "scene"]
