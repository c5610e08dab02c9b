"""The Kubernetes operations every service relies on, against the real API server."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_sandbox.cluster import LocalCluster
from crane_scheduler.plugins.defaultbinder import BindConflict, bind_pod
from crane_shared.events import parse_scheduled_note, scheduled_event
from crane_shared.kube import api_client_from_dict, raw_json
from crane_shared.leader import LeaderElector, LeaseConfig


async def _node(kube: client.ApiClient, name: str) -> None:
    v1 = client.CoreV1Api(kube)
    await v1.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})


async def _pod(kube: client.ApiClient, namespace: str, name: str) -> client.V1Pod:
    pod: client.V1Pod = await client.CoreV1Api(kube).create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {"schedulerName": "crane-scheduler", "containers": [{"name": "c", "image": "pause"}]},
        },
    )
    return pod


async def test_merge_patch_adds_annotations_to_a_node_that_has_none_and_null_deletes(kube: client.ApiClient) -> None:
    v1 = client.CoreV1Api(kube)
    await _node(kube, "patch-node")
    merge = "application/merge-patch+json"
    await v1.patch_node(
        "patch-node", {"metadata": {"annotations": {"cpu_usage_avg_5m": "0.10000,x", "k": "v"}}}, _content_type=merge
    )
    await v1.patch_node("patch-node", {"metadata": {"annotations": {"k": None}}}, _content_type=merge)
    node = await v1.read_node("patch-node")
    assert node.metadata.annotations == {"cpu_usage_avg_5m": "0.10000,x"}


async def test_bind_sets_node_name_and_a_second_bind_is_a_conflict(kube: client.ApiClient, namespace: str) -> None:
    await _node(kube, "bind-node")
    pod = await _pod(kube, namespace, "p")
    await bind_pod(kube, namespace, "p", pod.metadata.uid, "bind-node")
    bound = await client.CoreV1Api(kube).read_namespaced_pod("p", namespace)
    assert bound.spec.node_name == "bind-node"
    with pytest.raises(BindConflict):
        await bind_pod(kube, namespace, "p", pod.metadata.uid, "bind-node")


async def test_bind_with_a_stale_uid_does_not_bind_the_recreated_pod(kube: client.ApiClient, namespace: str) -> None:
    await _node(kube, "uid-node")
    old = await _pod(kube, namespace, "p")
    await client.CoreV1Api(kube).delete_namespaced_pod("p", namespace, grace_period_seconds=0)
    await _pod(kube, namespace, "p")
    with pytest.raises((ApiException, BindConflict)):
        await bind_pod(kube, namespace, "p", old.metadata.uid, "uid-node")
    fresh = await client.CoreV1Api(kube).read_namespaced_pod("p", namespace)
    assert fresh.spec.node_name is None


async def test_scheduled_event_reads_back_through_both_event_apis(kube: client.ApiClient, namespace: str) -> None:
    pod = await _pod(kube, namespace, "ev")
    body = scheduled_event(
        namespace=namespace,
        pod="ev",
        pod_uid=pod.metadata.uid,
        node="n1",
        scheduler="crane-scheduler",
        instance="test-1",
    )
    await client.EventsV1Api(kube).create_namespaced_event(namespace, body)
    new = await client.EventsV1Api(kube).list_namespaced_event(namespace)
    assert [(e.reason, e.regarding.uid, parse_scheduled_note(e.note)) for e in new.items] == [
        ("Scheduled", pod.metadata.uid, (namespace, "ev", "n1"))
    ]
    old = await client.CoreV1Api(kube).list_namespaced_event(namespace)
    assert [(e.reason, e.involved_object.uid, parse_scheduled_note(e.message)) for e in old.items] == [
        ("Scheduled", pod.metadata.uid, (namespace, "ev", "n1"))
    ]


async def test_lease_one_candidate_wins_and_the_other_takes_over_on_release(kube: client.ApiClient) -> None:
    cfg = dict(namespace="default", name="lease-test", lease_duration=2.0, renew_deadline=1.5, retry_period=0.2)
    a = LeaderElector(kube, LeaseConfig(identity="a", **cfg))  # type: ignore[arg-type]
    b = LeaderElector(kube, LeaseConfig(identity="b", **cfg))  # type: ignore[arg-type]
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert await a.try_acquire_or_renew()  # renewal by the holder
    await a.release()
    assert await b.try_acquire_or_renew()
    assert not await a.try_acquire_or_renew()


async def test_lease_is_taken_over_after_the_holder_stops_renewing(kube: client.ApiClient) -> None:
    cfg = dict(namespace="default", name="lease-expiry", lease_duration=1.0, renew_deadline=0.8, retry_period=0.1)
    a = LeaderElector(kube, LeaseConfig(identity="a", **cfg))  # type: ignore[arg-type]
    b = LeaderElector(kube, LeaseConfig(identity="b", **cfg))  # type: ignore[arg-type]
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    led: list[str] = []

    async def lead(name: str) -> None:
        led.append(name)
        await asyncio.Event().wait()

    a_won, b_won = asyncio.Event(), asyncio.Event()
    a.on_change = lambda leading: a_won.set() if leading else None
    b.on_change = lambda leading: b_won.set() if leading else None
    task_a = asyncio.create_task(a.run(lambda: lead("a"), stop_a))
    await asyncio.wait_for(a_won.wait(), timeout=10)
    task_b = asyncio.create_task(b.run(lambda: lead("b"), stop_b))
    task_a.cancel()  # a dies without releasing (like kill -9)
    await asyncio.wait_for(b_won.wait(), timeout=10)
    assert led == ["a", "b"]
    lease = await raw_json(
        client.CoordinationV1Api(kube).read_namespaced_lease("lease-expiry", "default", _preload_content=False)
    )
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["renewTime"].endswith("Z") and len(lease["spec"]["renewTime"]) == 27
    stop_b.set()
    await task_b
    lease = await raw_json(
        client.CoordinationV1Api(kube).read_namespaced_lease("lease-expiry", "default", _preload_content=False)
    )
    assert lease["spec"]["holderIdentity"] == ""  # released on shutdown


async def test_rbac_is_enforced_for_service_account_tokens(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str
) -> None:
    v1 = client.CoreV1Api(kube)
    await v1.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    token = await v1.create_namespaced_service_account_token("reader", namespace, {"spec": {"expirationSeconds": 600}})
    sa = await api_client_from_dict(cluster.kubeconfig_dict(token.status.token, user="reader"))
    try:
        with pytest.raises(ApiException) as denied:
            await client.CoreV1Api(sa).list_node()
        assert denied.value.status == 403
        rbac = client.RbacAuthorizationV1Api(kube)
        await rbac.create_cluster_role(
            {
                "metadata": {"name": f"{namespace}-nodes"},
                "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
            }
        )
        await rbac.create_cluster_role_binding(
            {
                "metadata": {"name": f"{namespace}-nodes"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": f"{namespace}-nodes",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
            }
        )
        for _ in range(100):  # the authorizer's cache catches up within milliseconds
            try:
                await client.CoreV1Api(sa).list_node()
                break
            except ApiException:
                await asyncio.sleep(0.05)
        else:
            pytest.fail("the RoleBinding never took effect")
    finally:
        await sa.close()
