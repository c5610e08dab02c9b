"""DRA on the real API server (resource.k8s.io/v1): hand-made ResourceSlices (no driver, no kubelet, no hardware),
DeviceClasses and ResourceClaims; the scheduler runs as the chart's ServiceAccount, so its RBAC is exercised too.
Template claims need kube-controller-manager's resourceclaim controller (a cluster of its own)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_shared.kube import api_client_from_dict
from tests.support.dra import claim, device, device_class, exactly, resource_slice
from tests.support.dra_cluster import claim_pod, devices, gpu_class, read_claim
from tests.support.scheduler_cluster import (
    config_for,
    create_nodes,
    create_pods,
    in_process,
    node,
    nominated_nodes,
    pod,
    read_pod,
    scheduled_condition,
    wait_for,
)

FINALIZER = "resource.kubernetes.io/delete-protection"


async def test_a_pod_with_a_claim_binds_where_the_device_is_and_the_claim_is_allocated_to_it(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    driver = f"{group}.gpu.example.com"
    await create_nodes(kube, [node(f"{group}-a", group), node(f"{group}-b", group)])
    await devices(
        kube,
        driver,
        [gpu_class(f"{group}-gpu", driver)],
        [resource_slice(f"{group}-b", [device("gpu-0", model="A100")], node=f"{group}-b")],
    )
    await client.ResourceV1Api(kube).create_namespaced_resource_claim(
        namespace, claim("gpu", exactly("gpu", f"{group}-gpu"), namespace=namespace)
    )
    nominations = asyncio.create_task(nominated_nodes(kube, namespace, "uses-gpu"))
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(kube, namespace, [claim_pod("uses-gpu", scheduler_name, "gpu")])

        async def bound() -> str | None:
            p = await read_pod(kube, namespace, "uses-gpu")
            name = (p or {}).get("spec", {}).get("nodeName")
            return str(name) if name else None

        assert await wait_for(bound, timeout=30, what="the pod bound") == f"{group}-b"
    # NominatedNodeNameForExpectation: the claim to bind in PreBind takes round trips, so the node the pod is about
    # to be bound to was written first, where an autoscaler reads it (the API server clears it with the binding)
    assert await asyncio.wait_for(nominations, 30) == [f"{group}-b"]
    written = await read_claim(kube, namespace, "gpu")
    assert written is not None
    p = await read_pod(kube, namespace, "uses-gpu")
    assert written["metadata"]["finalizers"] == [FINALIZER]
    assert written["status"]["reservedFor"] == [
        {"resource": "pods", "name": "uses-gpu", "uid": (p or {})["metadata"]["uid"]}
    ]
    assert written["status"]["allocation"]["devices"]["results"] == [
        {"request": "gpu", "driver": driver, "pool": f"{group}-b", "device": "gpu-0"}
    ]
    assert written["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [
        f"{group}-b"
    ]


async def test_a_device_no_node_has_keeps_the_pod_pending_with_kube_reason_and_the_last_device_goes_once(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    driver = f"{group}.gpu.example.com"
    await create_nodes(kube, [node(f"{group}-a", group), node(f"{group}-b", group)])
    h100 = device_class(
        f"{group}-h100", f'device.driver == "{driver}" && device.attributes["{driver}"].model == "H100"'
    )
    await devices(
        kube,
        driver,
        [gpu_class(f"{group}-gpu", driver), h100],
        [resource_slice(f"{group}-a", [device("gpu-0", model="A100")], node=f"{group}-a")],
    )
    v1 = client.ResourceV1Api(kube)
    for name, klass in (("h100", f"{group}-h100"), ("one", f"{group}-gpu"), ("two", f"{group}-gpu")):
        await v1.create_namespaced_resource_claim(namespace, claim(name, exactly("gpu", klass), namespace=namespace))
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(
            kube,
            namespace,
            [
                claim_pod("wants-h100", scheduler_name, "h100"),
                claim_pod("first", scheduler_name, "one"),
                claim_pod("second", scheduler_name, "two"),
            ],
        )

        async def refused() -> dict[str, Any] | None:
            cond = scheduled_condition(await read_pod(kube, namespace, "wants-h100"))
            return cond if cond and cond.get("status") == "False" else None

        cond = await wait_for(refused, timeout=30, what="PodScheduled=False")

        async def one_bound_one_refused() -> list[str] | None:
            pods = [await read_pod(kube, namespace, n) for n in ("first", "second")]
            placed = [p["metadata"]["name"] for p in pods if p and p["spec"].get("nodeName")]
            refusals = [p for p in pods if p and (scheduled_condition(p) or {}).get("status") == "False"]
            return placed if len(placed) == 1 and len(refusals) == 1 else None

        placed = await wait_for(one_bound_one_refused, timeout=30, what="one pod bound, the other refused")
    assert cond["reason"] == "Unschedulable"
    assert cond["message"].startswith("0/2 nodes are available: 2 cannot allocate all claims.")
    winner = "one" if placed == ["first"] else "two"
    loser = "two" if winner == "one" else "one"
    assert ((await read_claim(kube, namespace, winner)) or {})["status"]["allocation"]["devices"]["results"][0][
        "device"
    ] == "gpu-0"
    assert "allocation" not in (((await read_claim(kube, namespace, loser)) or {}).get("status") or {})


# ------------------------------------------------------------------------------------------ with the controller


@pytest.fixture(scope="module")
async def controlled(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    """A cluster with kube-controller-manager (its resourceclaim controller creates claims from templates)."""
    async with LocalCluster(tmp_path_factory.mktemp("dracluster"), controllers=True) as c:
        yield c


async def test_a_pod_with_a_claim_template_gets_its_own_claim_allocated(
    controlled: LocalCluster, scheduler_name: str
) -> None:
    group, driver = "dra", "gpu.example.com"
    api = await api_client_from_dict(controlled.kubeconfig_dict())
    try:
        await client.CoreV1Api(api).create_namespace({"metadata": {"name": "ml"}})
        await create_nodes(api, [node("dra-0", group), node("dra-1", group)])
        await devices(
            api,
            driver,
            [gpu_class("gpu", driver)],
            [resource_slice("dra-1", [device("gpu-0"), device("gpu-1")], node="dra-1")],
        )
        template = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu"},
            "spec": {"spec": {"devices": {"requests": [exactly("gpu", "gpu")]}}},
        }
        await client.ResourceV1Api(api).create_namespaced_resource_claim_template("ml", template)
        trainer = pod(
            "trainer",
            scheduler_name,
            spec={"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]},
        )
        async with in_process(controlled, config_for(scheduler_name), "crane.test/group=dra"):
            await create_pods(api, "ml", [trainer])

            async def bound() -> dict[str, Any] | None:
                p = await read_pod(api, "ml", "trainer")
                return p if p and p["spec"].get("nodeName") else None

            placed = await wait_for(bound, timeout=60, what="the pod bound")
        assert placed["spec"]["nodeName"] == "dra-1"
        statuses = placed["status"]["resourceClaimStatuses"]
        assert [s["name"] for s in statuses] == ["gpu"]
        generated = await read_claim(api, "ml", statuses[0]["resourceClaimName"])
        assert generated is not None
        assert [r["uid"] for r in generated["status"]["reservedFor"]] == [placed["metadata"]["uid"]]
        assert generated["status"]["allocation"]["devices"]["results"][0]["pool"] == "dra-1"
    finally:
        await api.close()
