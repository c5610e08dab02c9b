"""The simulated fleet end to end: Node objects and bound pods from the API server, the fleet exporter, and a
real Prometheus with the fast recording rules plus backfilled history.

One Prometheus for the whole module: its first scrape takes 5-7 s (discovery batching), later checks are fast.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio import client

from crane_sandbox.exporter import FleetExporter
from crane_sandbox.fleet import GI, FleetState, make_fleet
from crane_sandbox.pod_follower import PodFollower, create_nodes
from crane_sandbox.prometheus import PrometheusServer, Sample, backfill, check_rules, rules_path
from tests.support.fleet import scraped_fleet
from tests.support.waiting import eventually

TOLERANCE = 1.0  # percentage points


def pod(name: str, node: str, *, usage: str | None = None, cpu: str = "0", memory: str = "0") -> dict[str, Any]:
    """A pod body as the API server takes it (the fleet only reads name, annotations, node and requests)."""
    return {
        "metadata": {"name": name, "annotations": {"sandbox.crane.io/usage": usage} if usage else {}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
        },
    }


def seen(body: dict[str, Any]) -> dict[str, Any]:
    """The same pod as a watch would report it once its kubelet runs it: with a uid, Running."""
    return {**body, "metadata": {**body["metadata"], "uid": body["metadata"]["name"]}, "status": {"phase": "Running"}}


# Nodes have 8 cores, 32 GiB, and a base load of 10 % CPU and 20 % memory. Instance styles cycle
# ip, ip:port, name over node-0001, node-0002, node-0003, ...
STATIC_LOAD = [
    # node, pods, expected cpu %, expected mem %
    ("node-0001", [pod("a", "node-0001", usage="cpu=2,memory=8Gi")], 35.0, 45.0),
    ("node-0002", [pod("b", "node-0002", cpu="4", memory="16Gi")], 35.0, 45.0),  # half of the requests
    ("node-0003", [pod("c", "node-0003", usage="cpu=6"), pod("d", "node-0003", usage="memory=4Gi")], 85.0, 32.5),
]

HISTORY_INSTANCE = "10.99.0.1"
OLD_PEAK, RECENT_PEAK, BASELINE = 90.0, 70.0, 20.0


@dataclass
class Stack:
    state: FleetState
    exporter: FleetExporter
    prometheus: PrometheusServer


def history(now: float) -> list[tuple[str, dict[str, str], list[tuple[float, float]]]]:
    """2 h of cpu_usage_avg_5m every 30 s: a peak 100 min ago (outside the last hour) and one 30 min ago."""
    samples = []
    for i in range(240):
        ts = now - 7200 + i * 30
        age = now - ts
        value = OLD_PEAK if 6000 - 60 < age <= 6000 else RECENT_PEAK if 1800 - 60 < age <= 1800 else BASELINE
        samples.append((ts, value))
    return [("cpu_usage_avg_5m", {"instance": HISTORY_INSTANCE}, samples)]


@pytest_asyncio.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    run_dir = tmp_path_factory.mktemp("prometheus")
    state = FleetState(make_fleet(6, cpu_cores=8, memory_bytes=32 * GI, instance_styles=("ip", "ip:port", "name")))
    for _, pods, _, _ in STATIC_LOAD:
        for p in pods:
            state.on_pod(seen(p))
    state.on_pod(seen(pod("leaving", "node-0006", usage="cpu=4,memory=16Gi")))
    # History must end before "now": the live head starts where the blocks end.
    await backfill(run_dir / "data", history(time.time() - 60))
    # 3 shards: exercises the sharded scrape config
    async with scraped_fleet(run_dir, state, shard_size=2, data_dir=run_dir / "data") as (exporter, prometheus):
        yield Stack(state, exporter, prometheus)


def value_of(instance: str, expected: float) -> object:
    def check(result: list[Sample]) -> bool:
        values = [s.value for s in result if s.labels.get("instance") == instance]
        return len(values) == 1 and abs(values[0] - expected) <= TOLERANCE

    return check


async def test_every_shard_is_scraped_and_every_node_has_series(stack: Stack) -> None:
    await stack.prometheus.wait_for('count(up{job="fleet"} == 1)', lambda r: bool(r) and r[0].value == 3)
    result = await stack.prometheus.wait_for("node_memory_MemTotal_bytes", lambda r: len(r) == 6)
    instances = {s.labels["instance"] for s in result}
    assert instances == {n.instance_label for n in stack.state.nodes.values()}
    assert {"10.0.0.1", "10.0.0.2:9100", "node-0003"} <= instances


@pytest.mark.parametrize(("node", "pods", "cpu", "mem"), STATIC_LOAD, ids=["ip", "ip:port", "name"])
async def test_avg_5m_reports_pod_load_in_percent(stack: Stack, node: str, pods: object, cpu: float, mem: float):
    instance = stack.state.nodes[node].instance_label
    await stack.prometheus.wait_for("cpu_usage_avg_5m", value_of(instance, cpu))  # type: ignore[arg-type]
    await stack.prometheus.wait_for("mem_usage_avg_5m", value_of(instance, mem))  # type: ignore[arg-type]


async def test_avg_5m_follows_pods_arriving_and_leaving(stack: Stack) -> None:
    arriving = stack.state.nodes["node-0005"].instance_label  # ip:port style
    leaving = stack.state.nodes["node-0006"].instance_label  # name style
    stack.state.on_pod(seen(pod("arriving", "node-0005", usage="cpu=4,memory=16Gi")))
    stack.state.remove_pod("leaving")
    # The fast rules average over 10 s: a step change is fully visible after about 10 s.
    await stack.prometheus.wait_for("cpu_usage_avg_5m", value_of(arriving, 60.0))  # type: ignore[arg-type]
    await stack.prometheus.wait_for("mem_usage_avg_5m", value_of(arriving, 70.0))  # type: ignore[arg-type]
    await stack.prometheus.wait_for("cpu_usage_avg_5m", value_of(leaving, 10.0))  # type: ignore[arg-type]
    await stack.prometheus.wait_for("mem_usage_avg_5m", value_of(leaving, 20.0))  # type: ignore[arg-type]


async def test_max_avg_1h_sees_only_the_last_hour_of_backfilled_history(stack: Stack) -> None:
    await stack.prometheus.wait_for(
        f'cpu_usage_max_avg_1h{{instance="{HISTORY_INSTANCE}"}}',
        lambda r: [s.value for s in r] == [RECENT_PEAK],
    )
    await stack.prometheus.wait_for(
        f'cpu_usage_max_avg_1d{{instance="{HISTORY_INSTANCE}"}}',
        lambda r: [s.value for s in r] == [OLD_PEAK],
    )


@pytest.mark.parametrize("variant", ["upstream", "fast"])
async def test_rules_files_pass_promtool_and_record_the_same_metrics(variant: str, tmp_path: Path) -> None:
    path = rules_path(variant)  # type: ignore[arg-type]
    ok, output = await check_rules(path, tmp_path)
    assert ok, output
    recorded = {rule["record"] for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]}
    metrics = {
        f"{res}_{m}"
        for res in ("cpu", "mem")
        for m in ("usage_active", "usage_avg_5m", "usage_max_avg_1h", "usage_max_avg_1d")
    }
    # each policy metric has its batch share (spec.reclaim.batchMetrics); the maxima's shares read the regular average
    helpers = {f"regular_{res}_usage_avg_5m" for res in ("cpu", "mem")}
    assert recorded == metrics | {f"batch_{m}" for m in metrics} | helpers


async def test_sim_nodes_are_ready_in_the_api_and_bound_pods_load_them(kube: client.ApiClient, namespace: str):
    v1 = client.CoreV1Api(kube)
    nodes = make_fleet(2, prefix="sim-", cpu_cores=8, labels={"pool": "sim"}, instance_styles=("ip:port",))
    await create_nodes(kube, nodes)
    await create_nodes(kube, nodes)  # idempotent: a restarted sandbox finds its nodes
    node = await v1.read_node("sim-0001")
    assert node.metadata.labels["pool"] == "sim"
    assert node.metadata.labels["kubernetes.io/hostname"] == "sim-0001"
    assert node.status.allocatable["cpu"] == "8"
    assert [(a.type, a.address) for a in node.status.addresses] == [
        ("InternalIP", "10.0.0.1"),
        ("Hostname", "sim-0001"),
    ]
    assert [(c.type, c.status) for c in node.status.conditions] == [("Ready", "True")]

    state = FleetState(nodes)

    async def run(body: dict[str, Any]) -> None:
        """Create a pod and report it Running, as its kubelet would (this cluster has none)."""
        await v1.create_namespaced_pod(namespace, body)
        name = body["metadata"]["name"]
        await v1.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Running"}})

    await run(pod("listed", "sim-0001", usage="cpu=2,memory=8Gi"))
    await v1.create_namespaced_pod(namespace, pod("pending", "sim-0001", usage="cpu=4"))  # bound, never started
    follower = PodFollower(kube, state)
    follower.start()
    try:
        await asyncio.wait_for(follower.synced.wait(), 10)
        assert state.usage("sim-0001") == pytest.approx((0.1 + 2 / 8, 0.2 + 8 / 32))
        await run(pod("watched", "sim-0002", cpu="2", memory="4Gi"))
        await v1.create_namespaced_pod(namespace, pod("unbound", "", usage="cpu=8"))
        await eventually(lambda: state.usage("sim-0002") == pytest.approx((0.1 + 1 / 8, 0.2 + 2 / 32)))
        await v1.delete_namespaced_pod("listed", namespace, grace_period_seconds=0)
        await eventually(lambda: state.usage("sim-0001") == pytest.approx((0.1, 0.2)))
        mine = {p.name for p in state.pods.values() if p.name.startswith(f"{namespace}/")}  # other tests bind pods too
        assert mine == {f"{namespace}/watched"}
    finally:
        await follower.stop()
