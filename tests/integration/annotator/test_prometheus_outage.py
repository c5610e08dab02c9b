"""Prometheus goes away and comes back: hot values keep flowing, the outage shows in metrics, rounds resume.

A module of its own because it stops this module's Prometheus.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from crane_shared.annotations import decode
from crane_shared.binding_store import BindingStore
from crane_shared.bindings import BindingRecord
from tests.support.annotator import Stack
from tests.support.policy import UPSTREAM_METRICS as METRICS
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


async def stamps(stack: Stack, key: str) -> list[datetime]:
    out = []
    for node in stack.nodes:
        text = (await stack.annotations(node.name)).get(key)
        if text is None:
            return []
        out.append(decode(text).timestamp)
    return out


async def all_after(stack: Stack, key: str, moment: datetime) -> bool:
    found = await stamps(stack, key)
    return bool(found) and min(found) > moment


def _all_after(stack: Stack, key: str, moment: datetime) -> Callable[[], Any]:
    return lambda: all_after(stack, key, moment)


async def test_prometheus_outage_keeps_hot_values_flowing_and_rounds_resume(
    stack: Stack, start_annotator: Callable[..., Any], redis: aioredis.Redis
) -> None:
    # Every node has two recent bindings (hot value 1 by the 1m/2 rule): a non-zero value must be kept fresh
    # while no metric patch carries it (an unchanged 0 never needs rewriting: 0 and stale read the same).
    store = BindingStore(redis)
    now = time.time()
    await store.record(
        [
            BindingRecord(f"{n.name}-{i}", "default", f"{n.name}-{i}", n.name, now, "crane-scheduler")
            for n in stack.nodes
            for i in range(2)
        ],
        stream_maxlen=1000,
    )
    annotator = await start_annotator(
        "--prometheus-timeout",
        "500ms",
        "--prometheus-retries",
        "1",
        "--round-retry-base",
        "1s",
        "--hot-value-interval",
        "1s",
        "--hot-value-max-age",
        "1s",
    )
    started = datetime.now(UTC)
    for metric in METRICS:
        await eventually(_all_after(stack, metric, started), what=f"{metric} written")
    assert await annotator.metric("crane_annotator_prometheus_up") == 1

    await stack.prometheus.stop()
    down_at = datetime.now(UTC)
    try:
        # Non-zero hot values keep being refreshed, and react to bindings made during the outage.
        await eventually(
            lambda: all_after(stack, "node_hot_value", down_at + timedelta(seconds=2)),
            what="hot values refreshed during the outage",
        )
        node = stack.nodes[0].name
        now = time.time()
        burst = [BindingRecord(f"o-{i}", "default", f"o-{i}", node, now, "crane-scheduler") for i in range(4)]
        await store.record(burst, stream_maxlen=1000)

        async def hot_of_node() -> bool:
            text = (await stack.annotations(node)).get("node_hot_value", "")
            return text.startswith("4,")  # floor(6/5) + floor(6/2)

        await eventually(hot_of_node, timeout=5, what="hot value from bindings made during the outage")

        # The outage is visible: Prometheus down, errors counted, staleness and annotation age growing.
        async def outage_visible() -> bool:
            metrics = await annotator.metrics()
            errors = sum(
                v
                for (name, labels), v in metrics.items()
                if name == "crane_annotator_prometheus_errors_total" and ("kind", "connection") in labels
            )
            staleness = metrics.get(("crane_annotator_metric_staleness_seconds", (("metric", "cpu_usage_avg_5m"),)))
            age = metrics.get(("crane_annotator_annotation_age_seconds", (("key", "cpu_usage_avg_5m"),)))
            return (
                metrics.get(("crane_annotator_prometheus_up", ())) == 0
                and errors > 0
                and staleness is not None
                and staleness > 3
                and age is not None
                and age > 3
            )

        await eventually(outage_visible, timeout=15, what="outage visible in /metrics")
        # No metric was rewritten with an invented value meanwhile.
        assert max(await stamps(stack, "cpu_usage_avg_5m")) <= down_at + timedelta(seconds=1)
    finally:
        await stack.prometheus.start()
    up_at = datetime.now(UTC)

    for metric in METRICS:
        await eventually(_all_after(stack, metric, up_at), timeout=20, what=f"{metric} after recovery")
    assert await annotator.metric("crane_annotator_prometheus_up") == 1
    staleness = await annotator.metric("crane_annotator_metric_staleness_seconds", metric="cpu_usage_avg_5m")
    assert staleness is not None and staleness < 5
