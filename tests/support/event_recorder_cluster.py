"""Helpers for the recorder's integration tests: write events, run the recorder, read what Redis holds."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from crane_event_recorder.app import redis_run_id
from crane_event_recorder.metrics import RecorderMetrics
from crane_event_recorder.recorder import Recorder
from crane_event_recorder.settings import RecorderSettings
from crane_event_recorder.source import EventApi, event_list_function, scope_name
from crane_sandbox.cluster import LocalCluster
from crane_sandbox.procs import ManagedProcess, free_port, service_argv
from crane_sandbox.rbac import identity
from crane_shared.binding_store import BindingStore
from crane_shared.bindings import STREAM_FIELD, BindingSchema, unpack
from crane_shared.events import scheduled_event
from crane_shared.informer import ListFn
from crane_shared.redisconn import make_redis
from crane_shared.settings import RedisSettings

SCHEMA = BindingSchema("crane")


@dataclass(frozen=True)
class Binding:
    """One binding a test reports through an Event, and what the recorder must store for it."""

    namespace: str
    pod: str
    uid: str
    node: str
    at: float

    @staticmethod
    def new(namespace: str, pod: str, node: str, at: float | None = None) -> Binding:
        # Whole microseconds: what an Event's MicroTime can carry.
        moment = round(time.time() if at is None else at, 6)
        return Binding(namespace, pod, str(uuid.uuid4()), node, moment)


async def report_events_v1(kube: client.ApiClient, b: Binding) -> dict[str, Any]:
    """Through events.k8s.io/v1, exactly as kube-scheduler does it; returns the created object as JSON."""
    body = scheduled_event(
        namespace=b.namespace,
        pod=b.pod,
        pod_uid=b.uid,
        node=b.node,
        scheduler="crane-scheduler",
        instance="test",
        at=b.at,
    )
    resp = await client.EventsV1Api(kube).create_namespaced_event(b.namespace, body, _preload_content=False)
    assert resp.status == 201, await resp.text()
    created: dict[str, Any] = await resp.json()
    return created


async def report_core_v1(kube: client.ApiClient, b: Binding, name: str | None = None) -> str:
    """Through core/v1 the legacy way: no eventTime, whole-second timestamps (so ``b.at`` must be whole)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(b.at))
    name = name or f"{b.pod}.{uuid.uuid4().hex[:12]}"
    await client.CoreV1Api(kube).create_namespaced_event(
        b.namespace,
        {
            "metadata": {"name": name},
            "involvedObject": {"kind": "Pod", "namespace": b.namespace, "name": b.pod, "uid": b.uid},
            "reason": "Scheduled",
            "type": "Normal",
            "message": f"Successfully assigned {b.namespace}/{b.pod} to {b.node}",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "source": {"component": "default-scheduler"},
        },
    )
    return name


async def report_all(kube: client.ApiClient, bindings: Iterable[Binding]) -> None:
    """``report_events_v1`` for each binding, in order."""
    for b in bindings:
        await report_events_v1(kube, b)


def whole_second(at: float | None = None) -> float:
    return float(int(time.time() if at is None else at))


# --- what Redis holds ------------------------------------------------------------------------------------------


async def stored(redis: aioredis.Redis) -> dict[str, tuple[str, float]]:
    """pod UID -> (node, bound_at) over every node; fails if a UID is on two nodes."""
    result: dict[str, tuple[str, float]] = {}
    store = BindingStore(redis, SCHEMA)
    for node in await store.nodes():
        members: Any = await redis.zrange(SCHEMA.node_key(node), 0, -1, withscores=True)
        for member, score in members:
            uid = member.decode()
            assert uid not in result, f"{uid} recorded on {result[uid][0]} and {node}"
            result[uid] = (node, float(score))
    return result


async def notified(redis: aioredis.Redis) -> list[str]:
    """Pod UIDs of the notification stream, in order (duplicates kept: there must be none)."""
    entries: Any = await redis.xrange(SCHEMA.stream_key, "-", "+")
    return [unpack(fields[STREAM_FIELD.encode()]).uid for _, fields in entries]


def expected(bindings: Sequence[Binding]) -> dict[str, tuple[str, float]]:
    return {b.uid: (b.node, b.at) for b in bindings}


# --- the recorder in this process (observable, injectable) ------------------------------------------------------


@dataclass
class InProcess:
    recorder: Recorder
    registry: CollectorRegistry
    redis: aioredis.Redis
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(f"crane_event_recorder_{name}", labels) or 0.0

    async def stop(self) -> None:
        """Stop like SIGTERM does; a worker that failed fails the test."""
        self.stopping.set()
        _, pending = await asyncio.wait(self.tasks, timeout=10)
        for task in pending:
            task.cancel()
        results = await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.redis.aclose()
        assert not pending, "workers did not stop within 10s"
        assert not [r for r in results if isinstance(r, BaseException)], results


@contextlib.asynccontextmanager
async def in_process(
    kube: client.ApiClient,
    redis_url: str | RedisSettings,
    namespace: str,
    *,
    event_api: EventApi = EventApi.EVENTS_V1,
    wrap: Callable[[ListFn], ListFn] = lambda list_fn: list_fn,
    **overrides: Any,
) -> AsyncIterator[InProcess]:
    settings = replace(
        RecorderSettings(namespaces=(namespace,), event_api=event_api, redis_check_interval=0.2), **overrides
    )
    redis = make_redis(redis_url)
    list_fn = event_list_function(kube, event_api, namespace)
    registry = CollectorRegistry()
    recorder = Recorder(
        BindingStore(redis, SCHEMA),
        {scope_name(event_api, namespace): wrap(list_fn)},
        RecorderMetrics(registry),
        settings,
        redis_server_id=lambda: redis_run_id(redis),
    )
    running = InProcess(recorder, registry, redis)
    running.tasks = [asyncio.create_task(w) for w in recorder.workers(running.stopping)]
    try:
        yield running
    finally:
        await running.stop()


# --- the recorder as a child process (kill -9) ------------------------------------------------------------------


@dataclass
class Child:
    process: ManagedProcess
    port: int

    async def get(self, path: str) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{self.port}{path}", timeout=aiohttp.ClientTimeout(total=2)) as r,
        ):
            return r.status, await r.text()

    async def ready(self) -> bool:
        status, _ = await self.get("/readyz")
        return status == 200

    async def metric(self, name: str) -> float:
        _, text = await self.get("/metrics")
        for line in text.splitlines():
            if line.startswith(f"crane_event_recorder_{name} "):
                return float(line.split()[1])
        return 0.0


def child(kubeconfig: Path, redis_url: str, namespace: str, log_dir: Path, *extra: str) -> Child:
    port = free_port()
    args = ("--redis-url", redis_url, "--namespaces", namespace, "--redis-check-interval", "200ms", *extra)
    argv = service_argv("crane_event_recorder", kubeconfig, port, *args)
    return Child(ManagedProcess("event-recorder", argv, log_dir / f"event-recorder-{namespace}.log"), port)


@contextlib.asynccontextmanager
async def running_child(cluster: LocalCluster, redis_url: str, namespace: str) -> AsyncIterator[Child]:
    """The real ``crane-event-recorder`` as the chart's ServiceAccount, ready; stopped however the block ends."""
    proc = child(identity(cluster, "event-recorder").kubeconfig, redis_url, namespace, cluster.run_dir / "logs")
    await proc.process.start()
    try:
        await proc.process.wait_ready(proc.ready, timeout=30)
        yield proc
    finally:
        await proc.process.stop()
