"""Run crane-scheduler against the real API server: in-process (asyncio tasks) or as a child process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.procs import ManagedProcess, free_port, service_argv
from crane_sandbox.rbac import identity, service_identity
from crane_scheduler.reporting import Reporter
from crane_scheduler.scheduler import Scheduler
from crane_scheduler.simulate import Simulator
from crane_scheduler.writer import ApiWriter, Connection
from crane_shared.kube import api_client_from_dict, raw_json


async def wait_for(
    condition: Callable[[], Awaitable[Any]], timeout: float = 20.0, interval: float = 0.1, what: str = "condition"
) -> Any:
    """Poll until ``condition()`` is truthy; its value is returned. Fails with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value {value!r}")
        await asyncio.sleep(interval)


def config_for(scheduler_name: str, **extra: Any) -> dict[str, Any]:
    profile = {"schedulerName": scheduler_name, **extra.pop("profile", {})}
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "profiles": [profile],
        **extra,
    }


@contextlib.asynccontextmanager
async def in_process(
    cluster: LocalCluster, config: dict[str, Any], node_selector: str, load_aware: bool = False
) -> AsyncIterator[Scheduler]:
    """The scheduler as asyncio tasks of this test's event loop, as the chart's scheduler ServiceAccount; stopped
    (binds drained) on exit. ``load_aware``: the installed plugins, Dynamic among them, as the service loads them
    (default: the built-in ones only)."""
    account = (await service_identity(cluster, "scheduler")).kubeconfig_dict()
    api = await api_client_from_dict(account, qps=0, burst=200)
    writer = ApiWriter(Connection(kubeconfig_dict=account, qps=0))
    await writer.start()
    # the service's clocks: the handles' (and the queue's) monotonic, Dynamic's the wall clock
    sim = Simulator(config, clock=time.monotonic, wall_clock=time.time, out_of_tree=load_aware, watched=True)
    for profile in sim.profiles.values():
        if profile.handle is not None:  # connected as the service connects its handles
            profile.handle.api, profile.handle.writer = api, writer
    reporter = Reporter(writer, api, "test")
    scheduler = Scheduler(
        config=sim.config,
        profiles=sim.profiles,
        table=sim.table,
        reporter=reporter,
        api=api,
        node_selector=node_selector,
        writer=writer,
    )
    stopping = asyncio.Event()

    async def schedule() -> None:
        try:
            await scheduler.run(stopping)
        finally:
            reporter.close()

    workers = [
        w.run(stopping) for profile in sim.profiles.values() for w in profile.workers
    ]  # as the service runs them
    tasks = [
        asyncio.create_task(c)
        for c in (scheduler.run_informers(stopping), reporter.run(stopping), schedule(), *workers)
    ]
    try:
        await asyncio.wait_for(scheduler.synced.wait(), 30)
        yield scheduler
    finally:
        stopping.set()
        await asyncio.wait(tasks, timeout=20)
        for t in tasks:
            t.cancel()
        await writer.close()
        await api.close()


def child_process(
    cluster: LocalCluster,
    config: dict[str, Any],
    node_selector: str,
    name: str,
    workdir: Path,
    *extra_args: str,
    kubeconfig: Path | None = None,
) -> tuple[ManagedProcess, int]:
    """The real ``crane-scheduler`` command as a child process (for kill -9), as the chart's scheduler
    ServiceAccount (``kubeconfig`` of a ``ServiceIdentity``, default: the session's); returns it and its HTTP
    port. A leader-elected config must name the identity's ``lease_name`` in its namespace: the chart grants no
    other Lease."""
    kubeconfig = kubeconfig or identity(cluster, "scheduler").kubeconfig
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    args = ("--config", str(path), "--node-selector", node_selector, "--identity", name, *extra_args)
    argv = service_argv("crane_scheduler", kubeconfig, port, *args)
    return ManagedProcess(name, argv, cluster.run_dir / "logs" / f"{name}.log"), port


# ------------------------------------------------------------------------------------------ objects


async def create_nodes(kube: client.ApiClient, nodes: list[dict[str, Any]]) -> None:
    """Nodes with allocatable set on the status subresource (there are no kubelets to report it)."""
    v1 = client.CoreV1Api(kube)

    async def one(n: dict[str, Any]) -> None:
        status = n.pop("status")
        name = n["metadata"]["name"]
        await v1.create_node(n)
        await v1.patch_node_status(name, {"status": status})
        # The API server's TaintNodesByCondition admission adds node.kubernetes.io/not-ready; no node
        # lifecycle controller runs here to lift it once "kubelet" is ready, so set the taints we want.
        await v1.patch_node(
            name, {"spec": {"taints": n["spec"].get("taints") or None}}, _content_type="application/merge-patch+json"
        )

    await asyncio.gather(*(one(json.loads(json.dumps(n))) for n in nodes))


def node(
    name: str,
    group: str,
    cpu: str = "4",
    memory: str = "16Gi",
    pods: int = 110,
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "crane.test/group": group, **(labels or {})},
        },
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"capacity": resources, "allocatable": resources},
    }


def pod(
    name: str,
    scheduler: str,
    cpu: str = "100m",
    memory: str = "64Mi",
    *,
    node_name: str | None = None,
    spec: dict[str, Any] | None = None,
    ports: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "c",
        "image": "pause",
        "resources": {"requests": {"cpu": cpu, "memory": memory}},
    }
    if ports:
        container["ports"] = ports
    body: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {"schedulerName": scheduler, "containers": [container], **(spec or {})},
    }
    if node_name:
        body["spec"]["nodeName"] = node_name
    return body


async def create_pods(
    kube: client.ApiClient, namespace: str, pods: list[dict[str, Any]], concurrency: int = 50
) -> None:
    v1 = client.CoreV1Api(kube)
    sem = asyncio.Semaphore(concurrency)

    async def one(p: dict[str, Any]) -> None:
        async with sem:
            resp = await v1.create_namespaced_pod(namespace, p, _preload_content=False)
            resp.release()

    await asyncio.gather(*(one(p) for p in pods))


async def delete_pods(kube: client.ApiClient, namespace: str, names: list[str]) -> None:
    v1 = client.CoreV1Api(kube)
    for name in names:  # no kubelet confirms a graceful deletion here
        resp = await v1.delete_namespaced_pod(name, namespace, grace_period_seconds=0, _preload_content=False)
        resp.release()


async def pods_json(kube: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    resp = await client.CoreV1Api(kube).list_namespaced_pod(namespace, _preload_content=False)
    items: list[dict[str, Any]] = json.loads(await resp.read())["items"]
    resp.release()
    return items


async def node_of(kube: client.ApiClient, namespace: str, name: str) -> str | None:
    resp = await client.CoreV1Api(kube).read_namespaced_pod(name, namespace, _preload_content=False)
    pod_ = json.loads(await resp.read())
    resp.release()
    node_name: str | None = pod_["spec"].get("nodeName")
    return node_name


async def events(kube: client.ApiClient, namespace: str, reason: str | None = None) -> list[dict[str, Any]]:
    """The namespace's events (events.k8s.io), only those with ``reason`` when given (selected by the API server)."""
    selector = {"field_selector": f"reason={reason}"} if reason is not None else {}
    resp = await client.EventsV1Api(kube).list_namespaced_event(namespace, _preload_content=False, **selector)
    items: list[dict[str, Any]] = json.loads(await resp.read())["items"]
    resp.release()
    return items


@pytest.fixture
def group(namespace: str) -> str:
    """Label value of this test's nodes (the scheduler runs with --node-selector crane.test/group=<group>)."""
    return namespace


@pytest.fixture
def selector(group: str) -> str:
    return f"crane.test/group={group}"


@pytest.fixture
def scheduler_name(namespace: str) -> str:
    return f"crane-{namespace}"[:63].rstrip("-")


async def read_object(call: Awaitable[Any]) -> dict[str, Any] | None:
    """A raw-JSON read (a client call made with ``_preload_content=False``); None on 404."""
    try:
        body: dict[str, Any] = await raw_json(call)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return body


async def read_pod(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    return await read_object(client.CoreV1Api(kube).read_namespaced_pod(name, namespace, _preload_content=False))


def scheduled_condition(p: dict[str, Any] | None) -> dict[str, Any] | None:
    """The pod's PodScheduled condition, if any."""
    for c in ((p or {}).get("status") or {}).get("conditions") or ():
        if c.get("type") == "PodScheduled":
            return dict(c)
    return None


@pytest.fixture
async def priorities(kube: client.ApiClient, namespace: str) -> AsyncIterator[dict[str, str]]:
    """PriorityClasses low (1), mid (10) and high (100), named after the test (they are cluster-scoped)."""
    scheduling = client.SchedulingV1Api(kube)
    names = {level: f"{namespace}-{level}"[:63] for level in ("low", "mid", "high")}
    for level, value in (("low", 1), ("mid", 10), ("high", 100)):
        await scheduling.create_priority_class({"metadata": {"name": names[level]}, "value": value})
    yield names
    for name in names.values():
        await scheduling.delete_priority_class(name)


def victim(name: str, scheduler: str, node_name: str, priority_class: str, **kw: Any) -> dict[str, Any]:
    """A pod already on ``node_name``; grace period 0 stands in for the kubelet confirming the deletion."""
    body = pod(
        name,
        scheduler,
        cpu="1",
        node_name=node_name,
        spec={"priorityClassName": priority_class, "terminationGracePeriodSeconds": 0},
    )
    body["metadata"].update(kw)
    return body


async def nominated_nodes(kube: client.ApiClient, namespace: str, name: str) -> list[str]:
    """Every distinct ``status.nominatedNodeName`` the pod had, watched until it is bound."""
    seen: list[str] = []
    w = watch.Watch()
    pods = client.CoreV1Api(kube).list_namespaced_pod
    async for event in w.stream(pods, namespace, field_selector=f"metadata.name={name}", timeout_seconds=60):
        obj = event["object"]
        nominated = obj.status.nominated_node_name if obj.status else None
        if nominated and nominated not in seen:
            seen.append(nominated)
        if obj.spec.node_name:
            w.stop()
    return seen
