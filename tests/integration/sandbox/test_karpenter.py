"""``--autoscaler karpenter``: the real Karpenter (KWOK provider) grows the sandbox for a pod no node can take,
KWOK plays the new node's kubelet, the node joins the simulated fleet with its own series, crane-scheduler places
the pod there, and once the node is empty Karpenter removes it and the fleet drops it.

Karpenter is built on demand (many minutes the first time), never by scripts/setup: these tests run where it is
built (``python -m crane_sandbox.kubebin karpenter``) or with ``CRANE_TEST_KARPENTER=1`` (which builds it)."""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from crane_sandbox.karpenter import GROUP, NODEPOOL, NodePoolSettings
from crane_sandbox.kubebin import built_karpenter
from crane_sandbox.sandbox import Sandbox
from crane_sandbox.topology import TopologySpec
from crane_shared.kube import api_client_from_dict, raw_json

pytestmark = pytest.mark.skipif(
    built_karpenter() is None and not os.environ.get("CRANE_TEST_KARPENTER"),
    reason="Karpenter is not built here (python -m crane_sandbox.kubebin karpenter, or CRANE_TEST_KARPENTER=1)",
)

NODEPOOL_LABEL = "karpenter.sh/nodepool"


@pytest.fixture(scope="module")
async def grown() -> AsyncIterator[tuple[Sandbox, client.ApiClient]]:
    sb = Sandbox(
        nodes=1,
        services=("scheduler",),
        autoscaler="karpenter",
        nodepool=NodePoolSettings(max_nodes=2, consolidate_after="5s"),
        topology=TopologySpec(0),
    )
    await sb.start()
    assert sb.cluster is not None
    api = await api_client_from_dict(sb.cluster.kubeconfig_dict())
    try:
        yield sb, api
    finally:
        await api.close()
        await sb.stop()


async def until(what: str, check: Callable[[], Awaitable[Any]], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"after {timeout:.0f}s: {what}"
        await asyncio.sleep(0.5)


def big_pod(name: str) -> dict[str, Any]:
    """5 CPUs: two never fit on one 8-CPU node."""
    resources = {"requests": {"cpu": "5", "memory": "1Gi"}}
    return {
        "metadata": {"name": name, "annotations": {"sandbox.crane.io/usage": "cpu=3"}},
        "spec": {"containers": [{"name": "c", "image": "app", "resources": resources}]},
    }


async def test_a_pod_no_node_can_take_gets_a_node_that_joins_the_fleet_and_goes_once_empty(
    grown: tuple[Sandbox, client.ApiClient],
) -> None:
    sandbox, api = grown
    state, exporter, prometheus = sandbox.state, sandbox.exporter, sandbox.prometheus
    assert state is not None and exporter is not None and prometheus is not None
    v1 = client.CoreV1Api(api)
    for name in ("first", "second"):
        await raw_json(v1.create_namespaced_pod("default", big_pod(name), _preload_content=False))

    async def placed(name: str) -> str:
        pod = await raw_json(v1.read_namespaced_pod(name, "default", _preload_content=False))
        running = (pod.get("status") or {}).get("phase") == "Running"
        return str(pod["spec"].get("nodeName")) if running else ""

    where = {n: await until(f"{n} Running", functools.partial(placed, n), timeout=180) for n in ("first", "second")}
    added = set(where.values()) - {"node-0001"}
    assert len(added) == 1, where  # one pod on the sandbox's node, the other on Karpenter's
    new = added.pop()
    body = await raw_json(v1.read_node(new, _preload_content=False))
    assert body["metadata"]["labels"][NODEPOOL_LABEL] == NODEPOOL
    custom = client.CustomObjectsApi(api)

    async def claimed() -> list[str]:
        claims = await raw_json(custom.list_cluster_custom_object(GROUP, "v1", "nodeclaims", _preload_content=False))
        names = [c.get("status", {}).get("nodeName") for c in claims["items"]]
        return names if all(names) else []  # registered: the claim names its node

    assert await until("the NodeClaim naming its node", claimed, timeout=30) == [new]

    # the new node is simulated like the others: its series, under its name, carry the pod's 3 CPUs of 8
    assert new in state.nodes
    assert state.usage(new)[0] == pytest.approx(0.10 + 3 / 8)
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{exporter.port}/metrics") as resp:
        text = await resp.text()
    assert f'node_cpu_seconds_total{{cpu="0",instance="{new}",mode="idle"}}' in text
    series = f'node_cpu_seconds_total{{instance="{new}",mode="idle"}}'
    await until("Prometheus scraping the new node", lambda: prometheus.query(series), timeout=60)

    # empty, it goes (consolidateAfter 5 s), and the fleet forgets it
    on_new = next(pod for pod, node in where.items() if node == new)
    await raw_json(v1.delete_namespaced_pod(on_new, "default", grace_period_seconds=0, _preload_content=False))

    async def gone() -> bool:
        listed = await raw_json(v1.list_node(_preload_content=False))
        return new not in {n["metadata"]["name"] for n in listed["items"]}

    await until("Karpenter removing the empty node", gone, timeout=120)
    await until("the fleet dropping it", lambda: asyncio.sleep(0, result=new not in state.nodes), timeout=10)
