"""The event-recorder under faults, on the real API server and Redis: every binding recorded exactly once.

Audited from Redis: each pod UID on exactly one node's set with its event's time, and once in the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from kubernetes_asyncio import client

from crane_annotator.hot import HotValues, RedisBindingTimes
from crane_sandbox.cluster import LocalCluster
from crane_sandbox.rbac import identity
from crane_shared.kube import api_client_from_dict
from crane_shared.policy import default_policy
from crane_shared.redisconn import make_redis
from tests.support.event_recorder_cluster import (
    SCHEMA,
    Binding,
    expected,
    in_process,
    notified,
    report_all,
    running_child,
    stored,
)
from tests.support.faults import FaultReport, FaultRow, StatusProxy, api_host_port, kubeconfig_via, restart_apiserver
from tests.support.sentinel import SentinelGroup
from tests.support.waiting import eventually

NODES = ("node-a", "node-b", "node-c")


def bindings(namespace: str, count: int, start: int = 0) -> list[Binding]:
    return [
        Binding.new(namespace, f"p{i}", NODES[i % len(NODES)], time.time() - 60 + i * 0.01)
        for i in range(start, start + count)
    ]


async def audit(redis: aioredis.Redis, made: Sequence[Binding], row: FaultRow) -> bool:
    """Fill ``row`` from what Redis holds; True when every binding is there exactly once."""
    have, want = await stored(redis), expected(made)
    stream = await notified(redis)
    row.created = len(want)
    row.bound = sum(1 for uid, v in want.items() if have.get(uid) == v)
    row.doubled = len(stream) - len(set(stream))
    row.lost = len(want) - row.bound
    return row.lost == 0 and set(have) == set(want)


async def all_recorded(
    redis: aioredis.Redis,
    made: Sequence[Binding],
    row: FaultRow,
    *,
    since: float,
    timeout: float,
    what: str = "all recorded",
    failover: bool = False,
) -> None:
    """Wait until Redis holds every binding exactly once; the row's recovery counts from ``since`` (monotonic).
    With ``failover``, a connection error (the primary gone, the promotion under way) is one more try."""

    async def check() -> bool:
        try:
            return await audit(redis, made, row)
        except (aioredis.ConnectionError, aioredis.TimeoutError, aioredis.ReadOnlyError):
            if not failover:
                raise
            return False

    await eventually(check, timeout=timeout, what=what)
    row.recovery = round(time.monotonic() - since, 2)


async def test_redis_flushall_is_noticed_and_the_records_restored_by_a_relist(
    kube: client.ApiClient,
    recorder_kube: client.ApiClient,
    redis_url: str,
    redis: aioredis.Redis,
    namespace: str,
    fault_report: FaultReport,
) -> None:
    """Same server, same run_id: only the epoch marker going away tells the recorder its records are gone."""
    made = bindings(namespace, 30)
    row = fault_report.row("Redis FLUSHALL (same server, records lost)")
    async with in_process(recorder_kube, redis_url, namespace) as rec:
        await eventually(rec.recorder.ready)
        await report_all(kube, made)
        await eventually(lambda: audit(redis, made, row), what="first recording")
        run_id = (await redis.info("server"))["run_id"]
        await redis.flushdb()  # FLUSHALL would wipe the other tests' databases of the shared server
        await all_recorded(redis, made, row, since=time.monotonic(), timeout=20, what="records restored")
        assert (await redis.info("server"))["run_id"] == run_id
        assert rec.metric("watch_restarts_total", reason="redis-reset") >= 1
    assert row.doubled == 0


def _lists(request: Any) -> bool:
    return StatusProxy.kind(request) == "list" and "/events" in request.path


def _watches(request: Any) -> bool:
    return StatusProxy.kind(request) == "watch" and "/events" in request.path


@pytest.mark.parametrize("status", [429, 503])
async def test_429_and_503_on_list_and_watch_are_retried_with_backoff_and_lose_nothing(
    cluster: LocalCluster,
    kube: client.ApiClient,
    redis_url: str,
    redis: aioredis.Redis,
    namespace: str,
    status_proxy: StatusProxy,
    fault_report: FaultReport,
    status: int,
) -> None:
    status_proxy.fail(status, _lists, 3)
    api = await api_client_from_dict(
        kubeconfig_via(cluster, status_proxy.url, account=identity(cluster, "event-recorder"))
    )
    made = bindings(namespace, 40)
    row = fault_report.row(f"HTTP {status} on the event-recorder's first 3 lists and 3 watches")
    try:
        await report_all(kube, made[:20])  # before the recorder starts: only a list can find these
        async with in_process(api, redis_url, namespace) as rec:
            started = time.monotonic()
            await eventually(rec.recorder.ready, timeout=30, what="first list through the 429s/503s")
            status_proxy.fail(status, _watches, 3)
            before = dict(status_proxy.seen)
            rec.recorder.relist("test: reopen the watch into the failures")
            await report_all(kube, made[20:])
            await eventually(lambda: status_proxy.injected.get(status) == 6, what="every injected failure hit")
            await all_recorded(redis, made, row, since=started, timeout=30)
            opened = {k: status_proxy.seen[k] - before[k] for k in before}
    finally:
        await api.close()
    assert opened["watch"] + opened["list"] <= 20, f"a tight retry loop: {opened}"
    assert row.doubled == 0 and row.lost == 0


@pytest.mark.slow_fault
async def test_api_server_restart_mid_stream_loses_and_doubles_nothing(
    cluster: LocalCluster,
    kube: client.ApiClient,
    redis_url: str,
    redis: aioredis.Redis,
    namespace: str,
    fault_report: FaultReport,
) -> None:
    made = bindings(namespace, 90)
    row = fault_report.row("API server restart mid-stream (event-recorder process)")
    async with running_child(cluster, redis_url, namespace) as proc:
        await report_all(kube, made[:30])
        restarting = asyncio.create_task(restart_apiserver(cluster, down_for=2.0))
        await restarting
        back = time.monotonic()
        await report_all(kube, made[30:])
        await all_recorded(redis, made, row, since=back, timeout=60)
        assert proc.process.running, "the recorder died"
    assert row.doubled == 0


@pytest.mark.slow_fault
async def test_redis_connection_reset_and_blackholed_lose_nothing(
    cluster: LocalCluster,
    kube: client.ApiClient,
    recorder_kube: client.ApiClient,
    redis_url: str,
    redis: aioredis.Redis,
    namespace: str,
    proxy_to: Callable[..., Any],
    fault_report: FaultReport,
) -> None:
    proxy = await proxy_to(f"127.0.0.1:{cluster.redis.port}")
    via_proxy = f"redis://{proxy.host_port}/{redis_url.rsplit('/', 1)[1]}"
    made = bindings(namespace, 60)
    row = fault_report.row("Redis connection reset, then blackholed 5s (event-recorder)")
    async with in_process(recorder_kube, via_proxy, namespace) as rec:
        await eventually(rec.recorder.ready)
        await report_all(kube, made[:20])
        await eventually(lambda: rec.metric("bindings_recorded_total") == 20)
        await proxy.reset_connections()
        await report_all(kube, made[20:40])
        await asyncio.sleep(1)
        await proxy.heal()
        await proxy.blackhole()
        await report_all(kube, made[40:])
        await asyncio.sleep(5)
        await proxy.heal()
        await all_recorded(redis, made, row, since=time.monotonic(), timeout=60)
    assert row.doubled == 0


@pytest.mark.slow_fault
async def test_kill_9_of_the_event_recorder_mid_stream_loses_and_doubles_nothing(
    cluster: LocalCluster,
    kube: client.ApiClient,
    redis_url: str,
    redis: aioredis.Redis,
    namespace: str,
    fault_report: FaultReport,
) -> None:
    made = bindings(namespace, 90)
    row = fault_report.row("kill -9 of the event-recorder mid-stream, restarted")
    async with running_child(cluster, redis_url, namespace) as proc:
        await report_all(kube, made[:30])
        await proc.process.kill()
        await report_all(kube, made[30:60])  # while it is dead: only the re-list after the restart can find these
        await proc.process.start()
        restarted = time.monotonic()
        await report_all(kube, made[60:])
        await all_recorded(redis, made, row, since=restarted, timeout=60)
    assert row.doubled == 0


@pytest.mark.slow_fault
async def test_added_latency_on_the_api_connection_records_everything_once(
    cluster: LocalCluster,
    kube: client.ApiClient,
    redis_url: str,
    redis: aioredis.Redis,
    namespace: str,
    proxy_to: Callable[..., Any],
    fault_report: FaultReport,
) -> None:
    proxy = await proxy_to(api_host_port(cluster))
    api = await api_client_from_dict(
        kubeconfig_via(cluster, f"https://{proxy.host_port}", account=identity(cluster, "event-recorder"))
    )
    made = bindings(namespace, 40)
    row = fault_report.row("500 ms latency on the event-recorder's API connection")
    try:
        await proxy.latency(500, jitter_ms=200)
        async with in_process(api, redis_url, namespace) as rec:
            await eventually(rec.recorder.ready, timeout=30)
            started = time.monotonic()
            await report_all(kube, made)
            await all_recorded(redis, made, row, since=started, timeout=30)
    finally:
        await api.close()
    assert row.doubled == 0


class MadeTimes:
    """The binding times the test made: what the annotator's hot values must be computed from."""

    def __init__(self, made: Sequence[Binding]) -> None:
        self._made = made

    async def recent(self, nodes: Sequence[str], since: float) -> dict[str, list[float]]:
        return {n: sorted(b.at for b in self._made if b.node == n and b.at > since) for n in nodes}


async def hot_values_right(redis: aioredis.Redis, made: Sequence[Binding]) -> float:
    """When (monotonic) the annotator's hot values, read from ``redis``, first equal those of every binding made."""
    rules = default_policy().hot_value
    actual, expected = HotValues(RedisBindingTimes(redis, SCHEMA), rules), HotValues(MadeTimes(made), rules)
    while True:
        with contextlib.suppress(aioredis.ConnectionError, aioredis.TimeoutError, aioredis.ReadOnlyError):
            got, want = await actual.refresh(NODES), await expected.refresh(NODES)
            if {n: h.value for n, h in got.items()} == {n: h.value for n, h in want.items()}:
                return time.monotonic()
        await asyncio.sleep(0.05)


@pytest.mark.slow_fault
async def test_sentinel_primary_killed_with_unreplicated_writes_the_relist_restores_them(
    kube: client.ApiClient,
    recorder_kube: client.ApiClient,
    run_dir: Path,
    namespace: str,
    proxy_to: Callable[..., Any],
    fault_report: FaultReport,
) -> None:
    """Redis behind Sentinel: replication to the replicas is held (Toxiproxy), the recorder writes 30 bindings
    the primary acknowledges and no replica has, then the primary is SIGKILLed mid-burst. The promoted replica
    lacks them and is another server (another run_id): only the recorder's re-list can bring them back."""
    made = bindings(namespace, 90)
    row = fault_report.row(
        "Redis Sentinel: primary killed with 30 unreplicated writes, replica promoted (event-recorder)"
    )
    async with SentinelGroup(run_dir / f"sentinel-{namespace}", proxy=proxy_to) as group:
        audit_client = make_redis(group.settings())
        replicas = [group.client_of(port) for port in await group.replica_ports()]
        try:
            async with in_process(recorder_kube, group.settings(), namespace) as rec:
                await eventually(rec.recorder.ready, timeout=30)
                await report_all(kube, made[:30])
                await eventually(lambda: audit(audit_client, made[:30], row), what="the first 30 recorded")
                assert await audit_client.wait(group.replicas, 5000) == group.replicas  # ... and replicated
                await group.hold_replication()
                await report_all(kube, made[30:60])
                await eventually(lambda: rec.metric("bindings_recorded_total") == 60, what="60 written")
                for replica in replicas:  # acknowledged by the primary, on no replica
                    assert len(await stored(replica)) == 30, "the writes reached a replica: nothing is at stake"
                burst = asyncio.create_task(report_all(kube, made[60:]))
                killed = await group.kill_primary()
                killed_at = time.monotonic()
                hot_right = asyncio.create_task(hot_values_right(audit_client, made))
                await burst
                await all_recorded(audit_client, made, row, since=killed_at, timeout=90, failover=True)
                hot_seconds = await asyncio.wait_for(hot_right, 30) - killed_at
                assert await group.primary_port() != killed
                relists = rec.metric("watch_restarts_total", reason="redis-reset")
                assert relists >= 1, "the records came back without the recorder's re-list"
                row.note = (
                    f"30 writes lost with the primary, restored by {relists:g} re-list(s); hot values right "
                    f"{hot_seconds:.2f} s after the kill"
                )
        finally:
            await audit_client.aclose()
            for replica in replicas:
                await replica.aclose()
    assert row.doubled == 0 and row.lost == 0
