"""InterPodAffinity and PodTopologySpread on the real API server: what a user deploying replicas observes."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from tests.support.scheduler_cluster import (
    config_for,
    create_nodes,
    create_pods,
    events,
    in_process,
    node,
    node_of,
    pod,
    pods_json,
    wait_for,
)

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def labelled(body: dict[str, Any], **labels: str) -> dict[str, Any]:
    body["metadata"]["labels"] = labels
    return body


def required(kind: str, key: str, **selector: str) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": selector}, "topologyKey": key}
    return {"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}


async def placements(kube: client.ApiClient, namespace: str, prefix: str) -> dict[str, str | None]:
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName")
        for p in await pods_json(kube, namespace)
        if p["metadata"]["name"].startswith(prefix)
    }


async def test_replicas_with_required_anti_affinity_take_one_node_each_and_the_fourth_stays_pending(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    await create_nodes(kube, [node(f"{group}-{i}", group) for i in range(3)])
    spec = required("podAntiAffinity", HOST, app="web")
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(
            kube, namespace, [labelled(pod(f"web-{i}", scheduler_name, spec=spec), app="web") for i in range(4)]
        )

        async def three_bound() -> dict[str, str | None] | None:
            now = await placements(kube, namespace, "web-")
            return now if sum(1 for n in now.values() if n) == 3 else None

        placed = await wait_for(three_bound, what="three replicas to bind")
        failed = await wait_for(lambda: events(kube, namespace, "FailedScheduling"), what="FailedScheduling")
    nodes = [n for n in placed.values() if n]
    assert sorted(nodes) == sorted(f"{group}-{i}" for i in range(3))  # one replica per node
    # kube-scheduler's Filter message (its DefaultPreemption would add a "preemption: ..." sentence after it).
    assert failed[0]["note"].startswith("0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules.")


async def test_zone_spread_constraint_balances_replicas_across_zones(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    zones = {f"{group}-a1": "a", f"{group}-a2": "a", f"{group}-b1": "b", f"{group}-b2": "b"}
    await create_nodes(kube, [node(name, group, labels={ZONE: z}) for name, z in zones.items()])
    # Two replicas already run in zone a (bound by someone else).
    await create_pods(
        kube,
        namespace,
        [labelled(pod(f"old-{i}", "nobody", node_name=f"{group}-a{i + 1}"), app="web") for i in range(2)],
    )
    spread = {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}},
            }
        ]
    }
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(
            kube, namespace, [labelled(pod(f"new-{i}", scheduler_name, spec=spread), app="web") for i in range(4)]
        )

        async def all_bound() -> dict[str, str | None] | None:
            now = await placements(kube, namespace, "new-")
            return now if all(now.values()) and len(now) == 4 else None

        placed = await wait_for(all_bound, what="four replicas to bind")
    per_zone = Counter(zones[n] for n in placed.values() if n)
    assert per_zone == {"a": 1, "b": 3}  # 2 + 1 in zone a, 3 in zone b: the skew never exceeded 1


async def test_required_affinity_lands_next_to_its_peer_and_waits_for_one(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    await create_nodes(kube, [node(f"{group}-{i}", group) for i in range(3)])
    spec = required("podAffinity", HOST, app="db")
    async with in_process(cluster, config_for(scheduler_name), selector) as scheduler:
        await create_pods(kube, namespace, [labelled(pod("cache", scheduler_name, spec=spec), app="cache")])
        failed = await wait_for(lambda: events(kube, namespace, "FailedScheduling"), what="no peer yet")
        assert failed[0]["note"] == (
            "0/3 nodes are available: 3 node(s) didn't match pod affinity rules. "
            "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
        )
        await wait_for(lambda: _unschedulable(scheduler), what="the pod to wait among the unschedulable")
        added = time.monotonic()
        await create_pods(kube, namespace, [labelled(pod("db", "nobody", node_name=f"{group}-2"), app="db")])
        landed = await wait_for(lambda: node_of(kube, namespace, "cache"), interval=0.05, what="the pod to bind")
        elapsed = time.monotonic() - added
    assert landed == f"{group}-2"
    assert elapsed < 5.0, f"the peer's arrival should wake the pod, took {elapsed:.1f}s"


async def _unschedulable(scheduler: Any) -> bool:
    return len(scheduler.queue.unschedulable) == 1


def _sample(scheduler: Any, name: str, labels: dict[str, str]) -> float:
    return scheduler.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_an_unrelated_bound_pod_does_not_wake_a_pod_waiting_for_its_peer_but_the_peer_does(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    """InterPodAffinity's queueing hint (kube's ``isSchedulableAfterPodChange``) judges each added pod: one its
    terms do not select leaves the waiting pod where it is, the peer moves it (the queue's metrics show which)."""
    await create_nodes(kube, [node(f"{group}-{i}", group) for i in range(2)])
    spec = required("podAffinity", HOST, app="db")
    async with in_process(cluster, config_for(scheduler_name), selector) as scheduler:
        await create_pods(kube, namespace, [labelled(pod("cache", scheduler_name, spec=spec), app="cache")])
        await wait_for(lambda: _unschedulable(scheduler), what="the pod to wait among the unschedulable")
        attempts = next(iter(scheduler.queue.unschedulable.values())).attempts
        await create_pods(kube, namespace, [labelled(pod("web", "nobody", node_name=f"{group}-0"), app="web")])

        async def skipped() -> bool:
            return _sample(scheduler, "crane_scheduler_queue_hint_skips_total", {"plugin": "InterPodAffinity"}) > 0

        await wait_for(skipped, what="InterPodAffinity's hint to judge the unrelated pod")
        waiting = list(scheduler.queue.unschedulable.values())
        assert [qp.pod.name for qp in waiting] == ["cache"] and waiting[0].attempts == attempts
        assert _sample(scheduler, "scheduler_queue_incoming_pods_total", {"event": "POD_ADD", "queue": "active"}) == 0
        await create_pods(kube, namespace, [labelled(pod("db", "nobody", node_name=f"{group}-1"), app="db")])
        landed = await wait_for(lambda: node_of(kube, namespace, "cache"), interval=0.05, what="the pod to bind")
        moved = sum(
            _sample(scheduler, "scheduler_queue_incoming_pods_total", {"event": "POD_ADD", "queue": q})
            for q in ("active", "backoff")
        )
    assert landed == f"{group}-1"
    assert moved == 1
