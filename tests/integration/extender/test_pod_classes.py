"""The stock kube-scheduler with our extender judges the two pod classes as crane-scheduler does: a regular pod
passes a node hot only by batch work, a batch pod is refused there (both wire modes)."""

from __future__ import annotations

import uuid
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry

from crane_sandbox.cluster import LocalCluster
from tests.support.extender_cluster import extender_in_process, extender_process, kube_scheduler
from tests.support.scheduler_cluster import (
    create_nodes,
    create_pods,
    node,
    node_of,
    pod,
    read_pod,
    scheduled_condition,
    wait_for,
)
from tests.support.usage_cluster import BATCH_ALLOCATABLE, annotate, batch_resources

HOT_REASON = "node(s) had cpu_usage_avg_5m above 0.65"


@pytest.mark.parametrize("node_cache", [False, True], ids=["nodeCacheCapable-false", "nodeCacheCapable-true"])
async def test_the_extender_passes_a_regular_pod_and_refuses_a_batch_pod_on_a_node_hot_by_batch_work(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, run_dir: Path, tmp_path: Path, node_cache: bool
) -> None:
    tag = f"cls{'cache' if node_cache else 'list'}-{uuid.uuid4().hex[:6]}"
    scheduler_name = f"crane-e2e-{tag}"
    hot = node(f"{tag}-hot", tag, cpu="8", memory="32Gi")
    hot["status"]["allocatable"].update(BATCH_ALLOCATABLE)
    await create_nodes(kube, [hot])
    await annotate(kube, f"{tag}-hot", 0.8, batch=0.4)  # 0.4 of the node is regular work: under 0.65
    selector = {"nodeSelector": {"crane.test/group": tag}}
    regular, batch = pod("regular", scheduler_name, spec=selector), pod("batch", scheduler_name, spec=selector)
    batch["spec"]["containers"][0]["resources"] = batch_resources()
    extender = extender_process(cluster, run_dir) if node_cache else extender_in_process(CollectorRegistry())
    async with (
        extender as url_prefix,
        kube_scheduler(cluster, run_dir, tmp_path, url_prefix, node_cache=node_cache, scheduler_name=scheduler_name),
    ):
        if node_cache:  # the extender's node watch must have seen the annotations before the scheduler asks

            async def extender_sees_them() -> bool:
                args = {"Pod": batch, "NodeNames": [f"{tag}-hot"]}
                async with aiohttp.ClientSession() as s, s.post(f"{url_prefix}/filter", json=args) as r:
                    return bool((await r.json())["FailedNodes"])

            await wait_for(extender_sees_them, what="the extender's node cache to see the annotations")
        await create_pods(kube, namespace, [regular, batch])
        landed = await wait_for(lambda: node_of(kube, namespace, "regular"), 60, what="the regular pod bound")

        async def refused() -> str | None:
            cond = scheduled_condition(await read_pod(kube, namespace, "batch"))
            return cond["message"] if cond and cond["status"] == "False" and HOT_REASON in cond["message"] else None

        message = await wait_for(refused, 60, what="the batch pod reported unschedulable by the load reason")
    assert landed == f"{tag}-hot"
    assert f"1 {HOT_REASON}" in message, message
    assert await node_of(kube, namespace, "batch") is None
