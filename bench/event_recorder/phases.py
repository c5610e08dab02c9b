"""The benchmark phases. Each returns plain numbers; ``__main__`` prints them."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from crane_event_recorder.app import redis_run_id
from crane_event_recorder.metrics import RecorderMetrics
from crane_event_recorder.parse import parse_event
from crane_event_recorder.recorder import Recorder
from crane_event_recorder.settings import RecorderSettings
from crane_event_recorder.source import EventApi, event_list_function
from crane_sandbox.cluster import LocalCluster
from crane_shared.binding_store import BindingStore
from crane_shared.bindings import BindingSchema
from crane_shared.events import scheduled_event
from crane_shared.informer import ListFn
from crane_shared.kube import api_client_from_dict
from crane_shared.redisconn import make_redis

from .feed import QueueFeed, watch_line

SCHEMA = BindingSchema("bench")


def nodes(count: int) -> list[str]:
    return [f"node-{i:04d}" for i in range(count)]


# --- running the recorder in this process -------------------------------------------------------------------------


@dataclass
class Running:
    recorder: Recorder
    registry: CollectorRegistry
    store: BindingStore

    def recorded(self) -> int:
        return int(self.registry.get_sample_value("crane_event_recorder_bindings_recorded_total") or 0)

    def lag_quantile(self, q: float) -> float:
        """Upper bucket bound below which ``q`` of the record lags fall."""
        total = self.registry.get_sample_value("crane_event_recorder_record_lag_seconds_count") or 0
        for metric in self.registry.collect():
            if metric.name != "crane_event_recorder_record_lag_seconds":
                continue
            for sample in metric.samples:
                if sample.name.endswith("_bucket") and sample.value >= q * total:
                    return float(sample.labels["le"])
        return float("nan")


@contextlib.asynccontextmanager
async def recorder(redis_url: str, list_fn: ListFn, **overrides: Any) -> AsyncIterator[Running]:
    settings = replace(RecorderSettings(redis_check_interval=1.0), **overrides)
    redis = make_redis(redis_url)
    store = BindingStore(redis, SCHEMA)
    registry = CollectorRegistry()
    rec = Recorder(
        store, {"bench": list_fn}, RecorderMetrics(registry), settings, redis_server_id=lambda: redis_run_id(redis)
    )
    stopping = asyncio.Event()
    tasks = [asyncio.create_task(w) for w in rec.workers(stopping)]
    try:
        await wait_for(rec.ready, 30)
        yield Running(rec, registry, store)
    finally:
        stopping.set()
        _, pending = await asyncio.wait(tasks, timeout=10)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await redis.aclose()


async def wait_for(condition: Callable[[], bool], timeout: float, interval: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


async def flush(redis_url: str) -> None:
    redis = aioredis.from_url(redis_url)
    await redis.flushdb()
    await redis.aclose()


# --- phase: synthetic feed ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyntheticResult:
    events: int
    parse_per_second: float  # watch line -> BindingRecord, CPU only
    record_per_second: float  # watch line -> in Redis, whole path
    lag_p50: float
    lag_p99: float


async def synthetic(redis_url: str, events: int, node_count: int) -> SyntheticResult:
    names = nodes(node_count)
    now = time.time()
    lines = [
        watch_line("bench", f"p{i}", str(uuid.uuid4()), names[i % node_count], now - 1 + i / events, 1000 + i)
        for i in range(events)
    ]
    started = time.perf_counter()
    for line in lines:
        parse_event(json.loads(line)["object"])
    parse_rate = events / (time.perf_counter() - started)

    await flush(redis_url)
    feed = QueueFeed()
    async with recorder(redis_url, feed) as running:
        started = time.perf_counter()
        for line in lines:
            feed.lines.put_nowait(line)
        await wait_for(lambda: running.recorded() >= events, 600)
        rate = events / (time.perf_counter() - started)
        return SyntheticResult(events, parse_rate, rate, running.lag_quantile(0.5), running.lag_quantile(0.99))


# --- phase: real watch ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WatchResult:
    events: int
    create_per_second: float  # accepted by the API server
    record_per_second: float  # first create -> last binding in Redis
    tail_seconds: float  # last create accepted -> last binding in Redis
    lag_p50: float
    lag_p99: float


class Producer:
    """Creates Scheduled events through the API server with ``concurrency`` requests in flight."""

    def __init__(self, api: client.ApiClient, namespace: str, node_names: list[str], concurrency: int) -> None:
        self._events = client.EventsV1Api(api)
        self._namespace = namespace
        self._nodes = node_names
        self._concurrency = concurrency
        self.created: list[tuple[str, str, float]] = []  # (uid, node, at) in acceptance order

    async def create(self, index: int, at: float | None = None) -> None:
        uid = str(uuid.uuid4())
        node = self._nodes[index % len(self._nodes)]
        at = round(time.time() if at is None else at, 6)
        body = scheduled_event(
            namespace=self._namespace,
            pod=f"p{index}",
            pod_uid=uid,
            node=node,
            scheduler="crane-scheduler",
            instance="bench",
            at=at,
        )
        for attempt in range(10):
            resp = await self._events.create_namespaced_event(self._namespace, body, _preload_content=False)
            status = resp.status
            resp.release()
            if status == 201:
                self.created.append((uid, node, at))
                return
            await asyncio.sleep(0.05 * (attempt + 1))
        raise RuntimeError(f"event create kept failing with HTTP {status}")

    async def burst(self, count: int) -> None:
        """As fast as the API server accepts."""
        counter = iter(range(count))

        async def worker() -> None:
            for index in counter:
                await self.create(index)

        await asyncio.gather(*(worker() for _ in range(self._concurrency)))


async def bench_api(cluster: LocalCluster, concurrency: int) -> client.ApiClient:
    return await api_client_from_dict(cluster.kubeconfig_dict(), qps=0, burst=max(100, concurrency * 2))


async def real_watch(
    cluster: LocalCluster, redis_url: str, events: int, node_count: int, concurrency: int
) -> WatchResult:
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    api = await bench_api(cluster, concurrency)
    try:
        await client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
        await flush(redis_url)
        async with recorder(redis_url, event_list_function(api, EventApi.EVENTS_V1, namespace)) as running:
            producer = Producer(api, namespace, nodes(node_count), concurrency)
            started = time.perf_counter()
            await producer.burst(events)
            created_at = time.perf_counter()
            await wait_for(lambda: running.recorded() >= events, 600)
            done = time.perf_counter()
        return WatchResult(
            events,
            events / (created_at - started),
            events / (done - started),
            done - created_at,
            running.lag_quantile(0.5),
            running.lag_quantile(0.99),
        )
    finally:
        await client.CoreV1Api(api).delete_namespace(namespace)
        await api.close()


# --- phase: sustained rate, windows checked against the truth -------------------------------------------------------


@dataclass(frozen=True)
class SustainResult:
    source: str
    seconds: float
    target_per_second: float
    achieved_per_second: float
    bindings: int
    checks: int
    mismatches: int
    max_window_count: int  # largest true count of one window on one node... summed over nodes, 5m window
    upstream_kept: int  # what upstream's 1024-entry heap could hold of that


WINDOWS = (timedelta(minutes=1), timedelta(minutes=5))


async def sustain(
    cluster: LocalCluster,
    redis_url: str,
    *,
    seconds: float,
    rate: float,
    node_count: int,
    check_every: float,
    use_watch: bool,
    concurrency: int,
) -> SustainResult:
    """Feed ``rate`` bindings/s for ``seconds``; every ``check_every`` s pause the feed, wait until everything fed
    is in Redis, and compare each node's hot-value window counts with the counts computed from what was fed."""
    names = nodes(node_count)
    fed: list[tuple[str, str, float]] = []
    await flush(redis_url)
    api = await bench_api(cluster, concurrency) if use_watch else None
    namespace = f"sustain-{uuid.uuid4().hex[:6]}"
    try:
        if api is not None:
            await client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
            list_fn: ListFn = event_list_function(api, EventApi.EVENTS_V1, namespace)
            producer = Producer(api, namespace, names, concurrency)
            fed = producer.created
        else:
            queue_feed = QueueFeed()
            list_fn = queue_feed
        async with recorder(redis_url, list_fn) as running:
            gate = asyncio.Event()
            gate.set()
            in_flight: set[asyncio.Task[None]] = set()
            rng = random.Random(7)

            async def emit(index: int) -> None:
                if api is not None:
                    task = asyncio.create_task(producer.create(index))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                else:
                    uid, node, at = str(uuid.uuid4()), rng.choice(names), round(time.time(), 6)
                    fed.append((uid, node, at))
                    queue_feed.lines.put_nowait(watch_line("bench", f"p{index}", uid, node, at, 1000 + index))

            async def feed() -> int:
                start = time.monotonic()
                index = 0
                while (elapsed := time.monotonic() - start) < seconds:
                    await gate.wait()
                    due = min(int(elapsed * rate), int(seconds * rate))
                    while index < due:
                        await emit(index)
                        index += 1
                    await asyncio.sleep(0.005)
                return index

            feeder = asyncio.create_task(feed())
            started = time.monotonic()
            checks = mismatches = 0
            max_count = 0
            while not feeder.done():
                await asyncio.wait({feeder}, timeout=check_every)
                gate.clear()
                if in_flight:
                    await asyncio.wait(set(in_flight))
                await wait_for(lambda: running.recorded() >= len(fed), 120)
                now = time.time()
                truth = _window_counts(fed, names, now)
                got = await running.store.count_in_windows(names, WINDOWS, now)
                checks += 1
                if got != truth:
                    mismatches += 1
                    bad = [n for n in names if got[n] != truth[n]][:3]
                    print(f"  window mismatch at {now:.3f}: {[(n, got[n], truth[n]) for n in bad]}")
                max_count = max(max_count, sum(counts[WINDOWS[-1]] for counts in truth.values()))
                gate.set()
            total = await feeder
            elapsed = time.monotonic() - started
        return SustainResult(
            "watch" if use_watch else "synthetic",
            elapsed,
            rate,
            total / elapsed,
            total,
            checks,
            mismatches,
            max_count,
            min(1024, max_count),
        )
    finally:
        if api is not None:
            await client.CoreV1Api(api).delete_namespace(namespace)
            await api.close()


def _window_counts(fed: list[tuple[str, str, float]], names: list[str], now: float) -> dict[str, dict[timedelta, int]]:
    """Bindings strictly after ``now - window`` per node: the truth the store must match."""
    times: dict[str, list[float]] = {node: [] for node in names}
    for _, node, at in fed:
        times[node].append(at)
    counts: dict[str, dict[timedelta, int]] = {}
    for node, ats in times.items():
        ats.sort()
        counts[node] = {w: len(ats) - bisect.bisect_right(ats, now - w.total_seconds()) for w in WINDOWS}
    return counts
