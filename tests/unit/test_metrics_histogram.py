"""``crane_shared.metrics.Histogram`` exposes what prometheus_client's own histogram exposes for the same
observations (it only finds the bucket faster)."""

from __future__ import annotations

import math

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest

from crane_shared.metrics import Histogram

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
