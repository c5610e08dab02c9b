"""A real stack for the annotator: API server (session cluster), a simulated fleet scraped by a real Prometheus
with the fast rules and backfilled history, and annotators run as child processes with their real command line.

The fleet's nodes carry a label unique to this module and every annotator is started with ``--node-selector``
on it, so nodes other tests create in the shared cluster are never touched. Node series use the three instance
styles (IP, IP:port, name); the name-style nodes have no Hostname address, so they can only be found by name."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest_asyncio
import yaml
from kubernetes_asyncio import client

from crane_annotator.writer import HotSupplier, PatchReport
from crane_sandbox.cluster import LocalCluster
from crane_sandbox.exporter import FleetExporter
from crane_sandbox.fleet import GI, USAGE_ANNOTATION, FleetState, SimNode, make_fleet
from crane_sandbox.pod_follower import create_nodes
from crane_sandbox.prometheus import SCRAPE_JOB, PrometheusServer, backfill
from crane_sandbox.rbac import ServiceIdentity, service_identity
from crane_shared.annotations import decode
from crane_shared.batch import BATCH_CPU, BATCH_MEMORY
from crane_shared.kube import raw_json
from crane_shared.quantity import quantity
from tests.support.fleet import scraped_fleet
from tests.support.policy import UPSTREAM_METRICS, fast_policy, policy_yaml
from tests.support.serviceproc import ServiceProc

SELECTOR_KEY = "crane-test/annotator"


TEST_POLICY = fast_policy(dict(zip(UPSTREAM_METRICS, ("2s", "3s", "4s", "2s", "3s", "4s"), strict=True)))


def peaks(index: int) -> dict[str, float]:
    """Backfilled history peaks (percent) per node: distinct per node and metric, above any live load."""
    return {
        "cpu_1h": 60 + index + 0.123456,
        "cpu_1d": 80 + index + 0.654321,
        "mem_1h": 55 + index + 0.314159,
        "mem_1d": 75 + index + 0.271828,
    }


def history(nodes: list[SimNode], end: float) -> list[tuple[str, dict[str, str], list[tuple[float, float]]]]:
    """25 h of *_avg_5m per node every 60 s: a baseline, one peak 30 min ago and a higher one 10 h ago."""
    out = []
    for i, node in enumerate(nodes):
        p = peaks(i)
        for resource in ("cpu", "mem"):
            samples = []
            for k in range(25 * 60):
                ts = end - k * 60
                age = end - ts
                value = 15.0
                if 1800 <= age < 1860:
                    value = p[f"{resource}_1h"]
                elif 36000 <= age < 36060:
                    value = p[f"{resource}_1d"]
                samples.append((ts, value))
            # Same label set as the live rule output, so history and live samples form one series: the cpu
            # rule aggregates `by (instance)`, the mem rule keeps the scrape's labels (job included).
            labels = {"instance": node.instance_label} | ({"job": SCRAPE_JOB} if resource == "mem" else {})
            out.append((f"{resource}_usage_avg_5m", labels, samples))
    return out


@dataclass
class Stack:
    label: str
    nodes: list[SimNode]
    state: FleetState
    exporter: FleetExporter
    prometheus: PrometheusServer
    cluster: LocalCluster
    kube: client.ApiClient
    policy_path: Path
    run_dir: Path

    def node_index(self, name: str) -> int:
        return [n.name for n in self.nodes].index(name)

    async def annotations(self, name: str) -> dict[str, str]:
        node = await client.CoreV1Api(self.kube).read_node(name)
        return dict(node.metadata.annotations or {})

    async def fresh_values(self, since: datetime) -> dict[str, dict[str, float]] | None:
        """Every node's metric values (the upstream policy's six), once every one of them was stamped after
        ``since``; else None (some node lacks one, or has an older one)."""
        out: dict[str, dict[str, float]] = {}
        for node in self.nodes:
            annotations = await self.annotations(node.name)
            if not all(m in annotations for m in UPSTREAM_METRICS):
                return None
            decoded = {m: decode(annotations[m]) for m in UPSTREAM_METRICS}
            if any(d.timestamp <= since for d in decoded.values()):
                return None
            out[node.name] = {m: d.value for m, d in decoded.items()}
        return out

    async def add_node(self, node: SimNode) -> None:
        """A node that joins later: served by the exporter and created in the API server."""
        self.state.add_node(node)
        self.nodes.append(node)
        await create_nodes(self.kube, [node])
        if node.instance_style == "name":
            await drop_hostname(self.kube, node)


async def drop_hostname(kube: client.ApiClient, node: SimNode) -> None:
    """Leave only the InternalIP, so a name-style series can match this node by its name alone."""
    body = {"status": {"addresses": [{"type": "InternalIP", "address": node.internal_ip}]}}
    await client.CoreV1Api(kube).patch_node_status(node.name, body, _content_type="application/merge-patch+json")


@pytest_asyncio.fixture(scope="module")
async def stack(cluster: LocalCluster, kube: client.ApiClient, run_dir: Path) -> AsyncIterator[Stack]:
    label = uuid.uuid4().hex[:8]
    run_dir = run_dir / f"annotator-{label}"  # kept after the session, with every process' log
    fleet = make_fleet(
        6,
        cpu_cores=8,
        memory_bytes=32 * GI,
        instance_styles=("ip", "ip:port", "name"),
        labels={SELECTOR_KEY: label},
        prefix=f"ann-{label}-",
    )
    # Distinct live loads, well below the backfilled peaks.
    fleet = [
        dataclasses.replace(n, base_cpu_fraction=0.05 + 0.03 * i, base_mem_fraction=0.1 + 0.02 * i)
        for i, n in enumerate(fleet)
    ]
    await backfill(run_dir / "data", history(fleet, time.time() - 60))
    async with running_stack(kube, cluster, run_dir, label, fleet, TEST_POLICY, data_dir=run_dir / "data") as stack:
        # Live rule output for every node (not just the backfilled history) before any annotator starts.
        for metric in ("cpu_usage_avg_5m", "mem_usage_avg_5m"):
            await stack.prometheus.wait_for(
                f"count(count_over_time({metric}[3s]) >= 2)",
                lambda r: bool(r) and r[0].value == len(fleet),
                timeout=60,
            )
        yield stack


@contextlib.asynccontextmanager
async def running_stack(
    kube: client.ApiClient,
    cluster: LocalCluster,
    run_dir: Path,
    label: str,
    fleet: list[SimNode],
    policy: str,
    *,
    data_dir: Path | None = None,
    shard_size: int = 4,
) -> AsyncIterator[Stack]:
    """The fleet served by exporters and scraped by a real Prometheus (fast rules), its nodes created in the API
    server (name-style ones without a Hostname address) and ``policy`` written for the annotators; all of it
    stopped and deleted afterwards."""
    state = FleetState(fleet)
    policy_path = run_dir / "policy.yaml"
    try:
        async with scraped_fleet(run_dir, state, shard_size=shard_size, data_dir=data_dir) as (exporter, prometheus):
            await create_nodes(kube, fleet)
            policy_path.write_text(policy)  # run_dir: made by Prometheus
            for node in fleet:
                if node.instance_style == "name":
                    await drop_hostname(kube, node)
            yield Stack(label, list(fleet), state, exporter, prometheus, cluster, kube, policy_path, run_dir)
    finally:
        await client.CoreV1Api(kube).delete_collection_node(label_selector=f"{SELECTOR_KEY}={label}")


class AnnotatorProc(ServiceProc):
    """``python -m crane_annotator`` with its real flags, as the chart's annotator ServiceAccount ``account`` (its
    Lease: the one the chart grants it), plus readers for its HTTP endpoints."""

    def __init__(self, stack: Stack, name: str, redis_url: str, account: ServiceIdentity, *extra: str) -> None:
        super().__init__(name, stack.run_dir)
        argv = [
            sys.executable,
            "-m",
            "crane_annotator",
            "--kubeconfig",
            str(account.kubeconfig),
            "--listen-address",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--redis-url",
            redis_url,
            "--prometheus-url",
            stack.prometheus.url,
            "--policy",
            str(stack.policy_path),
            "--node-selector",
            f"{SELECTOR_KEY}={stack.label}",
            "--lease-namespace",
            account.namespace,
            "--lease-name",
            account.lease_name,
            "--identity",
            name,
            "--kube-api-qps",
            "500",
            *extra,
        ]
        self.launch(argv)


@pytest_asyncio.fixture
async def start_annotator(stack: Stack, redis_url: str, namespace: str) -> AsyncIterator[Callable[..., Any]]:
    async with annotators(stack, redis_url, namespace) as start:
        yield start


@contextlib.asynccontextmanager
async def annotators(
    stack: Stack, redis_url: str, namespace: str, prefix: str = "annotator"
) -> AsyncIterator[Callable[..., Awaitable[AnnotatorProc]]]:
    """``await start(*flags, name=None)`` starts an annotator on ``stack`` (named ``<prefix>-<n>`` unless
    named), as this test's own annotator ServiceAccount (``identity(cluster, "annotator", namespace)``, its own
    Lease); every one started is stopped afterwards."""
    started: list[AnnotatorProc] = []
    account = await service_identity(stack.cluster, "annotator", namespace)

    async def start(*extra: str, name: str | None = None) -> AnnotatorProc:
        proc = AnnotatorProc(stack, name or f"{prefix}-{len(started)}", redis_url, account, *extra)
        started.append(proc)
        await proc.start()
        return proc

    try:
        yield start
    finally:
        for proc in started:
            await proc.stop()


def values_of(annotations: Mapping[str, str]) -> dict[str, str]:
    return {k: v.split(",")[0] for k, v in annotations.items()}


class RecordingPatcher:
    """A stand-in for the writer (``crane_annotator.writer.Patcher``): records what each call would send, the hot
    value added as the writer adds it, and answers ok. ``queued`` stands for nodes with a patch waiting in the
    writer: a submission for one joins it; a ``merge_only`` one for any other node is held."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, dict[str, str]], bool]] = []
        """per call that sent anything: (node -> body, urgent)"""
        self.sent: dict[str, list[dict[str, str]]] = {}
        """per node, the bodies sent, in order"""
        self.joined: list[str] = []
        self.queued: set[str] = set()
        self.called = asyncio.Event()

    async def patch_many(
        self,
        patches: Mapping[str, Mapping[str, str]],
        *,
        hot: HotSupplier | None = None,
        urgent: bool = False,
        merge_only: bool = False,
    ) -> PatchReport:
        report = PatchReport()
        bodies = {}
        for node, body in patches.items():
            if node in self.queued:
                self.joined.append(node)
                report.merged.append(node)
            elif merge_only:
                report.held.append(node)
                continue
            bodies[node] = {**body, **(hot(node) if hot else {})}
        if bodies:
            self.calls.append((bodies, urgent))
            for node, body in bodies.items():
                self.sent.setdefault(node, []).append(body)
            self.called.set()
        report.ok = list(bodies)
        return report


# --- batch capacity (spec.reclaim) ---------------------------------------------------------------------------


def batch_policy(period: str, **reclaim: Any) -> str:
    """Every upstream metric synced each ``period``, and a ``reclaim`` section with these fields."""
    document = yaml.safe_load(fast_policy(dict.fromkeys(UPSTREAM_METRICS, period)))
    document["spec"]["reclaim"] = reclaim
    return policy_yaml(document["spec"])


async def run_pod(
    stack: Stack,
    namespace: str,
    name: str,
    node: str,
    *,
    usage: str,
    requests: Mapping[str, str],
    limits: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod bound to ``node`` (``spec.nodeName``) and marked Running (no kubelet here), its ``usage`` (e.g.
    ``"cpu=2,memory=4Gi"``) served by the fleet as cAdvisor series. A batch pod requests ``crane.io/batch-*``
    (extended resources need equal limits, as the example Job sets them)."""
    body = {
        "metadata": {"name": name, "namespace": namespace, "annotations": {USAGE_ANNOTATION: usage}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "c",
                    "image": "pause",
                    "resources": {"requests": dict(requests), "limits": dict(limits or {})},
                }
            ],
        },
    }
    core = client.CoreV1Api(stack.kube)
    await raw_json(core.create_namespaced_pod(namespace, body, _preload_content=False))
    status = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    created = await raw_json(core.patch_namespaced_pod_status(name, namespace, status, _preload_content=False))
    stack.state.on_pod(created)
    return dict(created)


async def set_usage(stack: Stack, namespace: str, name: str, usage: str) -> None:
    """Change a running pod's simulated usage (its annotation, as a user of the sandbox does)."""
    body = {"metadata": {"annotations": {USAGE_ANNOTATION: usage}}}
    core = client.CoreV1Api(stack.kube)
    stack.state.on_pod(await raw_json(core.patch_namespaced_pod(name, namespace, body, _preload_content=False)))


async def published_batch(stack: Stack, name: str) -> tuple[int, int] | None:
    """``crane.io/batch-cpu`` (millicores) and ``crane.io/batch-memory`` (bytes) in the node's allocatable, once
    both are there and equal to its capacity's."""
    node = await raw_json(client.CoreV1Api(stack.kube).read_node(name, _preload_content=False))
    allocatable, capacity = node["status"].get("allocatable", {}), node["status"].get("capacity", {})
    if BATCH_CPU not in allocatable or BATCH_MEMORY not in allocatable:
        return None
    assert {k: allocatable[k] for k in (BATCH_CPU, BATCH_MEMORY)} == {
        k: capacity.get(k) for k in (BATCH_CPU, BATCH_MEMORY)
    }
    return quantity(allocatable[BATCH_CPU]), quantity(allocatable[BATCH_MEMORY])  # the API server writes 2000 as 2k
