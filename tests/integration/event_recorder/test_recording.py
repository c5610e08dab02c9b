"""The recorder against the real API server and real Redis, run in this process so it can be observed."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from kubernetes_asyncio import client

from crane_event_recorder.source import EventApi
from crane_sandbox.cluster import LocalCluster
from crane_shared.events import micro_time
from crane_shared.informer import ListFn
from tests.support.event_recorder_cluster import (
    Binding,
    expected,
    in_process,
    notified,
    report_core_v1,
    report_events_v1,
    stored,
    whole_second,
)
from tests.support.waiting import eventually


@pytest.mark.parametrize("event_api", [EventApi.EVENTS_V1, EventApi.CORE_V1])
async def test_events_written_through_either_api_are_recorded_once_by_one_watch(
    kube: client.ApiClient,
    recorder_kube: client.ApiClient,
    redis: aioredis.Redis,
    redis_url: str,
    namespace: str,
    event_api: EventApi,
) -> None:
    t = whole_second() - 30
    before = [Binding.new(namespace, "listed-new", "node-a", t), Binding.new(namespace, "listed-old", "node-b", t + 1)]
    after = [Binding.new(namespace, "watched-new", "node-a"), Binding.new(namespace, "watched-old", "node-b", t + 2)]
    await report_events_v1(kube, before[0])
    await report_core_v1(kube, before[1])
    async with in_process(recorder_kube, redis_url, namespace, event_api=event_api) as rec:
        await eventually(rec.recorder.ready)
        await report_events_v1(kube, after[0])
        await report_core_v1(kube, after[1])
        want = expected(before + after)
        await eventually(lambda: _equals(stored(redis), want))
        assert sorted(await notified(redis)) == sorted(want)
        assert rec.metric("bindings_recorded_total") == 4
        assert rec.metric("duplicates_total") == 0


async def test_an_event_updated_five_times_counts_once(
    kube: client.ApiClient, recorder_kube: client.ApiClient, redis: aioredis.Redis, redis_url: str, namespace: str
) -> None:
    new_api = Binding.new(namespace, "p-new", "node-a")
    legacy = Binding.new(namespace, "p-old", "node-b", whole_second() - 10)
    async with in_process(recorder_kube, redis_url, namespace) as rec:
        await eventually(rec.recorder.ready)
        event = await report_events_v1(kube, new_api)
        legacy_name = await report_core_v1(kube, legacy)
        for count in range(2, 7):  # how an event recorder reports a repeat: series / count + lastTimestamp
            event["series"] = {"count": count, "lastObservedTime": micro_time(new_api.at + count)}
            event = await _replace(kube, "events.k8s.io/v1", namespace, event)
            old = await _get(kube, "v1", namespace, legacy_name)
            old["count"] = count
            old["lastTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(legacy.at + count))
            await _replace(kube, "v1", namespace, old)
        await eventually(lambda: rec.metric("duplicates_total") >= 10)
        assert await stored(redis) == expected([new_api, legacy])  # the first report's time is kept
        assert sorted(await notified(redis)) == sorted([new_api.uid, legacy.uid])
        assert rec.metric("bindings_recorded_total") == 2


async def test_a_pod_recreated_with_the_same_name_counts_twice(
    kube: client.ApiClient, recorder_kube: client.ApiClient, redis: aioredis.Redis, redis_url: str, namespace: str
) -> None:
    v1 = client.CoreV1Api(kube)
    pod = {"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c", "image": "pause"}]}}
    async with in_process(recorder_kube, redis_url, namespace) as rec:
        await eventually(rec.recorder.ready)
        first = await v1.create_namespaced_pod(namespace, pod)
        one = Binding(namespace, "web", first.metadata.uid, "node-a", round(time.time(), 6))
        await report_events_v1(kube, one)
        await v1.delete_namespaced_pod("web", namespace, grace_period_seconds=0)
        second = await v1.create_namespaced_pod(namespace, pod)
        two = Binding(namespace, "web", second.metadata.uid, "node-a", round(time.time(), 6))
        await report_events_v1(kube, two)
        assert one.uid != two.uid
        await eventually(lambda: _equals(stored(redis), expected([one, two])))
        assert await notified(redis) == [one.uid, two.uid]


async def test_a_watch_from_a_compacted_resource_version_gets_410_and_relists(
    cluster: LocalCluster,
    kube: client.ApiClient,
    recorder_kube: client.ApiClient,
    redis: aioredis.Redis,
    redis_url: str,
    namespace: str,
) -> None:
    """The first watch starts from resourceVersion 1 after etcd compaction: a real 410 from the API server.

    A binding reported between the list and that watch is only seen again by the re-list the 410 causes.
    """
    listed = Binding.new(namespace, "listed", "node-a")
    missed = Binding.new(namespace, "missed", "node-b")
    later = Binding.new(namespace, "later", "node-a")
    await report_events_v1(kube, listed)
    await _compact_etcd(cluster)

    def stale_first_watch(list_fn: ListFn) -> ListFn:
        watches: list[str] = []

        async def call(**kwargs: Any) -> Any:
            if kwargs.get("watch"):
                watches.append(kwargs["resource_version"])
                if len(watches) == 1:
                    await report_events_v1(kube, missed)
                    kwargs["resource_version"] = "1"
            return await list_fn(**kwargs)

        return call

    async with in_process(recorder_kube, redis_url, namespace, wrap=stale_first_watch) as rec:
        await eventually(lambda: rec.metric("watch_restarts_total", reason="gone") == 1)
        await eventually(lambda: rec.metric("lists_total") == 2)
        await report_events_v1(kube, later)
        await eventually(lambda: _equals(stored(redis), expected([listed, missed, later])))
        assert sorted(await notified(redis)) == sorted([listed.uid, missed.uid, later.uid])


async def test_redis_restarted_mid_stream_loses_nothing(
    cluster: LocalCluster, kube: client.ApiClient, recorder_kube: client.ApiClient, redis_url: str, namespace: str
) -> None:
    """Redis here keeps no data across a restart: bindings from the outage come from the buffer, the ones it
    forgot come back through the re-list the recorder does when it sees a new Redis server."""
    nodes = ["node-a", "node-b", "node-c"]
    bindings = [Binding.new(namespace, f"p{i}", nodes[i % 3], time.time() - 60 + i * 0.5) for i in range(60)]
    async with in_process(recorder_kube, redis_url, namespace) as rec:
        await eventually(rec.recorder.ready)
        for b in bindings[:20]:
            await report_events_v1(kube, b)
        await eventually(lambda: rec.metric("bindings_recorded_total") == 20)
        await cluster.redis.stop()
        try:
            for b in bindings[20:40]:
                await report_events_v1(kube, b)
            await eventually(lambda: rec.metric("buffer_depth") == 20 and rec.metric("redis_errors_total") > 0)
        finally:
            await cluster.redis.start()
        for b in bindings[40:]:
            await report_events_v1(kube, b)
        redis = aioredis.from_url(redis_url)
        try:
            await eventually(lambda: _equals(stored(redis), expected(bindings)), timeout=30)
            assert sorted(await notified(redis)) == sorted(b.uid for b in bindings)
        finally:
            await redis.aclose()
        assert rec.metric("watch_restarts_total", reason="redis-reset") >= 1
        assert rec.metric("buffer_dropped_total") == 0


async def _equals(actual: Any, want: dict[str, tuple[str, float]]) -> bool:
    return bool(await actual == want)


async def _compact_etcd(cluster: LocalCluster) -> None:
    """Compact etcd history up to now, as the API server does every 5 minutes."""
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{cluster.etcd.url}/v3/kv/range", json={"key": "AA=="}) as r:
            revision = (await r.json())["header"]["revision"]
        async with s.post(f"{cluster.etcd.url}/v3/kv/compaction", json={"revision": revision, "physical": True}) as r:
            assert r.status == 200, await r.text()


def _api(kube: client.ApiClient, api: str) -> Any:
    return client.CoreV1Api(kube) if api == "v1" else client.EventsV1Api(kube)


async def _get(kube: client.ApiClient, api: str, namespace: str, name: str) -> dict[str, Any]:
    return await _json(await _api(kube, api).read_namespaced_event(name, namespace, _preload_content=False))


async def _replace(kube: client.ApiClient, api: str, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
    name = event["metadata"]["name"]
    return await _json(await _api(kube, api).replace_namespaced_event(name, namespace, event, _preload_content=False))


async def _json(resp: Any) -> dict[str, Any]:
    assert 200 <= resp.status < 300, await resp.text()
    result: dict[str, Any] = await resp.json()
    return result


async def test_records_older_than_the_retention_are_trimmed(
    kube: client.ApiClient, recorder_kube: client.ApiClient, redis: aioredis.Redis, redis_url: str, namespace: str
) -> None:
    ageing = Binding.new(namespace, "ageing", "node-a", time.time() - 6)  # within a 10 s retention, for 4 s
    fresh = Binding.new(namespace, "fresh", "node-b")
    async with in_process(recorder_kube, redis_url, namespace, retention=10.0, trim_interval=0.1) as rec:
        await eventually(rec.recorder.ready)
        await report_events_v1(kube, ageing)
        await report_events_v1(kube, fresh)
        await eventually(lambda: _equals(stored(redis), expected([ageing, fresh])))
        await eventually(lambda: _equals(stored(redis), expected([fresh])), timeout=10)
        assert rec.metric("trimmed_total") == 1
