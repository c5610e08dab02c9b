"""Gangs (Coscheduling, PodGroup) on the real API server, with the real ``crane-scheduler`` command under the
chart's RBAC: all or nothing, no capacity held while waiting, no deadlock between gangs, the timeout, a member
replaced mid-wait, the Workload API, Dynamic's ``gangHotValue: together``."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster, workload_api_version
from crane_shared.annotations import encode_usage
from crane_shared.kube import raw_json
from cranectl.__main__ import render_explain
from tests.support.gangs import COSCHEDULING, create_group, members, read_group
from tests.support.policy import UPSTREAM_METRICS
from tests.support.scheduler_cluster import (
    child_process,
    config_for,
    create_nodes,
    create_pods,
    delete_pods,
    events,
    node,
    pod,
    pods_json,
    wait_for,
)

WAIT = 60.0  # generous: the CI machine is loaded; every wait ends on an event, not on this


@contextlib.asynccontextmanager
async def gang_scheduler(
    cluster: LocalCluster, scheduler_name: str, selector: str, name: str, profile: dict[str, Any] = COSCHEDULING
) -> AsyncIterator[int]:
    """The real command with ``profile`` (Coscheduling in place of PrioritySort by default), ready; yields its
    HTTP port."""
    proc, port = child_process(cluster, config_for(scheduler_name, profile=profile), selector, name, cluster.run_dir)
    await proc.start()
    try:

        async def ready() -> bool:
            async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/readyz") as r:
                return r.status == 200

        await proc.wait_ready(ready, timeout=30)
        yield port
    finally:
        await proc.stop()


async def placement(kube: client.ApiClient, namespace: str) -> dict[str, str | None]:
    return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in await pods_json(kube, namespace)}


async def all_bound(kube: client.ApiClient, namespace: str, names: list[str]) -> dict[str, str | None] | None:
    placed = await placement(kube, namespace)
    return placed if all(placed.get(n) for n in names) else None


async def failed_notes(kube: client.ApiClient, namespace: str) -> dict[str, set[str]]:
    notes: dict[str, set[str]] = {}
    for e in await events(kube, namespace, "FailedScheduling"):
        notes.setdefault(e["regarding"]["name"], set()).add(e.get("note", ""))
    return notes


async def test_a_gang_binds_whole_or_not_at_all_and_a_waiting_gang_holds_no_room(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    await create_nodes(kube, [node(f"{group}-{i}", group, cpu="2") for i in range(2)])  # 4 cpus in all
    await create_group(kube, namespace, "fits", 3)
    await create_group(kube, namespace, "big", 2)
    async with gang_scheduler(cluster, scheduler_name, selector, f"{namespace}-gangs") as port:
        await create_pods(kube, namespace, members("fits", scheduler_name, 3))
        fits = [f"fits-{i}" for i in range(3)]
        await wait_for(lambda: all_bound(kube, namespace, fits), WAIT, what="every member of the gang to bind")

        async def scheduled() -> dict[str, Any] | None:
            status = (await read_group(kube, namespace, "fits")).get("status") or {}
            return status if status.get("scheduled") == 3 else None

        status = await wait_for(scheduled, WAIT, what="the PodGroup's status to count its bound members")
        assert status["phase"] == "Scheduling" and status["scheduleStartTime"]  # no kubelet: nothing runs

        # 1 cpu left: a gang of two 1-cpu members cannot fit; neither binds, and neither holds the cpu
        await create_pods(kube, namespace, members("big", scheduler_name, 2))

        async def rejected() -> dict[str, set[str]] | None:
            # the member that fits hears the group's rejection (its earlier note, while its sibling was not
            # created yet, is PreFilter's count); the events of one cycle land in any order
            notes = await failed_notes(kube, namespace)
            whole = {"big-0", "big-1"} <= set(notes)
            return notes if whole and "PodGroup" in " ".join(notes["big-0"] | notes["big-1"]) else None

        await wait_for(rejected, WAIT, what="both members of the gang that cannot fit to be refused, as a group")
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/debug/explain/{namespace}/big-0") as r,
        ):
            explained = render_explain(json.loads(await r.text()))
        assert f"gang {namespace}/big: waiting: 1 member(s) found places, 0 placed before, minMember 2" in explained
        await create_pods(kube, namespace, [pod("loose", scheduler_name, cpu="1")])
        placed = await wait_for(lambda: all_bound(kube, namespace, ["loose"]), WAIT, what="a pod of no group")
        assert placed["big-0"] is None and placed["big-1"] is None


async def test_two_interleaved_gangs_that_fit_one_at_a_time_both_complete_in_turn(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    await create_nodes(kube, [node(f"{group}-0", group, cpu="2")])  # room for one gang of two
    await create_group(kube, namespace, "a", 2)
    await create_group(kube, namespace, "b", 2)
    async with gang_scheduler(cluster, scheduler_name, selector, f"{namespace}-gangs"):
        a, b = members("a", scheduler_name, 2), members("b", scheduler_name, 2)
        await create_pods(kube, namespace, [a[0], b[0], a[1], b[1]], concurrency=1)  # interleaved

        async def one_gang_whole() -> dict[str, str | None] | None:
            placed = await placement(kube, namespace)
            whole = [g for g in ("a", "b") if placed.get(f"{g}-0") and placed.get(f"{g}-1")]
            return placed if whole else None

        placed = await wait_for(one_gang_whole, WAIT, what="one gang to bind whole")
        first = "a" if placed.get("a-0") else "b"
        second = "b" if first == "a" else "a"
        assert placed[f"{second}-0"] is None and placed[f"{second}-1"] is None  # never half of each
        await delete_pods(kube, namespace, [f"{first}-0", f"{first}-1"])  # the first gang's job is done
        await wait_for(lambda: all_bound(kube, namespace, [f"{second}-0", f"{second}-1"]), WAIT, what="the second gang")


async def test_a_gang_that_waits_past_its_timeout_is_rejected_and_a_member_replaced_mid_wait_completes_it(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    await create_nodes(kube, [node(f"{group}-0", group, cpu="1")])
    await create_group(kube, namespace, "slow", 2, scheduleTimeoutSeconds=2)
    small, big = members("slow", scheduler_name, 2, cpu="500m")
    big["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1"  # never fits next to the other
    async with gang_scheduler(cluster, scheduler_name, selector, f"{namespace}-gangs"):
        await create_pods(kube, namespace, [small, big])
        timeout = "rejected due to timeout after waiting 2s at plugin Coscheduling"

        async def timed_out() -> dict[str, set[str]] | None:
            notes = await failed_notes(kube, namespace)
            return notes if any(timeout in n for n in notes.values()) else None

        notes = await wait_for(timed_out, WAIT, what="the group's timeout")
        every = " ".join(n for member in notes.values() for n in member)
        assert "PodGroup " + f"{namespace}/slow gets rejected due to Pod slow-" in every  # the wait before it
        assert await placement(kube, namespace) == {"slow-0": None, "slow-1": None}

        # the member that cannot fit is deleted mid-wait (its Job replaces it): the group completes
        await delete_pods(kube, namespace, ["slow-1"])
        replacement = members("slow", scheduler_name, 3, cpu="500m")[2]
        await create_pods(kube, namespace, [replacement])
        await wait_for(lambda: all_bound(kube, namespace, ["slow-0", "slow-2"]), WAIT, what="the completed group")


WORKLOAD_API = {"plugins": {"multiPoint": {"enabled": [{"name": "GangScheduling"}]}}}


async def create_workload_gangs(
    kube: client.ApiClient, cluster: LocalCluster, namespace: str, groups: dict[str, int]
) -> dict[str, dict[str, Any]]:
    """The Workload API of the cluster's release, with a gang policy per group (minCount): 1.37's PodGroup objects
    (``scheduling.k8s.io/v1beta1``), or 1.35's Workload listing them (``v1alpha1``); returns the ``spec`` field
    a member of each group carries (``schedulingGroup``, or ``workloadRef``)."""
    assert cluster.binaries is not None
    version = workload_api_version(cluster.binaries.version)
    api = client.CustomObjectsApi(kube)
    if version == "v1alpha1":
        body = {
            "apiVersion": "scheduling.k8s.io/v1alpha1",
            "kind": "Workload",
            "metadata": {"name": "train"},
            "spec": {"podGroups": [{"name": g, "policy": {"gang": {"minCount": n}}} for g, n in groups.items()]},
        }
        await raw_json(
            api.create_namespaced_custom_object(
                "scheduling.k8s.io", version, namespace, "workloads", body, _preload_content=False
            )
        )
        return {g: {"workloadRef": {"name": "train", "podGroup": g}} for g in groups}
    for g, n in groups.items():
        body = {
            "apiVersion": f"scheduling.k8s.io/{version}",
            "kind": "PodGroup",
            "metadata": {"name": g},
            "spec": {"schedulingPolicy": {"gang": {"minCount": n}}},
        }
        await raw_json(
            api.create_namespaced_custom_object(
                "scheduling.k8s.io", version, namespace, "podgroups", body, _preload_content=False
            )
        )
    return {g: {"schedulingGroup": {"podGroupName": g}} for g in groups}


async def test_a_workload_api_gang_binds_whole_and_one_that_cannot_fit_binds_nothing(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    """The Workload API the cluster's kube-apiserver serves (GenericWorkload on): 1.37's PodGroups and pods joined
    by spec.schedulingGroup, or 1.35's Workload and spec.workloadRef; a gang policy's minCount. The plugin picks
    the version by discovery."""
    await create_nodes(kube, [node(f"{group}-0", group, cpu="3")])
    joins = await create_workload_gangs(kube, cluster, namespace, {"small": 2, "big": 2})

    def workers(pod_group: str) -> list[dict[str, Any]]:
        return [pod(f"{pod_group}-{i}", scheduler_name, cpu="1", spec=joins[pod_group]) for i in range(2)]

    async with gang_scheduler(cluster, scheduler_name, selector, f"{namespace}-workload", WORKLOAD_API):
        await create_pods(kube, namespace, workers("small"))
        await wait_for(lambda: all_bound(kube, namespace, ["small-0", "small-1"]), WAIT, what="the small gang")
        await create_pods(kube, namespace, workers("big"))  # 1 cpu left for two 1-cpu members

        async def refused() -> dict[str, set[str]] | None:
            notes = await failed_notes(kube, namespace)
            return notes if {"big-0", "big-1"} <= set(notes) else None

        notes = await wait_for(refused, WAIT, what="the gang that cannot fit to be refused")
        heard = notes["big-0"] | notes["big-1"]
        if "schedulingGroup" in joins["big"]:  # kube 1.37's pod group cycle: PlacementFeasible's verdict
            assert "minCount (2) cannot be satisfied: 1 scheduled, 0 remaining" in heard
        else:  # kube 1.35: the Permit wait
            assert "waiting for minCount pods from a gang to be waiting on permit" in heard
        placed = await placement(kube, namespace)
        assert placed["big-0"] is None and placed["big-1"] is None


async def test_gang_hot_value_together_keeps_a_gang_on_the_idler_node_while_other_pods_still_spread(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    """Two roomy nodes annotated with load (a idler than b). Upstream's hot value (every 2 own bindings within a
    minute cost 10 points) would send the gang's third member to b; with ``gangHotValue: together`` the members do
    not count against each other, so all three go to a, and a pod of no gang after them still sees them: b."""
    stamp = datetime.now(UTC) - timedelta(seconds=10)
    nodes = []
    for name, usage in ((f"{group}-a", 0.10), (f"{group}-b", 0.15)):
        body = node(name, group, cpu="100", memory="400Gi")
        body["metadata"]["annotations"] = {m: encode_usage(usage, stamp) for m in UPSTREAM_METRICS}
        nodes.append(body)
    await create_nodes(kube, nodes)
    await create_group(kube, namespace, "train", 3)
    together = {**COSCHEDULING, "pluginConfig": [{"name": "Dynamic", "args": {"gangHotValue": "together"}}]}
    async with gang_scheduler(cluster, scheduler_name, selector, f"{namespace}-together", together):
        await create_pods(kube, namespace, members("train", scheduler_name, 3))
        train = [f"train-{i}" for i in range(3)]
        placed = await wait_for(lambda: all_bound(kube, namespace, train), WAIT, what="the gang to bind")
        assert {placed[n] for n in train} == {f"{group}-a"}
        await create_pods(kube, namespace, [pod("loose", scheduler_name, cpu="1")])
        placed = await wait_for(lambda: all_bound(kube, namespace, ["loose"]), WAIT, what="a pod of no group")
        assert placed["loose"] == f"{group}-b"
