"""Each built-in plugin decides a placement a user would check, on the real API server."""

from __future__ import annotations

from typing import Any

import pytest
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

NO_SCHEDULE = {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}
PREFER_NOT = {"key": "spot", "value": "true", "effect": "PreferNoSchedule"}


def _affinity(key: str, value: str, *, preferred: bool = False) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
    if preferred:
        return {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": term}]
                }
            }
        }
    return {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    }


# (case, nodes as (suffix, node kwargs), pod kwargs, bound pods as (suffix, pod kwargs), expected node suffix)
CASES: list[tuple[str, list[tuple[str, dict[str, Any]]], dict[str, Any], list[tuple[str, dict[str, Any]]], str]] = [
    (
        "NodeResourcesFit: only one node has 3 free cores",
        [("small", {"cpu": "2"}), ("big", {"cpu": "8"}), ("busy", {"cpu": "8"})],
        {"cpu": "3"},
        [("busy", {"cpu": "6"})],
        "big",
    ),
    (
        "TaintToleration: untolerated NoSchedule taints",
        [("t1", {"taints": [NO_SCHEDULE]}), ("clean", {}), ("t2", {"taints": [NO_SCHEDULE]})],
        {},
        [],
        "clean",
    ),
    (
        "TaintToleration: PreferNoSchedule lowers the score",
        [("spot", {"taints": [PREFER_NOT]}), ("ondemand", {})],
        {},
        [],
        "ondemand",
    ),
    (
        "NodeUnschedulable: cordoned nodes are skipped",
        [("c1", {"unschedulable": True}), ("open", {}), ("c2", {"unschedulable": True})],
        {},
        [],
        "open",
    ),
    (
        "NodeAffinity: nodeSelector",
        [("a", {"labels": {"zone": "a"}}), ("b", {"labels": {"zone": "b"}})],
        {"spec": {"nodeSelector": {"zone": "b"}}},
        [],
        "b",
    ),
    (
        "NodeAffinity: required term",
        [("a", {"labels": {"disk": "hdd"}}), ("b", {"labels": {"disk": "ssd"}})],
        {"spec": _affinity("disk", "ssd")},
        [],
        "b",
    ),
    (
        "NodeAffinity: preferred term scores",
        [("a", {"labels": {"disk": "hdd"}}), ("b", {"labels": {"disk": "ssd"}})],
        {"spec": _affinity("disk", "ssd", preferred=True)},
        [],
        "b",
    ),
    (
        "NodePorts: host port taken on the other nodes",
        [("p1", {}), ("free", {}), ("p2", {})],
        {"ports": [{"containerPort": 80, "hostPort": 8080}]},
        [
            ("p1", {"ports": [{"containerPort": 80, "hostPort": 8080}]}),
            ("p2", {"ports": [{"containerPort": 80, "hostPort": 8080}]}),
        ],
        "free",
    ),
    (
        "NodeResourcesFit LeastAllocated: the emptier node",
        [("loaded", {}), ("empty", {})],
        {},
        [("loaded", {"cpu": "2", "memory": "8Gi"})],
        "empty",
    ),
]


@pytest.mark.parametrize(("case", "nodes", "pod_kw", "bound", "expected"), CASES, ids=[c[0] for c in CASES])
async def test_pod_lands_on_the_one_node_the_plugin_allows(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
    case: str,
    nodes: list[tuple[str, dict[str, Any]]],
    pod_kw: dict[str, Any],
    bound: list[tuple[str, dict[str, Any]]],
    expected: str,
) -> None:
    await create_nodes(kube, [node(f"{group}-{suffix}", group, **kw) for suffix, kw in nodes])
    await create_pods(
        kube,
        namespace,
        [pod(f"bound-{i}", "nobody", node_name=f"{group}-{suffix}", **kw) for i, (suffix, kw) in enumerate(bound)],
    )
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(kube, namespace, [pod("p", scheduler_name, **pod_kw)])
        landed = await wait_for(lambda: node_of(kube, namespace, "p"), what="the pod to be bound")
    assert landed == f"{group}-{expected}"
    scheduled = await wait_for(lambda: events(kube, namespace, "Scheduled"), what="the Scheduled event")
    assert scheduled[0]["note"] == f"Successfully assigned {namespace}/p to {group}-{expected}"
    assert scheduled[0]["reportingController"] == scheduler_name and scheduled[0]["action"] == "Binding"


async def test_pod_that_fits_nowhere_stays_pending_with_kube_schedulers_message(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
) -> None:
    await create_nodes(
        kube,
        [
            node(f"{group}-small", group, cpu="1"),
            node(f"{group}-tainted-1", group, cpu="8", taints=[NO_SCHEDULE]),
            node(f"{group}-tainted-2", group, cpu="8", taints=[NO_SCHEDULE]),
        ],
    )
    expected = (
        # the pod asks more than the small node has at all: kube calls that unresolvable, preemption too (1.37's
        # DynamicResources adds nothing to PostFilter's message without a claim to free; 1.35 said "no new claims
        # to deallocate")
        "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) had untolerated taint(s). preemption: 0/3 "
        "nodes are available: 3 Preemption is not helpful for scheduling."
    )
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(kube, namespace, [pod("stuck", scheduler_name, cpu="2")])
        failed = await wait_for(lambda: events(kube, namespace, "FailedScheduling"), what="FailedScheduling")

        async def condition() -> dict[str, Any] | None:
            conds = (await pods_json(kube, namespace))[0]["status"].get("conditions") or []
            return next((c for c in conds if c["type"] == "PodScheduled"), None)

        cond = await wait_for(condition, what="the PodScheduled condition")
    assert failed[0]["note"] == expected and failed[0]["type"] == "Warning" and failed[0]["action"] == "Scheduling"
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", expected)
    assert await node_of(kube, namespace, "stuck") is None


async def test_unschedulable_pod_binds_within_seconds_of_a_node_being_added(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
) -> None:
    await create_nodes(kube, [node(f"{group}-small", group, cpu="1")])
    async with in_process(cluster, config_for(scheduler_name), selector) as scheduler:
        await create_pods(kube, namespace, [pod("waiting", scheduler_name, cpu="2")])
        await wait_for(lambda: events(kube, namespace, "FailedScheduling"), what="the first failed attempt")
        assert len(scheduler.queue.unschedulable) == 1
        import time

        added = time.monotonic()
        await create_nodes(kube, [node(f"{group}-new", group, cpu="4")])
        landed = await wait_for(
            lambda: node_of(kube, namespace, "waiting"),
            timeout=60,
            interval=0.05,
            what="the pod to bind on the new node",
        )
        elapsed = time.monotonic() - added
    assert landed == f"{group}-new"
    # Requeued by the node's arrival, not by the flush of pods unschedulable for 5 min (MAX_UNSCHEDULABLE_DURATION)
    # nor a backoff: a bound far below the flush, with most of a minute left for a loaded machine.
    assert elapsed < 60, f"took {elapsed:.1f}s"


async def test_higher_priority_pods_are_scheduled_first(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
) -> None:
    sched = client.SchedulingV1Api(kube)
    for name, value in (("low", 10), ("high", 1000)):
        await sched.create_priority_class({"metadata": {"name": f"{namespace}-{name}"}, "value": value})
    # Room for two 1-core pods; the three pods exist before the scheduler starts, low-priority ones first.
    await create_nodes(kube, [node(f"{group}-only", group, cpu="2")])
    for name, prio in (("low-1", "low"), ("low-2", "low"), ("high", "high")):
        await create_pods(
            kube, namespace, [pod(name, scheduler_name, cpu="1", spec={"priorityClassName": f"{namespace}-{prio}"})]
        )
    async with in_process(cluster, config_for(scheduler_name), selector):

        async def bound() -> list[str]:
            return sorted(p["metadata"]["name"] for p in await pods_json(kube, namespace) if p["spec"].get("nodeName"))

        await wait_for(lambda: events(kube, namespace, "FailedScheduling"), what="the third pod to fail")

        async def both_bound() -> list[str] | None:
            now = await bound()
            return now if len(now) == 2 else None

        # low-1's bind may still be on its way when low-2's FailedScheduling event is written: wait for it
        got = await wait_for(both_bound, what="the two pods that fit to be bound")
        assert got == ["high", "low-1"]  # priority first, then arrival among equals
