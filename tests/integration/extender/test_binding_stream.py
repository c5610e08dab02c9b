"""Hot spots in extender mode: bindings announced on the real Redis stream reach the extender's decisions.

kube-scheduler never tells an extender which node it chose; the event-recorder's stream does, within
milliseconds. Here the records are written with ``BindingStore.record`` as the event-recorder writes them, and
the extender is asked over HTTP as kube-scheduler asks it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from prometheus_client import CollectorRegistry

from crane_extender.recent import RecentBindings, follow_bindings
from crane_extender.server import Extender, ExtenderMetrics, make_app
from crane_sandbox.procs import free_port
from crane_shared.annotations import encode_usage
from crane_shared.binding_store import BindingStore
from crane_shared.bindings import BindingRecord
from crane_shared.loadaware.dynamic import DynamicArgs, EstimateArgs, binding_horizon
from crane_shared.policy import default_policy
from tests.support.policy import UPSTREAM_METRICS as METRICS
from tests.support.waiting import eventually


def node(name: str, cpu_usage: float) -> dict[str, Any]:
    """A node annotated a minute ago (as if by the annotator): its hot value knows nothing newer."""
    stamp = datetime.fromtimestamp(time.time() - 60, UTC)
    resources = {"cpu": "10", "memory": "40Gi", "pods": "110"}
    return {
        "metadata": {"name": name, "annotations": {m: encode_usage(cpu_usage, stamp) for m in METRICS}},
        "status": {"allocatable": resources, "capacity": resources},
    }


def pod(uid: str, cpu: str = "100m") -> dict[str, Any]:
    return {
        "metadata": {"name": f"pod-{uid}", "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]},
    }


@pytest.fixture
async def extender_url(redis_url: str) -> AsyncIterator[tuple[str, BindingStore]]:
    args = DynamicArgs(default_policy(), estimate=EstimateArgs(cpu_factor=1.0, memory_factor=1.0))
    redis = aioredis.from_url(redis_url)
    store = BindingStore(redis)
    recent = RecentBindings(binding_horizon(args))
    extender = Extender(args, recent=recent, metrics=ExtenderMetrics.create(CollectorRegistry()))
    app = web.Application()
    app.add_subapp("/extender", make_app(extender))
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    stopping = asyncio.Event()
    follower = asyncio.create_task(follow_bindings(store, recent, stopping, block_ms=200))
    try:
        yield f"http://127.0.0.1:{port}/extender", store
    finally:
        stopping.set()
        await asyncio.wait_for(follower, 5)
        await runner.cleanup()
        await redis.aclose()


async def post(url: str, body: dict[str, Any]) -> Any:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        assert r.status == 200
        return await r.json()


async def bind(store: BindingStore, uid: str, node_name: str) -> None:
    await store.record(
        [BindingRecord(uid, "default", f"pod-{uid}", node_name, time.time(), "default-scheduler")], stream_maxlen=10_000
    )


async def test_a_burst_lowers_the_chosen_nodes_score_before_the_annotator_knows(
    extender_url: tuple[str, BindingStore],
) -> None:
    url, store = extender_url
    nodes = {"Nodes": {"items": [node("a", 0.2), node("b", 0.2)]}}

    async def scores() -> dict[str, int]:
        return {h["Host"]: h["Score"] for h in await post(f"{url}/prioritize", {"Pod": pod("next"), **nodes})}

    assert (await scores())["a"] == (await scores())["b"]
    for uid in ("u1", "u2"):  # two pods bound to a within a minute: hot value +1, as the annotator would say later
        await post(f"{url}/filter", {"Pod": pod(uid), **nodes})
        await bind(store, uid, "a")

    async def a_is_lower() -> bool:
        s = await scores()
        return s["a"] < s["b"]

    await eventually(a_is_lower, 5, "the burst to lower a's score", interval=0.02)


async def test_recently_bound_pods_count_against_the_threshold_until_the_metrics_absorb_them(
    extender_url: tuple[str, BindingStore],
) -> None:
    url, store = extender_url
    nodes = {"Nodes": {"items": [node("a", 0.5), node("b", 0.5)]}}
    big = pod("big", cpu="2")  # 2 of 10 cores: 0.5 + 0.2 > 0.65
    would = "node(s) would have cpu_usage_avg_5m above 0.65"
    # The pod itself would push either node over the threshold (as the in-process plugin decides) ...
    assert (await post(f"{url}/filter", {"Pod": big, **nodes}))["FailedNodes"] == {"a": would, "b": would}
    # ... and once some scheduler binds it anyway, its estimate keeps counting on that node.
    await bind(store, "big", "a")

    async def a_is_full() -> bool:
        result = await post(f"{url}/filter", {"Pod": pod("next"), **nodes})
        return bool(result["FailedNodes"] == {"a": "node(s) had cpu_usage_avg_5m above 0.65"})

    await eventually(a_is_full, 5, "a to fail the filter with the estimate of the pod just bound", interval=0.02)
