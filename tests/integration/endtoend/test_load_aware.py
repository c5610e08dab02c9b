"""Load-aware scheduling end to end: API server, Redis, Prometheus, event-recorder, annotator and scheduler,
each a real process, on simulated nodes whose node-exporter series follow the pods bound to them."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, TypeVar

import pytest
from kubernetes_asyncio import client

from crane_sandbox.fleet import make_fleet
from crane_sandbox.sandbox import Sandbox, comparison_config
from crane_shared.kube import api_client_from_dict
from tests.support.waiting import eventually

T = TypeVar("T")

SCHEDULER_CONFIG = comparison_config()


def fleet() -> list[Any]:
    hot = make_fleet(4, prefix="hot-", labels={"group": "hot"})
    hot[0] = replace(hot[0], base_cpu_fraction=0.9)
    graded = []
    for group in ("ours", "upstream"):
        nodes = make_fleet(10, prefix=f"{group}-", labels={"group": group}, base_cpu_fraction=0.1)
        graded += [
            replace(n, base_cpu_fraction=0.10 + 0.02 * i, internal_ip=f"10.{1 if group == 'ours' else 2}.0.{i + 1}")
            for i, n in enumerate(nodes)
        ]
    return hot + graded


@pytest.fixture(scope="module")
async def stack() -> AsyncIterator[tuple[Sandbox, client.ApiClient]]:
    sandbox = Sandbox(fleet=fleet(), scheduler_config=SCHEDULER_CONFIG)
    await sandbox.start()
    assert sandbox.cluster is not None
    api = await api_client_from_dict(sandbox.cluster.kubeconfig_dict())
    await client.CoreV1Api(api).create_namespace({"metadata": {"name": "e2e"}})
    try:
        yield sandbox, api
    finally:
        await api.close()
        await sandbox.stop()


async def annotated(api: client.ApiClient, node: str, metric: str = "cpu_usage_avg_5m") -> float | None:
    n = await client.CoreV1Api(api).read_node(node)
    value = (n.metadata.annotations or {}).get(metric)
    return float(value.split(",")[0]) if value else None


def pod(name: str, scheduler: str, group: str, cpu: str = "100m") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {"group": group},
            "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}],
        },
    }


async def placements(api: client.ApiClient, prefix: str, count: int) -> Counter[str]:
    async def all_bound() -> Counter[str] | None:
        pods = await client.CoreV1Api(api).list_namespaced_pod("e2e")
        nodes = [p.spec.node_name for p in pods.items if p.metadata.name.startswith(prefix) and p.spec.node_name]
        return Counter(nodes) if len(nodes) == count else None

    return await eventually(all_bound, 60, f"{count} pods {prefix}* bound", interval=0.5)


async def test_a_pod_avoids_a_node_whose_real_load_is_above_threshold(stack: tuple[Sandbox, Any]) -> None:
    _, api = stack
    await eventually(lambda: _over(api, "hot-0001", 0.65), 90, "hot-0001 annotated above 0.65", interval=0.5)
    v1 = client.CoreV1Api(api)
    for i in range(6):
        await v1.create_namespaced_pod("e2e", pod(f"avoid-{i}", "crane-scheduler", "hot"))
    where = await placements(api, "avoid-", 6)
    assert "hot-0001" not in where, where


async def test_fit_error_groups_the_load_reason(stack: tuple[Sandbox, Any]) -> None:
    _, api = stack
    await eventually(lambda: _over(api, "hot-0001", 0.65), 90, "hot-0001 annotated above 0.65", interval=0.5)
    v1 = client.CoreV1Api(api)
    body = pod("pinned", "crane-scheduler", "hot")
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "hot-0001"}
    await v1.create_namespaced_pod("e2e", body)

    async def failed() -> str | None:
        events = await client.EventsV1Api(api).list_namespaced_event("e2e")
        notes = [e.note for e in events.items if e.regarding.name == "pinned" and e.reason == "FailedScheduling"]
        return notes[-1] if notes else None

    note = await eventually(failed, 30, "a FailedScheduling event", interval=0.5)
    assert note == (
        f"0/{24} nodes are available: 1 node(s) had cpu_usage_avg_5m above 0.65, "
        "23 node(s) didn't match Pod's node affinity/selector. "
        # DynamicResources' PostFilter, then DefaultPreemption (kube's default profile): only the loaded node could
        # be helped by preemption
        "preemption: 0/24 nodes are available: 1 No preemption victims found for "
        "incoming pod, "
        "23 Preemption is not helpful for scheduling."
    )
    status = (await v1.read_namespaced_pod("pinned", "e2e")).status
    condition = next(c for c in status.conditions if c.type == "PodScheduled")
    assert (condition.status, condition.reason, condition.message) == ("False", "Unschedulable", note)


async def test_a_burst_spreads_where_a_stale_hot_value_piles_up(stack: tuple[Sandbox, Any]) -> None:
    _, api = stack
    for node in ("ours-0010", "upstream-0010"):
        await eventually(lambda: annotated(api, node), 90, f"{node} annotated", interval=0.5)  # noqa: B023 (awaited at once)
    v1 = client.CoreV1Api(api)
    await asyncio.gather(
        *(v1.create_namespaced_pod("e2e", pod(f"burst-ours-{i}", "crane-scheduler", "ours")) for i in range(30))
    )
    await asyncio.gather(
        *(v1.create_namespaced_pod("e2e", pod(f"burst-up-{i}", "crane-upstream-style", "upstream")) for i in range(30))
    )
    ours = await placements(api, "burst-ours-", 30)
    upstream = await placements(api, "burst-up-", 30)
    even = 30 / 10
    assert max(ours.values()) <= 2 * even, ours
    assert max(upstream.values()) > 2 * even, upstream


async def _over(api: client.ApiClient, node: str, limit: float) -> bool:
    value = await annotated(api, node)
    return value is not None and value > limit
