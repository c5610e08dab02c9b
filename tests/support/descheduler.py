"""The descheduler's tests: node and pod JSON (load annotations stamped ``at``, pods owned by a ReplicaSet) for
the pure round, and the real stack (API server, the fleet's per-pod series in a real Prometheus, the service as
a child process under its chart account) for the integration tests."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest_asyncio
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.exporter import FleetExporter
from crane_sandbox.fleet import GI, FleetState, make_fleet
from crane_sandbox.pod_follower import create_nodes
from crane_sandbox.procs import service_argv
from crane_sandbox.prometheus import PrometheusServer
from crane_sandbox.rbac import ServiceIdentity, service_identity
from crane_shared.annotations import annotation_key, encode_usage
from crane_shared.batch import BATCH_CPU
from crane_shared.kube import raw_json
from tests.support.fleet import scraped_fleet
from tests.support.serviceproc import ServiceProc

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
OLD = (NOW - timedelta(hours=1)).isoformat().replace("+00:00", "Z")


def node(
    name: str,
    cpu: float | None = 0.3,
    mem: float | None = 0.3,
    *,
    at: datetime = NOW,
    cores: int = 8,
    memory: int = 32 << 30,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A node annotated with cpu/mem usage (``*_avg_5m`` and ``*_max_avg_1h``) stamped ``at``; None leaves it out."""
    notes: dict[str, str] = {}
    for metric, value in (("cpu", cpu), ("mem", mem)):
        if value is not None:
            for suffix in ("usage_avg_5m", "usage_max_avg_1h"):
                notes[annotation_key(f"{metric}_{suffix}")] = encode_usage(value, at)
    notes |= annotations or {}
    return {
        "metadata": {"name": name, "labels": labels or {}, "annotations": notes},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {"allocatable": {"cpu": str(cores), "memory": str(memory), "pods": "110"}},
    }


def pod(
    name: str,
    node_name: str,
    *,
    namespace: str = "default",
    cpu: str = "500m",
    memory: str = "512Mi",
    priority: int = 0,
    qos: str = "Burstable",
    owner_kind: str | None = "ReplicaSet",
    owner: str = "web-abc",
    created: str = OLD,
    annotations: dict[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    phase: str = "Running",
    ready: bool = True,
    priority_class: str | None = None,
    batch_cpu: str | None = None,
    affinity: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``batch_cpu``: millicores of ``crane.io/batch-cpu`` requested (and limited, as the API server requires of an
    extended resource): a batch pod."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "creationTimestamp": created,
        "annotations": annotations or {},
    }
    if owner_kind:
        api = "batch/v1" if owner_kind == "Job" else "apps/v1"
        meta["ownerReferences"] = [
            {"apiVersion": api, "kind": owner_kind, "name": owner, "uid": f"uid-{owner}", "controller": True}
        ]
    spec: dict[str, Any] = {
        "nodeName": node_name,
        "priority": priority,
        "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
        "volumes": volumes or [],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    if affinity:
        spec["affinity"] = affinity
    if batch_cpu is not None:
        resources = spec["containers"][0]["resources"]
        resources["requests"][BATCH_CPU] = batch_cpu
        resources["limits"] = {BATCH_CPU: batch_cpu}
    return {
        "metadata": meta,
        "spec": spec,
        "status": {
            "phase": phase,
            "qosClass": qos,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


# --- the integration stack: real API server, the fleet's per-pod series scraped by a real Prometheus ------------

PACKING_PROFILE: dict[str, Any] = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "profiles": [
        {
            "schedulerName": "crane-scheduler",
            "pluginConfig": [{"name": "NodeResourcesFit", "args": {"scoringStrategy": {"type": "MostAllocated"}}}],
        }
    ],
}
"""the scheduler's configuration with kube's packing score (the sandbox's ``--autoscaler`` profile's)"""


def zone_affinity(zone: str) -> dict[str, Any]:
    """A pod's required node affinity to nodes labelled ``zone=<zone>``."""
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": [zone]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


SELECTOR_KEY = "crane-test/descheduler"
USAGE = "sandbox.crane.io/usage"
FAST_POLICY = """\
apiVersion: descheduler.policy.crane.io/v1alpha1
kind: LoadAwareDeschedulerPolicy
spec:
  anomaly: {consecutiveAbnormalities: 2, consecutiveNormalities: 2}
  nodePools: [{name: test, nodeSelector: {"crane-test/descheduler": "LABEL"}}]
  evictable: {minPodAge: 1s}
  limits: {maxPerNodePerRound: 1, maxPerMinute: 30}
"""


class DeschedulerProc(ServiceProc):
    """``python -m crane_descheduler`` with its real flags, as the chart's descheduler ServiceAccount (its Lease)."""

    def __init__(
        self,
        run_dir: Path,
        identity: ServiceIdentity,
        prometheus_url: str,
        policy: Path,
        *extra: str,
        kubeconfig: Path | None = None,
    ):
        super().__init__("descheduler", run_dir)
        self.launch(
            service_argv(
                "crane_descheduler",
                kubeconfig or identity.kubeconfig,
                self.port,
                "--prometheus-url",
                prometheus_url,
                "--descheduler-policy",
                str(policy),
                "--interval",
                "0.5s",
                "--usage-window",
                "5s",
                "--lease-namespace",
                identity.namespace,
                "--lease-name",
                identity.lease_name,
                *extra,
            )
        )

    async def counter(self, name: str, **labels: str) -> float:
        return await self.metric(f"crane_descheduler_{name}_total", **labels) or 0.0


async def annotate_load(kube: client.ApiClient, name: str, cpu: float, at: datetime) -> None:
    """What the annotator writes (cpu and memory ``*_avg_5m`` and ``*_max_avg_1h``), stamped ``at``."""
    notes = node(name, cpu=cpu, mem=0.3, at=at)["metadata"]["annotations"]
    await client.CoreV1Api(kube).patch_node(name, {"metadata": {"annotations": notes}})


async def run_pod(
    kube: client.ApiClient, state: FleetState, namespace: str, name: str, node_name: str, label: str, **kwargs: Any
) -> dict[str, Any]:
    """A pod bound to ``node_name`` and marked Running and Ready (no kubelet here), its usage served by the fleet.
    ``usage`` (e.g. ``"cpu=3"``) is its ``sandbox.crane.io/usage``; the rest as ``pod()``."""
    usage = kwargs.pop("usage", "cpu=1")
    body = pod(name, node_name, namespace=namespace, **kwargs)
    meta = body["metadata"]
    for key in ("uid", "creationTimestamp"):
        meta.pop(key)
    meta["annotations"][USAGE] = usage
    meta["labels"] = {"app": name}
    body["spec"]["nodeSelector"] = {SELECTOR_KEY: label}  # only this test's nodes can take it
    status = body.pop("status")
    core = client.CoreV1Api(kube)
    created = await raw_json(core.create_namespaced_pod(namespace, body, _preload_content=False))
    created = await raw_json(
        core.patch_namespaced_pod_status(name, namespace, {"status": status}, _preload_content=False)
    )
    state.on_pod(created)
    return dict(created)


def pod_terminating(obj: Any) -> bool:
    return obj.metadata.deletion_timestamp is not None


# --- fixtures (re-exported by the conftest.py of the directories that use them) ---------------------------------


@dataclass
class Fleet:
    state: FleetState
    exporter: FleetExporter
    prometheus: PrometheusServer
    run_dir: Path


@pytest_asyncio.fixture(scope="module")
async def fleet(run_dir: Path) -> AsyncIterator[Fleet]:
    state = FleetState([])
    directory = run_dir / f"descheduler-{uuid.uuid4().hex[:8]}"
    async with scraped_fleet(directory, state) as (exporter, prometheus):
        yield Fleet(state, exporter, prometheus, directory)


@dataclass
class Scene:
    label: str
    hot: str
    cool: str
    namespace: str
    pods: Callable[..., Awaitable[dict[str, Any]]]
    start: Callable[..., Awaitable[DeschedulerProc]]
    core: client.CoreV1Api
    identity: ServiceIdentity


@pytest_asyncio.fixture
async def scene(fleet: Fleet, cluster: LocalCluster, kube: client.ApiClient, namespace: str) -> AsyncIterator[Scene]:
    """Two nodes of this test only (a hot one at 90 % CPU, a cool one at 10 %) and a way to start the descheduler
    on them; everything is stopped and deleted afterwards."""
    label = uuid.uuid4().hex[:8]
    nodes = make_fleet(2, cpu_cores=8, memory_bytes=32 * GI, labels={SELECTOR_KEY: label}, prefix=f"ds-{label}-")
    for n in nodes:
        fleet.state.add_node(n)
    await create_nodes(kube, nodes)
    hot, cool = nodes[0].name, nodes[1].name
    now = datetime.now(UTC)
    await annotate_load(kube, hot, 0.9, now)
    await annotate_load(kube, cool, 0.1, now)
    identity = await service_identity(cluster, "descheduler", namespace)
    policy = fleet.run_dir / f"policy-{label}.yaml"
    policy.write_text(FAST_POLICY.replace("LABEL", label))
    started: list[DeschedulerProc] = []

    async def start(*extra: str, kubeconfig: Path | None = None) -> DeschedulerProc:
        proc = DeschedulerProc(fleet.run_dir, identity, fleet.prometheus.url, policy, *extra, kubeconfig=kubeconfig)
        started.append(proc)
        await proc.start()
        return proc

    async def pods(name: str, **kwargs: Any) -> dict[str, Any]:
        created = await run_pod(kube, fleet.state, namespace, name, kwargs.pop("node", hot), label, **kwargs)
        # the descheduler evicts only pods it has measured: wait until the CPU rate is in Prometheus
        await fleet.prometheus.wait_for(
            f'rate(container_cpu_usage_seconds_total{{namespace="{namespace}",pod="{name}"}}[5s])',
            lambda r: bool(r),
            timeout=60,
        )
        return created

    try:
        yield Scene(label, hot, cool, namespace, pods, start, client.CoreV1Api(kube), identity)
    finally:
        for proc in started:
            await proc.stop()
        for n in nodes:
            with contextlib.suppress(Exception):
                await client.CoreV1Api(kube).delete_node(n.name)
