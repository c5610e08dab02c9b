"""The one metrics convention: a class per component, instantiated with the registry it registers on.

Nothing is registered at import time: two instances in one process (tests, the in-process benchmarks, a
scheduler with two profiles) each get their own registry, and a metric exists only where a component uses it.
A component's class derives from ``MetricSet``, names its ``prefix`` once, and declares its metrics with
``counter``/``gauge``/``histogram`` in ``__init__``; the service runtime serves that registry on ``/metrics``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["MetricSet"]


class MetricSet:
    prefix: ClassVar[str] = ""
    """prepended to every name, e.g. ``crane_event_recorder_``"""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(self.prefix + name, documentation, labels, registry=self.registry)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(self.prefix + name, documentation, labels, registry=self.registry)

    def histogram(
        self, name: str, documentation: str, labels: Sequence[str] = (), *, buckets: Sequence[float] | None = None
    ) -> Histogram:
        if buckets is None:
            return Histogram(self.prefix + name, documentation, labels, registry=self.registry)
        return Histogram(self.prefix + name, documentation, labels, registry=self.registry, buckets=buckets)
