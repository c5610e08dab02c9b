"""Volumes and preemption on the real API server (and, for the StatefulSet, the real persistent-volume controller
of kube-controller-manager): what a platform team would check before pointing workloads at crane-scheduler."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_scheduler.plugins.volumebinding.binder import ANN_BIND_COMPLETED, ANN_SELECTED_NODE
from crane_shared.kube import api_client_from_dict, raw_json
from tests.support.scheduler_cluster import (
    config_for,
    create_nodes,
    create_pods,
    events,
    in_process,
    node,
    nominated_nodes,
    pod,
    read_pod,
    scheduled_condition,
    victim,
    wait_for,
)


async def test_pod_whose_claim_is_missing_stays_pending_with_kube_reason(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    await create_nodes(kube, [node(f"{group}-a", group), node(f"{group}-b", group)])
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(kube, namespace, [pod("needs-claim", scheduler_name, spec={"volumes": volumes})])

        async def refused() -> dict[str, Any] | None:
            cond = scheduled_condition(await read_pod(kube, namespace, "needs-claim"))
            return cond if cond and cond.get("status") == "False" else None

        cond = await wait_for(refused, what="PodScheduled=False")
    assert cond["reason"] == "Unschedulable"
    # kube-scheduler 1.35.4 says exactly this: VolumeBinding's PreFilter stops the cycle before DynamicResources'
    # PreFilter writes its state, so its PostFilter fails reading it ("not found") and DefaultPreemption never runs.
    assert cond["message"] == '0/2 nodes are available: persistentvolumeclaim "data" not found. not found'
    p = await read_pod(kube, namespace, "needs-claim")
    assert p is not None and not p["spec"].get("nodeName")


async def test_high_priority_pod_preempts_the_lowest_priority_victim(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
    priorities: dict[str, str],
) -> None:
    a, b = f"{group}-a", f"{group}-b"
    await create_nodes(kube, [node(a, group, cpu="1"), node(b, group, cpu="1")])
    await create_pods(
        kube,
        namespace,
        [victim("low", scheduler_name, a, priorities["low"]), victim("mid", scheduler_name, b, priorities["mid"])],
    )
    low = await read_pod(kube, namespace, "low")
    assert low is not None
    nominations = asyncio.create_task(nominated_nodes(kube, namespace, "vip"))
    async with in_process(cluster, config_for(scheduler_name), selector):
        vip = pod("vip", scheduler_name, cpu="1", spec={"priorityClassName": priorities["high"]})
        await create_pods(kube, namespace, [vip])

        async def bound() -> dict[str, Any] | None:
            p = await read_pod(kube, namespace, "vip")
            return p if p and p["spec"].get("nodeName") else None

        placed = await wait_for(bound, timeout=30, what="the preemptor bound")

        async def preempted() -> list[dict[str, Any]] | None:
            return await events(kube, namespace, "Preempted") or None

        found = await wait_for(preempted, timeout=30, what="the victim's Preempted event")
    assert placed["spec"]["nodeName"] == a
    # kube-scheduler's Eventf(victim, preemptor, Normal, "Preempted", "Preempting", "Preempted by pod <uid> on node")
    [event] = found
    assert (event["type"], event["reason"], event["action"]) == ("Normal", "Preempted", "Preempting")
    assert event["note"] == f"Preempted by pod {placed['metadata']['uid']} on node {a}"
    assert event["regarding"]["name"] == "low" and event["regarding"]["uid"] == low["metadata"]["uid"]
    assert event["related"]["name"] == "vip" and event["related"]["uid"] == placed["metadata"]["uid"]
    assert event["reportingController"] == scheduler_name
    # the API server clears the nomination on binding (ClearingNominatedNodeNameAfterBinding): the watch saw it
    assert await asyncio.wait_for(nominations, 30) == [a]
    assert await read_pod(kube, namespace, "low") is None
    assert await read_pod(kube, namespace, "mid") is not None


async def test_pod_disruption_budget_steers_the_victim_choice(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
    priorities: dict[str, str],
) -> None:
    a, b = f"{group}-a", f"{group}-b"
    await create_nodes(kube, [node(a, group, cpu="1"), node(b, group, cpu="1")])
    guarded = victim("guarded", scheduler_name, a, priorities["low"], labels={"app": "db"})
    await create_pods(kube, namespace, [guarded, victim("free", scheduler_name, b, priorities["low"])])
    pdb = {"metadata": {"name": "db"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}}
    await client.PolicyV1Api(kube).create_namespaced_pod_disruption_budget(namespace, pdb)
    async with in_process(cluster, config_for(scheduler_name), selector):
        await create_pods(
            kube, namespace, [pod("vip", scheduler_name, cpu="1", spec={"priorityClassName": priorities["high"]})]
        )

        async def bound() -> str | None:
            p = await read_pod(kube, namespace, "vip")
            return p["spec"].get("nodeName") if p else None

        assert await wait_for(bound, timeout=30, what="the preemptor bound") == b
    assert await read_pod(kube, namespace, "free") is None
    assert await read_pod(kube, namespace, "guarded") is not None


# ------------------------------------------------------------------------------------------ with the PV controller


@pytest.fixture(scope="module")
async def controlled(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    """A cluster with kube-controller-manager (StatefulSet and persistent-volume controllers)."""
    async with LocalCluster(tmp_path_factory.mktemp("pvcluster"), controllers=True) as c:
        yield c


async def test_statefulset_with_wait_for_first_consumer_lands_where_its_local_pv_is(
    controlled: LocalCluster, scheduler_name: str
) -> None:
    group = "pv"
    api = await api_client_from_dict(controlled.kubeconfig_dict())
    try:
        core, storage = client.CoreV1Api(api), client.StorageV1Api(api)
        await core.create_namespace({"metadata": {"name": "db"}})
        await create_nodes(api, [node(f"pv-{i}", group) for i in range(3)])
        await storage.create_storage_class(
            {
                "metadata": {"name": "local-wffc"},
                "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": "WaitForFirstConsumer",
            }
        )
        for i in (1, 2):  # no PV on pv-0: a replica there could never mount its volume
            await core.create_persistent_volume(
                {
                    "metadata": {"name": f"local-{i}"},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "local-wffc",
                        "local": {"path": f"/mnt/disk{i}"},
                        "nodeAffinity": {
                            "required": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [f"pv-{i}"]}
                                        ]
                                    }
                                ]
                            }
                        },
                    },
                }
            )
        sts = {
            "metadata": {"name": "db"},
            "spec": {
                "replicas": 2,
                "podManagementPolicy": "Parallel",  # no kubelet makes pods Ready here
                "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": {
                    "metadata": {"labels": {"app": "db"}},
                    "spec": {
                        "schedulerName": scheduler_name,
                        "containers": [
                            {
                                "name": "db",
                                "image": "pause",
                                "resources": {"requests": {"cpu": "100m"}},
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                            }
                        ],
                    },
                },
                "volumeClaimTemplates": [
                    {
                        "metadata": {"name": "data"},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "storageClassName": "local-wffc",
                            "resources": {"requests": {"storage": "1Gi"}},
                        },
                    }
                ],
            },
        }
        await client.AppsV1Api(api).create_namespaced_stateful_set("db", sts)
        async with in_process(controlled, config_for(scheduler_name), "crane.test/group=pv"):

            async def placed() -> dict[str, str] | None:
                out = {}
                for i in range(2):
                    p = await read_pod(api, "db", f"db-{i}")
                    if not p or not p["spec"].get("nodeName"):
                        return None
                    out[f"db-{i}"] = p["spec"]["nodeName"]
                return out

            nodes = await wait_for(placed, timeout=60, what="both replicas bound")
        assert sorted(nodes.values()) == ["pv-1", "pv-2"]
        for i in range(2):
            claim = json.loads(
                await (
                    await core.read_namespaced_persistent_volume_claim(f"data-db-{i}", "db", _preload_content=False)
                ).read()
            )
            volume = claim["spec"]["volumeName"]
            assert claim["status"]["phase"] == "Bound"
            assert volume == f"local-{nodes[f'db-{i}'][-1]}"  # the PV pinned to the replica's node
    finally:
        await api.close()


PROVISIONER = "crane.test/provisioner"


async def test_a_claim_provisioned_for_the_chosen_node_is_bound_before_the_pod(
    controlled: LocalCluster, scheduler_name: str
) -> None:
    """VolumeBinding's PreBind for dynamic provisioning against the real PV controller: the scheduler writes the
    chosen node into the claim (``volume.kubernetes.io/selected-node``) and waits; the test plays the external
    provisioner (it creates the claim's PV on that node once asked); the PV controller binds the claim to it; only
    then is the pod bound."""
    group, ns = "dyn", "dyn"
    api = await api_client_from_dict(controlled.kubeconfig_dict())
    try:
        core, storage = client.CoreV1Api(api), client.StorageV1Api(api)
        await core.create_namespace({"metadata": {"name": ns}})
        await create_nodes(api, [node(f"dyn-{i}", group) for i in range(2)])
        await storage.create_storage_class(
            {
                "metadata": {"name": "dyn-wffc"},
                "provisioner": PROVISIONER,
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Retain",
            }
        )
        claim = {
            "metadata": {"name": "data"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "dyn-wffc",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
        await core.create_namespaced_persistent_volume_claim(ns, claim)
        volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]

        async def read_claim() -> dict[str, Any]:
            found: dict[str, Any] = await raw_json(
                core.read_namespaced_persistent_volume_claim("data", ns, _preload_content=False)
            )
            return found

        async def selected() -> dict[str, Any] | None:
            found = await read_claim()
            return found if (found["metadata"].get("annotations") or {}).get(ANN_SELECTED_NODE) else None

        async with in_process(controlled, config_for(scheduler_name), f"crane.test/group={group}"):
            await create_pods(api, ns, [pod("web", scheduler_name, spec={"volumes": volumes})])
            asked = await wait_for(selected, timeout=60, what="the claim's selected node")
            chosen = asked["metadata"]["annotations"][ANN_SELECTED_NODE]
            assert chosen in ("dyn-0", "dyn-1")
            waiting = await read_pod(api, ns, "web")
            assert waiting is not None and not waiting["spec"].get("nodeName")  # PreBind waits for the volume
            await core.create_persistent_volume(provisioned(asked, chosen))

            async def bound() -> str | None:
                p = await read_pod(api, ns, "web")
                return str(p["spec"].get("nodeName") or "") if p else None

            assert await wait_for(bound, timeout=60, what="the pod bound") == chosen
        final = await read_claim()
        assert final["status"]["phase"] == "Bound" and final["spec"]["volumeName"] == f"pvc-{asked['metadata']['uid']}"
        assert ANN_BIND_COMPLETED in final["metadata"]["annotations"]  # the PV controller bound it, not the test
    finally:
        await api.close()


def provisioned(claim: dict[str, Any], node_name: str) -> dict[str, Any]:
    """The PV an external provisioner creates for ``claim`` on ``node_name``: pre-bound to the claim (claimRef
    with its UID), which the PV controller then binds."""
    m = claim["metadata"]
    on_node = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node_name]}
    return {
        "metadata": {"name": f"pvc-{m['uid']}", "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "dyn-wffc",
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": m["namespace"],
                "name": m["name"],
                "uid": m["uid"],
            },
            "local": {"path": "/mnt/provisioned"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [on_node]}]}},
        },
    }
