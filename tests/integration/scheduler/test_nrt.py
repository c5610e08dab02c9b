"""NodeResourceTopologyMatch on the real API server: the CRD, NRT objects, the result annotation on the pod."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_scheduler.plugins.noderesourcetopology.agent import NumaNode, build_topology
from crane_scheduler.plugins.noderesourcetopology.model import ANNOTATION_RESULT
from crane_scheduler.plugins.noderesourcetopology.plugin import NodeResourceTopologyMatch
from crane_scheduler.plugins.noderesourcetopology.publish import publish_topologies
from crane_scheduler.scheduler import Scheduler
from cranectl.__main__ import render_explain
from tests.support.scheduler_cluster import (
    child_process,
    config_for,
    create_nodes,
    create_pods,
    events,
    in_process,
    node,
    wait_for,
)

PLUGIN = "NodeResourceTopologyMatch"


def topology(name: str, cpus: list[int]) -> dict[str, Any]:
    """The NRT crane-agent would publish for a node whose NUMA node i has ``cpus[i]`` CPUs and 8Gi."""
    numa, first = [], 0
    for i, count in enumerate(cpus):
        numa.append(NumaNode(i, tuple(range(first, first + count)), 8 * 1024**3))
        first += count
    return build_topology(name, numa)


def guaranteed(name: str, scheduler: str, cpu: str) -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": "256Mi"}
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {"name": "c", "image": "pause", "resources": {"requests": resources, "limits": dict(resources)}}
            ],
        },
    }


@contextlib.asynccontextmanager
async def with_nrt_plugin(cluster: LocalCluster, scheduler_name: str, selector: str) -> AsyncIterator[Scheduler]:
    """The scheduler with the plugin enabled (weight 2, as upstream ships it) and its NRT watch running."""
    config = config_for(
        scheduler_name, profile={"plugins": {"multiPoint": {"enabled": [{"name": PLUGIN, "weight": 2}]}}}
    )
    async with in_process(cluster, config, selector) as scheduler:  # runs the plugin's NRT watch, as the service
        plugin = scheduler.profiles[scheduler_name].plugins[PLUGIN]
        assert isinstance(plugin, NodeResourceTopologyMatch)

        async def synced() -> bool:
            return bool(plugin.synced)

        await wait_for(synced, what="the NRT list")
        yield scheduler


async def pod_json(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    resp = await client.CoreV1Api(kube).read_namespaced_pod(name, namespace, _preload_content=False)
    body: dict[str, Any] = json.loads(await resp.read())
    resp.release()
    return body


async def test_whole_cpu_pods_get_a_numa_zone_and_never_share_it(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    await create_nodes(kube, [node(f"{group}-{s}", group, cpu="8", memory="32Gi") for s in ("split", "numa", "bare")])
    # split: 6 free CPUs but no zone with 4; numa: node1 has 4; bare: no NRT at all
    await publish_topologies(kube, [topology(f"{group}-split", [3, 3]), topology(f"{group}-numa", [2, 4])])
    expected_pending = (
        "0/3 nodes are available: 1 node(s) failed to get NRT, 2 node(s) had insufficient resource of NUMA node. "
        "preemption: 0/3 nodes are available: 3 No preemption victims found for "
        "incoming pod."
    )

    async with with_nrt_plugin(cluster, scheduler_name, selector) as scheduler:
        await create_pods(kube, namespace, [guaranteed("first", scheduler_name, "4")])

        async def bound_first() -> dict[str, Any] | None:
            p = await pod_json(kube, namespace, "first")
            return p if p["spec"].get("nodeName") else None

        first = await wait_for(bound_first, what="the first pod to bind")
        assert first["spec"]["nodeName"] == f"{group}-numa"
        assert first["metadata"]["annotations"][ANNOTATION_RESULT] == (
            '[{"name":"node1","type":"Node","resources":{"capacity":{"cpu":"4"}}}]'
        )

        await create_pods(kube, namespace, [guaranteed("second", scheduler_name, "4")])

        async def second_failed() -> list[dict[str, Any]]:
            # only the second pod's: the first may have had a retried attempt of its own on a loaded machine
            return [e for e in await events(kube, namespace, "FailedScheduling") if e["regarding"]["name"] == "second"]

        failed = await wait_for(second_failed, what="the second pod's FailedScheduling")
        assert failed[0]["note"] == expected_pending

        # an NRT update (still no zone with 4 CPUs) reaches the plugin through its watch
        nrt_plugin = scheduler.profiles[scheduler_name].plugins[PLUGIN]
        assert isinstance(nrt_plugin, NodeResourceTopologyMatch)
        await publish_topologies(kube, [topology(f"{group}-split", [3, 2])])

        async def updated() -> bool:
            topo = nrt_plugin.topologies.get(f"{group}-split")
            return topo is not None and topo.zones[1].allocatable["cpu"] == 2000

        await wait_for(updated, what="the NRT update to reach the plugin")

    # A restarted scheduler rebuilds the zone usage from the result on the bound pod: still no room.
    async with with_nrt_plugin(cluster, scheduler_name, selector) as restarted:
        uid = first["metadata"]["uid"]
        plugin = restarted.profiles[scheduler_name].plugins[PLUGIN]
        assert isinstance(plugin, NodeResourceTopologyMatch)
        assert plugin.usage.result_of(uid) is not None
        second = await pod_json(kube, namespace, "second")
        assert second["spec"].get("nodeName") is None

        # Attempts before the NRT list completes get a retriable error; the next one sees the zones.
        async def decided() -> Any:
            decision = restarted.decisions.get(f"{namespace}/second")
            return decision if decision is not None and decision.message == expected_pending else None

        decision = await wait_for(decided, what="the restarted scheduler's attempt at the second pod")
        assert decision.node is None
        assert (await pod_json(kube, namespace, "second"))["spec"].get("nodeName") is None


async def _http_json(port: int, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as r:
        return r.status, json.loads(await r.text()) if r.status == 200 else None


async def test_crane_scheduler_process_watches_nrts_and_explains_the_zone(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    """The real command: its NRT watch starts with it, and ``cranectl explain`` names the zone it chose."""
    await create_nodes(kube, [node(f"{group}-{s}", group, cpu="8", memory="32Gi") for s in ("a", "b")])
    await publish_topologies(kube, [topology(f"{group}-a", [2, 2]), topology(f"{group}-b", [1, 4])])
    # the agent republishes b with its zones the other way round (a merge patch replacing the zones)
    await publish_topologies(kube, [topology(f"{group}-b", [4, 1])])
    config = config_for(
        scheduler_name, profile={"plugins": {"multiPoint": {"enabled": [{"name": PLUGIN, "weight": 2}]}}}
    )
    proc, port = child_process(cluster, config, selector, f"{namespace}-nrt", cluster.run_dir)
    await proc.start()
    try:

        async def ready() -> bool:
            return (await _http_json(port, "/readyz"))[0] == 200

        await proc.wait_ready(ready, timeout=30)
        await create_pods(kube, namespace, [guaranteed("web", scheduler_name, "4")])

        async def bound() -> dict[str, Any] | None:
            p = await pod_json(kube, namespace, "web")
            return p if p["spec"].get("nodeName") else None

        web = await wait_for(bound, what="the pod to bind")
        status, body = await _http_json(port, f"/debug/explain/{namespace}/web")
    finally:
        await proc.stop()
    assert web["spec"]["nodeName"] == f"{group}-b"
    assert web["metadata"]["annotations"][ANNOTATION_RESULT] == (
        '[{"name":"node0","type":"Node","resources":{"capacity":{"cpu":"4"}}}]'
    )
    assert status == 200
    assert body["result"] == {"node": f"{group}-b", "numaZones": [{"name": "node0", "capacity": {"cpu": "4"}}]}
    assert "NUMA zones: node0 (cpu=4)" in render_explain(body)
