"""The recorder as operators run it: a child process, killed with SIGKILL, started before Redis is up."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import redis.asyncio as aioredis
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster, RedisServer
from crane_sandbox.procs import free_port
from crane_sandbox.rbac import identity
from tests.support.event_recorder_cluster import Binding, Child, expected, notified, report_events_v1, stored
from tests.support.event_recorder_cluster import child as recorder_child
from tests.support.waiting import eventually

NODES = [f"node-{i}" for i in range(5)]


async def test_kill_9_mid_stream_and_restart_loses_nothing_and_duplicates_nothing(
    cluster: LocalCluster, kube: client.ApiClient, redis: aioredis.Redis, redis_url: str, namespace: str
) -> None:
    total = 400
    bindings = [Binding.new(namespace, f"p{i}", NODES[i % 5], time.time() - 120 + i * 0.1) for i in range(total)]
    recorder = recorder_child(
        identity(cluster, "event-recorder").kubeconfig, redis_url, namespace, cluster.run_dir / "logs"
    )
    await recorder.process.start()
    try:
        await recorder.process.wait_ready(recorder.ready)
        producer = asyncio.create_task(_report_steadily(kube, bindings, per_second=200))
        await eventually(lambda: _count(redis, at_least=100))
        await recorder.process.kill()  # SIGKILL, mid-stream: batches in flight, events not yet read
        killed_with = len(await stored(redis))
        assert killed_with < total, "the kill came too late to test anything"
        await recorder.process.start()
        await producer
        await recorder.process.wait_ready(recorder.ready)
        await eventually(lambda: _count(redis, at_least=total), timeout=30)
        assert await stored(redis) == expected(bindings)
        assert sorted(await notified(redis)) == sorted(b.uid for b in bindings)  # each notified exactly once
    finally:
        await recorder.process.stop()


async def test_not_ready_until_the_first_list_is_in_redis_and_buffered_bindings_flush_when_it_comes(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    port = free_port()  # a Redis that is not there yet
    listed = [Binding.new(namespace, f"listed{i}", NODES[i % 5]) for i in range(5)]
    watched = [Binding.new(namespace, f"watched{i}", NODES[i % 5]) for i in range(5)]
    for b in listed:
        await report_events_v1(kube, b)
    recorder = recorder_child(
        identity(cluster, "event-recorder").kubeconfig, f"redis://127.0.0.1:{port}/0", namespace, tmp_path
    )
    await recorder.process.start()
    late_redis = RedisServer(tmp_path, port=port, movable=False)  # the recorder was given this port
    try:
        await recorder.process.wait_ready(lambda: _alive_and_listed(recorder))
        for b in watched:
            await report_events_v1(kube, b)
        await eventually(lambda: _metric_is(recorder, "buffer_depth", 10))
        assert not await recorder.ready()
        await late_redis.start()
        await eventually(recorder.ready)
        redis = aioredis.from_url(f"redis://127.0.0.1:{port}/0")
        try:
            await eventually(lambda: _matches(redis, listed + watched))
        finally:
            await redis.aclose()
    finally:
        await recorder.process.stop()
        await late_redis.stop()


async def _report_steadily(kube: client.ApiClient, bindings: list[Binding], per_second: float) -> None:
    start = time.monotonic()
    for i, b in enumerate(bindings):
        await asyncio.sleep(max(0.0, start + i / per_second - time.monotonic()))
        await report_events_v1(kube, b)


async def _count(redis: aioredis.Redis, at_least: int) -> bool:
    return len(await stored(redis)) >= at_least


async def _alive_and_listed(recorder: Child) -> bool:
    status, _ = await recorder.get("/healthz")
    return status == 200 and await recorder.metric("lists_total") == 1


async def _metric_is(recorder: Child, name: str, value: float) -> bool:
    with contextlib.suppress(Exception):
        return await recorder.metric(name) == value
    return False


async def _matches(redis: aioredis.Redis, bindings: list[Binding]) -> bool:
    return await stored(redis) == expected(bindings)
