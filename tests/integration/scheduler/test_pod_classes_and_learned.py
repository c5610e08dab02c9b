"""The load-aware policy's two pod classes, its learned estimates and a node without load data, on the real API
server.

Annotations are written as the annotator writes them (stamped now): the node's load, the batch pods' share of it,
and the measured usage of each running pod."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from tests.support.policy import default_policy_with
from tests.support.scheduler_cluster import (
    create_nodes,
    create_pods,
    delete_pods,
    in_process,
    node,
    node_of,
    pod,
    read_pod,
    scheduled_condition,
    wait_for,
)
from tests.support.usage_cluster import (
    BATCH_ALLOCATABLE,
    annotate,
    as_replica,
    batch_resources,
    dynamic_config,
)

GI = float(2**30)


async def refusal(kube: client.ApiClient, namespace: str, name: str) -> str:
    """The message of the pod's PodScheduled=False condition, once the scheduler has reported it."""

    async def unschedulable() -> str | None:
        cond = scheduled_condition(await read_pod(kube, namespace, name))
        return cond["message"] if cond and cond["status"] == "False" else None

    message: str = await wait_for(unschedulable, what=f"{name} to be reported unschedulable")
    return message


async def decisions(kube: client.ApiClient, namespace: str, pods: list[dict[str, Any]]) -> dict[str, str] | None:
    """Each pod's node once bound, or its refusal's message; None while one of them is still undecided."""
    out: dict[str, str] = {}
    for p in pods:
        name = p["metadata"]["name"]
        found = await read_pod(kube, namespace, name)
        cond = scheduled_condition(found)
        if found and found["spec"].get("nodeName"):
            out[name] = found["spec"]["nodeName"]
        elif cond and cond["status"] == "False":
            out[name] = cond["message"]
        else:
            return None
    return out


async def test_a_regular_pod_passes_a_node_hot_only_by_batch_work_and_a_batch_pod_is_refused(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> None:
    hot = node(f"{group}-hot", group, cpu="8", memory="32Gi")
    hot["status"]["allocatable"].update(BATCH_ALLOCATABLE)
    await create_nodes(kube, [hot])
    await annotate(kube, f"{group}-hot", 0.8, batch=0.4)  # 0.4 of the node is regular work: under 0.65
    batch = pod("batch", scheduler_name)
    batch["spec"]["containers"][0]["resources"] = batch_resources()
    async with in_process(cluster, dynamic_config(scheduler_name), selector, load_aware=True):
        await create_pods(kube, namespace, [pod("regular", scheduler_name), batch])
        landed = await wait_for(lambda: node_of(kube, namespace, "regular"), what="the regular pod to be bound")
        message = await refusal(kube, namespace, "batch")
    assert landed == f"{group}-hot"
    assert message.startswith("0/1 nodes are available: 1 node(s) had cpu_usage_avg_5m above 0.65."), message
    assert await node_of(kube, namespace, "batch") is None


# (case, node usage, peers' measured (cores, bytes), replica request (cpu, memory), replicas created at once,
#  replicas bound with the learned estimate, with the factor estimate, the refusal's metric)
SCALE_UPS: list[tuple[str, float, tuple[float, float], tuple[str, str], int, int, int, str]] = [
    # 2 cores used of 2 requested, 16-core node at 0.48: learned 0.125 per replica (0.48 + 0.25 > 0.65 for the
    # second), the factor 0.075 (0.63: both pass) and the node ends at 0.73 real usage.
    ("cpu-heavy", 0.48, (2.0, GI), ("2", "1Gi"), 2, 1, 2, "cpu_usage_avg_5m"),
    # 24Gi requested, 2Gi used, 128Gi node at 0.55: the factor refuses (0.6 x 24Gi = 0.1125), learned fits (0.016).
    ("memory-heavy", 0.55, (0.1, 2 * GI), ("100m", "24Gi"), 1, 1, 0, "mem_usage_avg_5m"),
]


@pytest.mark.parametrize("learned", [True, False], ids=["learned", "factor"])
@pytest.mark.parametrize(
    ("case", "usage", "measured", "requested", "replicas", "with_learned", "with_factor", "metric"),
    SCALE_UPS,
    ids=[c[0] for c in SCALE_UPS],
)
async def test_a_scale_up_is_judged_by_the_workloads_measured_usage(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
    case: str,
    usage: float,
    measured: tuple[float, float],
    requested: tuple[str, str],
    replicas: int,
    with_learned: int,
    with_factor: int,
    metric: str,
    learned: bool,
) -> None:
    full = f"{group}-full"
    await create_nodes(kube, [node(full, group, cpu="16", memory="128Gi")])
    cpu, memory = requested
    running = [as_replica(pod(f"web-{i}", "nobody", cpu, memory, node_name=full), "web") for i in range(3)]
    await create_pods(kube, namespace, running)
    await annotate(kube, full, usage, pods={f"{namespace}/web-{i}": measured for i in range(3)})
    new = [as_replica(pod(f"web-{3 + i}", scheduler_name, cpu, memory), "web") for i in range(replicas)]
    config = dynamic_config(scheduler_name, ownBindingsInHotValue=False, estimate={"learned": {"enabled": learned}})
    expected = with_learned if learned else with_factor
    async with in_process(cluster, config, selector, load_aware=True):
        await create_pods(kube, namespace, new)
        outcome = await wait_for(lambda: decisions(kube, namespace, new), what="every new replica bound or refused")
    bound = [n for n, v in outcome.items() if v == full]
    refused = [v for v in outcome.values() if v != full]
    assert len(bound) == expected, outcome
    for message in refused:
        assert f"1 node(s) would have {metric} above 0.65" in message, message


async def test_a_node_without_load_data_takes_pods_until_their_estimates_reach_the_threshold_and_more_once_some_go(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
    tmp_path: Path,
) -> None:
    """With ``newNodes.estimate``, an autoscaler's new node (no annotation yet) beside a hot one: 1.0 x 0.5 core / 8
    per pod, so 10 bind there (0.625) and the rest pend, for the autoscaler to see, instead of 16 filling it by
    requests. Then one bound pod is deleted and one finishes (Succeeded): their estimates leave the node as the
    scheduler sees them go, and the two pending pods bind at once, not 5 minutes later (the estimate window)."""
    await create_nodes(kube, [node(f"{group}-hot", group, cpu="8"), node(f"{group}-new", group, cpu="8")])
    await annotate(kube, f"{group}-hot", 0.9)
    new = [pod(f"p-{i}", scheduler_name, cpu="500m") for i in range(12)]
    policy = default_policy_with(tmp_path / "policy.yaml", newNodes={"estimate": True})
    config = dynamic_config(
        scheduler_name, policyConfigPath=str(policy), estimate={"cpuFactor": 1.0, "learned": {"enabled": False}}
    )
    async with in_process(cluster, config, selector, load_aware=True):
        await create_pods(kube, namespace, new)
        outcome = await wait_for(lambda: decisions(kube, namespace, new), what="every pod to be bound or refused")
        placed = [name for name, v in outcome.items() if v == f"{group}-new"]
        refused = [name for name, v in outcome.items() if v != f"{group}-new"]
        assert len(placed) == 10, outcome
        for name in refused:
            assert outcome[name].startswith(
                "0/2 nodes are available: 1 node(s) had cpu_usage_avg_5m above 0.65,"
                " 1 node(s) would have cpu_usage_avg_5m above 0.65."
            ), outcome[name]
        await delete_pods(kube, namespace, placed[:1])
        resp = await client.CoreV1Api(kube).patch_namespaced_pod_status(
            placed[1], namespace, {"status": {"phase": "Succeeded"}}, _preload_content=False
        )
        resp.release()

        async def rebound() -> bool:
            return all([await node_of(kube, namespace, name) == f"{group}-new" for name in refused])

        await wait_for(rebound, timeout=60, what="the pending pods to bind where the finished ones were")
