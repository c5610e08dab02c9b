"""``crane_shared.metrics``' Histogram, Counter and Gauge expose what prometheus_client's own expose for the same
updates (they only find the bucket faster, without a mutex)."""

from __future__ import annotations

import math

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.values import MutexValue

from crane_shared.metrics import Counter, Gauge, Histogram

BOUNDS = (0.001, 0.002, 0.004, 0.008)
VALUES = [0.0, 0.001, 0.0010001, 0.002, 0.003, 0.008, 0.0081, 1e9, -1.0, math.nan, math.inf]


def exposition(cls: type[prometheus_client.Histogram]) -> bytes:
    registry = CollectorRegistry()
    h = cls("h_seconds", "help", ["profile"], buckets=BOUNDS, registry=registry)
    child = h.labels("p")
    for v in VALUES:
        child.observe(v)
    return b"\n".join(line for line in generate_latest(registry).splitlines() if b"_created" not in line)


def test_the_same_buckets_counts_and_sum_as_the_library() -> None:
    ours = exposition(Histogram)
    assert ours == exposition(prometheus_client.Histogram)
    assert b'h_seconds_bucket{le="0.001",profile="p"} 3.0' in ours  # -1, 0 and 0.001 itself (le is inclusive)


def test_counters_and_gauges_without_the_mutex_expose_what_the_library_does() -> None:
    def exposed(counter: type[prometheus_client.Counter], gauge: type[prometheus_client.Gauge]) -> bytes:
        registry = CollectorRegistry()
        c = counter("c", "help", ["result"], registry=registry)
        g = gauge("g", "help", registry=registry)
        for _ in range(3):
            c.labels("ok").inc()
        c.labels("error").inc(2.5)
        g.inc(4)
        g.dec()
        g.inc(0.5)
        return b"\n".join(line for line in generate_latest(registry).splitlines() if b"_created" not in line)

    ours = exposed(Counter, Gauge)
    assert ours == exposed(prometheus_client.Counter, prometheus_client.Gauge)
    assert b'c_total{result="ok"} 3.0' in ours and b"g 3.5" in ours
    assert not isinstance(Counter("x", "help")._value, MutexValue)  # the point of the class
