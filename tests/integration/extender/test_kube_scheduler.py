"""The stock kube-scheduler (the real v1.35 binary) configured with our extender avoids the overloaded node.

Both wire modes: ``nodeCacheCapable: false`` (node objects in every request; extender in-process) and ``true``
(names only; the extender runs as its own process, ``python -m crane_extender --node-cache``, and
watches nodes). The test pods select this test's three nodes by label and use a scheduler name of their own, so
other tests' nodes and pods on the shared cluster do not interfere.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.fleet import make_fleet
from crane_sandbox.pod_follower import create_nodes
from crane_shared.annotations import encode_usage
from tests.support.extender_cluster import extender_in_process, extender_process, get, kube_scheduler
from tests.support.policy import UPSTREAM_METRICS as METRICS
from tests.support.waiting import eventually

HOT_REASON = "node(s) had cpu_usage_avg_5m above 0.65"


async def annotate(kube: client.ApiClient, node: str, cpu_5m: float) -> None:
    """What the annotator writes: every metric of the default policy, stamped now (one merge patch)."""
    now = datetime.now(UTC)
    values = dict.fromkeys(METRICS, 0.2) | {"cpu_usage_avg_5m": cpu_5m}
    body = {"metadata": {"annotations": {m: encode_usage(v, now) for m, v in values.items()}}}
    await client.CoreV1Api(kube).patch_node(node, body, _content_type="application/merge-patch+json")


async def _after_kube_scheduler_saw_them(
    kube: client.ApiClient, namespace: str, scheduler_name: str, tag: str, node: str, alive: Any
) -> None:
    """A barrier on kube-scheduler's node cache: a label patched on ``node`` after the annotations, and a pod only
    that label lets through NodeAffinity. Refused by the extender (our reason in its message), it was decided with
    the labelled object, so with every earlier patch (one node watch, in order); refused by NodeAffinity, it is
    retried on the label's event."""
    v1 = client.CoreV1Api(kube)
    barrier = f"crane-extender-barrier-{tag}"
    await v1.patch_node(node, {"metadata": {"labels": {barrier: "1"}}}, _content_type="application/merge-patch+json")
    probe = _pod("barrier", scheduler_name, tag)
    probe["spec"]["nodeSelector"] = {barrier: "1"}
    await v1.create_namespaced_pod(namespace, probe)

    async def refused_by_load() -> bool:
        pod = await v1.read_namespaced_pod("barrier", namespace)
        assert not pod.spec.node_name, f"barrier pod bound to {pod.spec.node_name}: kube-scheduler's cache was stale"
        return any(
            c.type == "PodScheduled" and c.status == "False" and HOT_REASON in (c.message or "")
            for c in pod.status.conditions or ()
        )

    await eventually(refused_by_load, 30, "kube-scheduler to decide with the annotated nodes", alive, interval=0.1)


def _pod(name: str, scheduler_name: str, tag: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler_name,
            "nodeSelector": {"crane-extender-e2e": tag},
            "containers": [
                {"name": "c", "image": "pause", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
            ],
        },
    }


@pytest.mark.parametrize("node_cache", [False, True], ids=["nodeCacheCapable-false", "nodeCacheCapable-true"])
async def test_stock_kube_scheduler_with_the_extender_avoids_the_overloaded_node(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, run_dir: Path, tmp_path: Path, node_cache: bool
) -> None:
    v1 = client.CoreV1Api(kube)
    tag = f"ext{'cache' if node_cache else 'list'}-{uuid.uuid4().hex[:6]}"
    scheduler_name = f"crane-e2e-{tag}"
    fleet = make_fleet(3, prefix=f"{tag}-", labels={"crane-extender-e2e": tag})
    await create_nodes(kube, fleet)
    for sim in fleet:  # the API's TaintNodesByCondition adds not-ready; no node controller here removes it
        await v1.patch_node(sim.name, {"spec": {"taints": None}}, _content_type="application/merge-patch+json")
    hot, cool = fleet[0].name, {n.name for n in fleet[1:]}
    await annotate(kube, hot, 0.9)
    for name in cool:
        await annotate(kube, name, 0.2)

    registry = CollectorRegistry()
    extender = extender_process(cluster, run_dir) if node_cache else extender_in_process(registry)
    async with (
        extender as url_prefix,
        kube_scheduler(
            cluster, run_dir, tmp_path, url_prefix, node_cache=node_cache, scheduler_name=scheduler_name
        ) as sched,
    ):

        def alive() -> None:
            assert sched.running, f"kube-scheduler exited:\n{sched.tail()}"

        names = [f"p{i}" for i in range(6)]
        for name in names:
            await v1.create_namespaced_pod(namespace, _pod(name, scheduler_name, tag))

        async def placed() -> dict[str, str] | None:
            pods = (await v1.list_namespaced_pod(namespace)).items
            where = {p.metadata.name: p.spec.node_name for p in pods if p.spec.node_name}
            return where if len(where) == len(names) else None

        where = await eventually(placed, 60, "all pods bound", alive, interval=0.1)
        assert set(where.values()) <= cool, f"pods landed on the overloaded node {hot}: {where}"

        # Now every node is overloaded: the pod stays pending, and the scheduler's message groups our reason.
        for name in cool:
            await annotate(kube, name, 0.95)
        if node_cache:  # the extender's node watch must have seen the patches before the scheduler asks

            async def extender_sees_them_hot() -> bool:
                args = {"Pod": _pod("probe", scheduler_name, tag), "NodeNames": sorted(cool)}
                async with aiohttp.ClientSession() as s, s.post(f"{url_prefix}/filter", json=args) as r:
                    return set((await r.json())["FailedNodes"]) == cool

            await eventually(
                extender_sees_them_hot, 10, "the extender's node cache to see the new annotations", interval=0.1
            )
        else:  # kube-scheduler sends its own cache's node objects: they must have the patches first
            await _after_kube_scheduler_saw_them(kube, namespace, scheduler_name, tag, sorted(cool)[-1], alive)
        await v1.create_namespaced_pod(namespace, _pod("late", scheduler_name, tag))

        async def unschedulable_message() -> str | None:
            pod = await v1.read_namespaced_pod("late", namespace)
            for cond in pod.status.conditions or ():
                if cond.type == "PodScheduled" and cond.status == "False" and HOT_REASON in (cond.message or ""):
                    return str(cond.message)
            assert not pod.spec.node_name, f"pod bound to {pod.spec.node_name} although every node is overloaded"
            return None

        message = await eventually(
            unschedulable_message, 60, "the pod to be reported unschedulable", alive, interval=0.1
        )
        assert f"3 {HOT_REASON}" in message, message

        if node_cache:
            _, metrics = await get(url_prefix.removesuffix("/extender") + "/metrics")
            assert 'crane_extender_requests_total{result="ok",verb="filter"}' in metrics
        else:
            assert (
                registry.get_sample_value("crane_extender_requests_total", {"verb": "filter", "result": "ok"}) or 0
            ) >= len(names) + 1
