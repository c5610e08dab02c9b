"""The one metrics convention: a class per component, instantiated with the registry it registers on.

Nothing is registered at import time: two instances in one process (tests, the in-process benchmarks, a
scheduler with two profiles) each get their own registry, and a metric exists only where a component uses it.
A component's class derives from ``MetricSet``, names its ``prefix`` once, and declares its metrics with
``counter``/``gauge``/``histogram`` in ``__init__``; the service runtime serves that registry on ``/metrics``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import ClassVar

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["Histogram", "MetricSet"]


class Histogram(prometheus_client.Histogram):
    """prometheus_client's histogram, its bucket found by bisection: the library walks the bounds one by one in
    Python, and the scheduler observes several histograms a pod on its critical path (the decision's have 40
    buckets); these observations were 8 % of the scheduling process's instructions per pod. Same buckets, same
    exposition; an exemplar takes the library's own path."""

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        if exemplar is not None:
            super().observe(amount, exemplar)
            return
        self._raise_if_not_observable()  # type: ignore[no-untyped-call]
        self._sum.inc(amount)
        i = bisect_left(self._upper_bounds, amount)  # the last bound is +Inf
        if amount <= self._upper_bounds[i]:  # NaN counts in no bucket, as in the library
            self._buckets[i].inc(1)


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
