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
from prometheus_client import CollectorRegistry
from prometheus_client.samples import Exemplar

__all__ = ["Counter", "Gauge", "Histogram", "LoopValue", "MetricSet"]


class LoopValue:
    """A metric's value without prometheus_client's mutex: the services are asyncio programs whose metrics are
    written from their event loop's one thread (a read from another, a scrape, sees a whole float). The lock's
    acquire and release were a third of each increment, and the scheduler makes about 20 a pod on its critical
    path. Same interface as the library's ``MutexValue`` (its ``ValueClass`` outside multiprocess mode)."""

    __slots__ = ("_exemplar", "_value")
    _multiprocess = False

    def __init__(self, *args: object, **kwargs: object) -> None:
        self._value = 0.0
        self._exemplar: Exemplar | None = None

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self._value = value

    def set_exemplar(self, exemplar: Exemplar) -> None:
        self._exemplar = exemplar

    def get(self) -> float:
        return self._value

    def get_exemplar(self) -> Exemplar | None:
        return self._exemplar


class Counter(prometheus_client.Counter):
    """prometheus_client's counter on a ``LoopValue``."""

    def _metric_init(self) -> None:
        super()._metric_init()
        self._value = LoopValue()


class Gauge(prometheus_client.Gauge):
    """prometheus_client's gauge on a ``LoopValue``."""

    def _metric_init(self) -> None:
        super()._metric_init()
        self._value = LoopValue()


class Histogram(prometheus_client.Histogram):
    """prometheus_client's histogram on ``LoopValue``s, its bucket found by bisection: the library walks the bounds
    one by one in Python, and the scheduler observes several histograms a pod on its critical path (the decision's
    have 40 buckets); these observations were 8 % of the scheduling process's instructions per pod. Same buckets,
    same exposition; an exemplar takes the library's own path."""

    def _metric_init(self) -> None:
        super()._metric_init()
        self._sum = LoopValue()
        self._buckets = [LoopValue() for _ in self._upper_bounds]

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        if exemplar is not None:
            super().observe(amount, exemplar)
            return
        if self._labelnames and not self._labelvalues:
            self._raise_if_not_observable()  # type: ignore[no-untyped-call]
        self._sum._value += amount
        i = bisect_left(self._upper_bounds, amount)  # the last bound is +Inf
        if amount <= self._upper_bounds[i]:  # NaN counts in no bucket, as in the library
            self._buckets[i]._value += 1


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
