"""The DRA features Kubernetes 1.37 turns on by default, on the real API server (resource.k8s.io/v1, its defaults):
a pod placed on a partition of a GPU sharing counters, a tainted device skipped (in its slice and through a
DeviceTaintRule) unless tolerated, a pod asking for ``example.com/gpu`` in its resources getting a device through
the claim the scheduler makes, and a device with binding conditions waited for in PreBind. The scheduler runs as
the chart's ServiceAccount, so the RBAC these need (creating and deleting claims, the pod's status, the
DeviceTaintRules' watch) is exercised too."""

from __future__ import annotations

import contextlib
from typing import Any

from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_shared.kube import raw_json
from tests.support.dra import claim, device, device_class, exactly, resource_slice
from tests.support.dra_cluster import claim_pod, devices, gpu_class, read_claim
from tests.support.scheduler_cluster import (
    config_for,
    create_nodes,
    create_pods,
    events,
    in_process,
    node,
    pod,
    read_pod,
    scheduled_condition,
    wait_for,
)


async def bound_to(kube: client.ApiClient, namespace: str, name: str) -> str:
    async def bound() -> str | None:
        p = await read_pod(kube, namespace, name)
        node_name = (p or {}).get("spec", {}).get("nodeName")
        return str(node_name) if node_name else None

    return str(await wait_for(bound, timeout=30, what=f"{name} bound"))


async def refused(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    async def condition() -> dict[str, Any] | None:
        cond = scheduled_condition(await read_pod(kube, namespace, name))
        return cond if cond and cond.get("status") == "False" else None

    cond: dict[str, Any] = await wait_for(condition, timeout=30, what=f"{name} refused")
    return cond


def partitioned(node_name: str, driver: str) -> list[dict[str, Any]]:
    """One physical GPU as its whole and two halves, sharing counters (a counter slice beside the devices)."""

    def consumes(n: int) -> list[dict[str, Any]]:
        return [{"counterSet": "gpu-0", "counters": {"memory": {"value": f"{40 * n}Gi"}}}]

    whole = {**device("gpu-0", partition="whole"), "consumesCounters": consumes(2)}
    halves = [{**device(f"gpu-0-h{k}", partition="half"), "consumesCounters": consumes(1)} for k in range(2)]
    devs = resource_slice(f"{node_name}-devices", [whole, *halves], node=node_name, pool=node_name, count=2)
    counters = resource_slice(f"{node_name}-counters", [], node=node_name, pool=node_name, count=2)
    del counters["spec"]["devices"]
    counters["spec"]["sharedCounters"] = [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}]
    return [devs, counters]


async def test_a_pod_is_placed_on_a_partition_where_the_shared_counters_leave_room(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    driver = f"{group}.gpu.example.com"
    a, b = f"{group}-a", f"{group}-b"
    await create_nodes(kube, [node(a, group), node(b, group)])
    half = device_class(
        f"{group}-half", f'device.driver == "{driver}" && device.attributes["{driver}"].partition == "half"'
    )
    whole = device_class(
        f"{group}-whole", f'device.driver == "{driver}" && device.attributes["{driver}"].partition == "whole"'
    )
    await devices(kube, driver, [half, whole], partitioned(a, driver) + partitioned(b, driver))
    v1 = client.ResourceV1Api(kube)
    # node a's GPU is taken whole by another claim: its halves have no counters left
    body = claim("held", exactly("gpu", f"{group}-whole"), namespace=namespace)
    held = await raw_json(v1.create_namespaced_resource_claim(namespace, body, _preload_content=False))
    held["status"] = {
        "allocation": {"devices": {"results": [{"request": "gpu", "driver": driver, "pool": a, "device": "gpu-0"}]}}
    }
    await v1.replace_namespaced_resource_claim_status("held", namespace, held)
    for name in ("first", "second", "third"):
        await v1.create_namespaced_resource_claim(
            namespace, claim(name, exactly("gpu", f"{group}-half"), namespace=namespace)
        )
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(kube, namespace, [claim_pod("p1", scheduler_name, "first")])
        assert await bound_to(kube, namespace, "p1") == b
        await create_pods(kube, namespace, [claim_pod("p2", scheduler_name, "second")])
        assert await bound_to(kube, namespace, "p2") == b
        await create_pods(kube, namespace, [claim_pod("p3", scheduler_name, "third")])
        cond = await refused(kube, namespace, "p3")
    assert cond["message"].startswith("0/2 nodes are available: 2 cannot allocate all claims.")
    halves = [((await read_claim(kube, namespace, n)) or {})["status"]["allocation"] for n in ("first", "second")]
    assert sorted(h["devices"]["results"][0]["device"] for h in halves) == ["gpu-0-h0", "gpu-0-h1"]
    assert {h["devices"]["results"][0]["pool"] for h in halves} == {b}


async def test_a_tainted_device_is_skipped_unless_a_request_tolerates_its_taint(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    driver = f"{group}.gpu.example.com"
    a, b = f"{group}-a", f"{group}-b"
    await create_nodes(kube, [node(a, group), node(b, group)])
    broken = {**device("gpu-0"), "taints": [{"key": "example.com/ecc", "value": "errors", "effect": "NoSchedule"}]}
    await devices(
        kube,
        driver,
        [gpu_class(f"{group}-gpu", driver)],
        [resource_slice(a, [broken], node=a), resource_slice(b, [device("gpu-0")], node=b)],
    )
    v1 = client.ResourceV1Api(kube)
    tolerant = exactly("gpu", f"{group}-gpu")
    tolerant["exactly"]["tolerations"] = [{"key": "example.com/ecc", "operator": "Exists", "effect": "NoSchedule"}]
    for c in (
        claim("plain", exactly("gpu", f"{group}-gpu"), namespace=namespace),
        claim("blocked", exactly("gpu", f"{group}-gpu"), namespace=namespace),
        claim("tolerant", tolerant, namespace=namespace),
    ):
        await v1.create_namespaced_resource_claim(namespace, c)
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(kube, namespace, [claim_pod("plain", scheduler_name, "plain")])
        assert await bound_to(kube, namespace, "plain") == b  # a's device is tainted: skipped
        # node b's device, now free of nothing but taken: a DeviceTaintRule taints every device of the driver
        rule = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": f"{group}-drain"},
            "spec": {
                "deviceSelector": {"driver": driver},
                "taint": {"key": "example.com/drain", "effect": "NoExecute"},
            },
        }
        await client.CustomObjectsApi(kube).create_cluster_custom_object(
            "resource.k8s.io", "v1", "devicetaintrules", rule
        )
        try:
            await create_pods(kube, namespace, [claim_pod("blocked", scheduler_name, "blocked")])
            cond = await refused(kube, namespace, "blocked")
            assert cond["message"].startswith("0/2 nodes are available: 2 cannot allocate all claims.")
            # the tolerant request takes node a's device once the rule is gone (it does not tolerate example.com/drain)
            await client.CustomObjectsApi(kube).delete_cluster_custom_object(
                "resource.k8s.io", "v1", "devicetaintrules", f"{group}-drain"
            )
            await create_pods(kube, namespace, [claim_pod("tolerant", scheduler_name, "tolerant")])
            assert await bound_to(kube, namespace, "tolerant") == a
        finally:
            with contextlib.suppress(client.ApiException):  # deleted above unless the test failed before
                await client.CustomObjectsApi(kube).delete_cluster_custom_object(
                    "resource.k8s.io", "v1", "devicetaintrules", f"{group}-drain"
                )
    written = (await read_claim(kube, namespace, "tolerant")) or {}
    assert written["status"]["allocation"]["devices"]["results"] == [
        {
            "request": "gpu",
            "driver": driver,
            "pool": a,
            "device": "gpu-0",
            "tolerations": [{"key": "example.com/ecc", "operator": "Exists", "effect": "NoSchedule"}],
        }
    ]


async def test_a_pod_asking_for_an_extended_resource_gets_a_device_through_the_claim_the_scheduler_makes(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    driver = f"{group}.gpu.example.com"
    resource = f"{group}.example.com/gpu"
    a, b = f"{group}-a", f"{group}-b"
    await create_nodes(kube, [node(a, group), node(b, group)])
    klass = gpu_class(f"{group}-gpu", driver)
    klass["spec"]["extendedResourceName"] = resource
    await devices(kube, driver, [klass], [resource_slice(b, [device("gpu-0"), device("gpu-1")], node=b)])
    body = pod("trainer", scheduler_name)
    body["spec"]["containers"][0]["resources"]["requests"][resource] = "1"
    body["spec"]["containers"][0]["resources"]["limits"] = {resource: "1"}
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(kube, namespace, [body])
        assert await bound_to(kube, namespace, "trainer") == b

        async def status() -> dict[str, Any] | None:
            p = await read_pod(kube, namespace, "trainer")
            return ((p or {}).get("status") or {}).get("extendedResourceClaimStatus")

        written = await wait_for(status, timeout=30, what="the pod's extendedResourceClaimStatus")
    p = (await read_pod(kube, namespace, "trainer")) or {}
    # kube's request name: the container's index, then the resource's among all of the container's requests
    # sorted (cpu, memory, then the device's): container-0-request-2
    assert sorted(body["spec"]["containers"][0]["resources"]["requests"]) == ["cpu", "memory", resource]
    assert written["requestMappings"] == [
        {"containerName": "c", "resourceName": resource, "requestName": "container-0-request-2"}
    ]
    made = (await read_claim(kube, namespace, written["resourceClaimName"])) or {}
    assert made["metadata"]["name"].startswith("trainer-extended-resources-")
    assert made["metadata"]["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
    assert [(r["kind"], r["name"], r["uid"], r["controller"]) for r in made["metadata"]["ownerReferences"]] == [
        ("Pod", "trainer", p["metadata"]["uid"], True)
    ]
    assert made["spec"]["devices"]["requests"] == [
        {
            "name": "container-0-request-2",
            "exactly": {"deviceClassName": f"{group}-gpu", "allocationMode": "ExactCount", "count": 1},
        }
    ]
    assert made["status"]["allocation"]["devices"]["results"] == [
        {"request": "container-0-request-2", "driver": driver, "pool": b, "device": "gpu-0"}
    ]
    assert [r["uid"] for r in made["status"]["reservedFor"]] == [p["metadata"]["uid"]]


async def test_a_device_with_binding_conditions_is_waited_for_until_the_driver_says_it_is_attached(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    driver = f"{group}.fabric.example.com"
    a = f"{group}-a"
    await create_nodes(kube, [node(a, group)])
    port = {**device("port-0"), "bindingConditions": ["attached"], "bindingFailureConditions": ["failed"]}
    port["bindsToNode"] = True
    await devices(
        kube,
        driver,
        [gpu_class(f"{group}-fabric", driver)],
        [resource_slice(f"{group}-fabric", [port], all_nodes=True)],
    )
    v1 = client.ResourceV1Api(kube)
    await v1.create_namespaced_resource_claim(
        namespace, claim("port", exactly("port", f"{group}-fabric"), namespace=namespace)
    )
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(kube, namespace, [claim_pod("user", scheduler_name, "port")])

        async def allocated() -> dict[str, Any] | None:
            c = await read_claim(kube, namespace, "port")
            return c if ((c or {}).get("status") or {}).get("allocation") else None

        pending = await wait_for(allocated, timeout=30, what="the claim allocated, its device not attached yet")
        result = pending["status"]["allocation"]["devices"]["results"][0]
        assert (result["bindingConditions"], result["bindingFailureConditions"]) == (["attached"], ["failed"])
        assert pending["status"]["allocation"]["allocationTimestamp"]
        assert pending["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [
            a
        ]
        waiting = await wait_for(
            lambda: events(kube, namespace, "BindingConditionsPending"), timeout=30, what="the waiting Event"
        )
        assert waiting[0]["note"] == f"waiting for binding conditions for device on node {a}"
        assert not ((await read_pod(kube, namespace, "user")) or {})["spec"].get("nodeName")
        # the driver attaches the device: the scheduler sees the condition and binds
        pending["status"]["devices"] = [
            {
                "driver": driver,
                "pool": f"{group}-fabric",
                "device": "port-0",
                "conditions": [
                    {
                        "type": "attached",
                        "status": "True",
                        "reason": "Attached",
                        "message": "attached to the node",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
            }
        ]
        await v1.replace_namespaced_resource_claim_status("port", namespace, pending)
        assert await bound_to(kube, namespace, "user") == a
