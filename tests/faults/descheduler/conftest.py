"""The descheduler's stack (real API server and Prometheus over a simulated fleet), reused from the integration
tests."""

from tests.support.descheduler import fleet, scene

__all__ = ["fleet", "scene"]
