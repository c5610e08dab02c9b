"""Kube 1.37's node-side features on the real API server: a pod needing a declared node feature, a pod with
pod-level resources, a node holding a pod resizing in place."""

from __future__ import annotations

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
    wait_for,
)

RESTART_ALL = "RestartAllContainersOnContainerExits"


def restarting_all(name: str, scheduler: str) -> dict[str, Any]:
    """A pod whose container, exiting with 42, restarts all the pod's containers (a kubelet must declare it)."""
    body = pod(name, scheduler)
    body["spec"]["containers"][0].update(
        restartPolicy="Never",
        restartPolicyRules=[{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}],
    )
    return body


def declaring(name: str, group: str, *features: str, **kw: Any) -> dict[str, Any]:
    body = node(name, group, **kw)
    body["status"]["declaredFeatures"] = sorted(features)
    return body


async def test_a_pod_needing_a_node_feature_waits_for_a_node_declaring_it_and_binds_there(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    await create_nodes(kube, [node(f"{group}-plain", group, cpu="8")])
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(kube, namespace, [restarting_all("restarts", scheduler_name)])
        failed = await wait_for(lambda: events(kube, namespace, "FailedScheduling"), what="FailedScheduling")
        assert failed[0]["note"].startswith("0/1 nodes are available: 1 node(s) didn't match Pod's required features.")
        # a smaller node that declares the feature: its addition wakes the pod (NodeDeclaredFeatures' hint)
        await create_nodes(kube, [declaring(f"{group}-featured", group, RESTART_ALL, cpu="2")])
        landed = await wait_for(lambda: node_of(kube, namespace, "restarts"), what="the pod to be bound")
    assert landed == f"{group}-featured"
    stored = (await client.CoreV1Api(kube).read_node(f"{group}-featured", _preload_content=False)).content
    assert RESTART_ALL in (await stored.read()).decode()  # the API server kept the node's declared feature


async def test_pod_level_requests_decide_where_the_pod_fits(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    """Containers ask 100m each; the pod-level request (3 cores) is what NodeResourcesFit holds against nodes: only
    the big node fits, though its memory is nearly all taken (scored by the containers alone, it would lose)."""
    await create_nodes(
        kube,
        [
            node(f"{group}-small", group, cpu="2"),
            node(f"{group}-big", group, cpu="8"),
            node(f"{group}-mid", group, cpu="2"),
        ],
    )
    await create_pods(kube, namespace, [pod("memory-hog", "nobody", cpu="1", memory="15Gi", node_name=f"{group}-big")])
    body = pod("pod-level", scheduler_name)
    body["spec"]["containers"].append({**body["spec"]["containers"][0], "name": "sidecar"})
    body["spec"]["resources"] = {"requests": {"cpu": "3", "memory": "128Mi"}, "limits": {"cpu": "3", "memory": "1Gi"}}
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(kube, namespace, [body])
        landed = await wait_for(lambda: node_of(kube, namespace, "pod-level"), what="the pod to be bound")
    assert landed == f"{group}-big"


async def test_a_node_holds_what_a_resizing_pod_was_allocated_not_only_its_spec(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    """A pod on node a resized down to 500m in its spec, whose kubelet still reports 3 cores allocated: a 2-core
    pod does not fit a (4 cores) until the allocation follows the spec."""
    await create_nodes(kube, [node(f"{group}-a", group, cpu="4")])
    v1 = client.CoreV1Api(kube)
    await create_pods(kube, namespace, [pod("resizing", "nobody", cpu="500m", node_name=f"{group}-a")])
    allocated = {"cpu": "3", "memory": "64Mi"}
    status: dict[str, Any] = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "c",
                "image": "pause",
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "allocatedResources": allocated,
                "resources": {"requests": allocated},
            }
        ],
    }
    await v1.patch_namespaced_pod_status("resizing", namespace, {"status": status})
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(kube, namespace, [pod("wants-two", scheduler_name, cpu="2")])
        failed = await wait_for(lambda: events(kube, namespace, "FailedScheduling"), what="FailedScheduling")
        assert failed[0]["note"].startswith("0/1 nodes are available: 1 Insufficient cpu.")
        shrunk = {"cpu": "500m", "memory": "64Mi"}
        status["containerStatuses"][0].update(allocatedResources=shrunk, resources={"requests": shrunk})
        await v1.patch_namespaced_pod_status("resizing", namespace, {"status": status})
        landed = await wait_for(lambda: node_of(kube, namespace, "wants-two"), what="the pod to be bound")
    assert landed == f"{group}-a"
