"""Preemption and retries that see real load, on the real API server with crane-scheduler's Dynamic plugin: a
high-priority pod preempts the low-priority pods that make a node hot (their measured usage, from the node's
``crane.io/pod-usage`` annotation, leaves the node), and a pod refused only by recent estimates is retried when
they leave their window, not at the 5-minute flush of unschedulable pods."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_scheduler.__main__ import plugin_registry
from crane_shared.annotations import encode_usage
from crane_shared.batch import POD_USAGE_KEY, PodUsage, encode_pod_usage
from tests.support.policy import UPSTREAM_METRICS, write_policy
from tests.support.scheduler_cluster import (
    config_for,
    create_nodes,
    create_pods,
    events,
    in_process,
    node,
    pod,
    pods_json,
    read_pod,
    victim,
    wait_for,
)

HOT = "node(s) had cpu_usage_avg_5m above 0.65"
PUSHED = "node(s) would have cpu_usage_avg_5m above 0.65"


def annotated(name: str, group: str, cpu: float, pods: dict[str, PodUsage] | None = None) -> dict[str, Any]:
    """A 4-core node whose cpu metrics read ``cpu`` (memory 0.2), stamped 10 s ago, with its pods' usage."""
    stamp = datetime.fromtimestamp(datetime.now(UTC).timestamp() - 10, UTC)
    n = node(name, group, cpu="4")
    notes = {m: encode_usage(cpu if m.startswith("cpu") else 0.2, stamp) for m in UPSTREAM_METRICS}
    if pods is not None:
        notes[POD_USAGE_KEY] = encode_pod_usage(pods, stamp)
    n["metadata"]["annotations"] = notes
    return n


def with_dynamic(scheduler_name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return config_for(
        scheduler_name,
        profile={
            "plugins": {"multiPoint": {"enabled": [{"name": "Dynamic", "weight": 3}]}},
            "pluginConfig": [{"name": "Dynamic", "args": args or {}}],
        },
    )


async def preempted_names(kube: client.ApiClient, namespace: str) -> list[str]:
    return sorted(e["regarding"]["name"] for e in await events(kube, namespace, "Preempted"))


async def test_a_high_priority_pod_preempts_the_low_priority_pod_that_makes_the_node_hot(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
    priorities: dict[str, str],
) -> None:
    """Both nodes read cpu 0.80 and have room by requests. On ``a`` the low-priority ``big`` uses 2 of the 4 cores
    and ``small`` (mid priority) 0.2; on ``b`` nothing is measured. Without ``big``, ``a`` reads 0.25 + vip's
    estimate 0.30; with ``small`` back, 0.30 + 0.30: so ``big`` alone goes."""
    a, b = f"{group}-a", f"{group}-b"
    usage = {f"{namespace}/big": PodUsage(2.0, 1e9), f"{namespace}/small": PodUsage(0.2, 1e8)}
    await create_nodes(kube, [annotated(a, group, 0.80, usage), annotated(b, group, 0.80)])
    await create_pods(
        kube,
        namespace,
        [
            victim("big", scheduler_name, a, priorities["low"]),
            victim("small", scheduler_name, a, priorities["mid"]),
            victim("other", scheduler_name, b, priorities["low"]),
        ],
    )
    async with in_process(cluster, with_dynamic(scheduler_name), selector, plugin_registry()):
        vip = pod("vip", scheduler_name, cpu="2", spec={"priorityClassName": priorities["high"]})
        await create_pods(kube, namespace, [vip])

        async def bound() -> str | None:
            p = await read_pod(kube, namespace, "vip")
            return p["spec"].get("nodeName") if p else None

        assert await wait_for(bound, timeout=60, what="the preemptor bound") == a

        async def gone() -> bool:
            return await read_pod(kube, namespace, "big") is None

        await wait_for(gone, timeout=30, what="the victim deleted")
        refused = [e["note"] for e in await events(kube, namespace, "FailedScheduling")]
    assert any(f"2 {HOT}" in note for note in refused), refused  # load alone kept vip out before the preemption
    assert await preempted_names(kube, namespace) == ["big"]  # exactly the needed victim, once
    left = sorted(p["metadata"]["name"] for p in await pods_json(kube, namespace))
    assert left == ["other", "small", "vip"]


async def test_a_pod_refused_only_by_recent_estimates_is_retried_when_they_leave_their_window(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
    priorities: dict[str, str],
    tmp_path: Path,
) -> None:
    """``a`` reads 0.30. Two ``first`` pods bound by this scheduler add an estimate of 0.15 each; ``late`` would
    push it to 0.75. Nothing changes afterwards (no annotation update, no pod event): the estimates leave after
    their 10 s window (a margin over late's first attempt, milliseconds after theirs) and ``late`` binds then,
    although the flush of unschedulable pods is an hour away."""
    policy = write_policy(
        tmp_path / "policy.yaml",
        {
            "syncPolicy": [{"name": m, "period": "3m"} for m in UPSTREAM_METRICS],
            "predicate": [{"name": "cpu_usage_avg_5m", "maxLimitPecent": 0.65}],
            "priority": [{"name": "cpu_usage_avg_5m", "weight": 1}],
            "hotValue": [{"timeRange": "10s", "count": 5}],
        },
    )
    args = {"policyConfigPath": str(policy), "estimate": {"window": "10s"}}
    a = f"{group}-a"
    await create_nodes(kube, [annotated(a, group, 0.30)])
    # all three pending before the scheduler starts: the queue takes the two higher-priority ones first
    first = [pod(f"first-{i}", scheduler_name, cpu="1", spec={"priorityClassName": priorities["mid"]}) for i in (1, 2)]
    late = pod("late", scheduler_name, cpu="1", spec={"priorityClassName": priorities["low"]})
    await create_pods(kube, namespace, [*first, late])
    async with in_process(cluster, with_dynamic(scheduler_name, args), selector, plugin_registry()) as scheduler:
        scheduler.queue.max_unschedulable = 3600.0  # the flush of unschedulable pods cannot be what retries it

        async def bound() -> str | None:
            p = await read_pod(kube, namespace, "late")
            return p["spec"].get("nodeName") if p else None

        assert await wait_for(bound, timeout=60, what="late bound") == a
        timed = scheduler.metrics.queue_incoming.labels("TimedRetry", "active")._value.get()
        timed += scheduler.metrics.queue_incoming.labels("TimedRetry", "backoff")._value.get()
    refused = [e["note"] for e in await events(kube, namespace, "FailedScheduling")]
    assert refused and all(f"1 {PUSHED}" in note for note in refused), refused
    assert timed >= 1  # retried by the time its refusal could lift


async def test_a_node_nominated_by_someone_else_is_tried_first_and_the_others_when_it_does_not_fit(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
) -> None:
    """An autoscaler's hint (kube 1.35's NominatedNodeNameForExpectation: it nominates the node it adds): a pod
    whose ``status.nominatedNodeName`` another component wrote is placed on that node when it passes every
    Filter, though Dynamic scores another node higher (kube's ``evaluateNominatedNode``); a pod nominated to a
    node it does not fit is placed on the best of the others. The pods wait behind a scheduling gate until the
    nomination is written, as a controller that nominates before it releases them."""
    idle, warm, hot = f"{group}-idle", f"{group}-warm", f"{group}-hot"
    await create_nodes(kube, [annotated(idle, group, 0.10), annotated(warm, group, 0.50), annotated(hot, group, 0.90)])
    gate = {"schedulingGates": [{"name": "example.com/autoscaler"}]}
    v1 = client.CoreV1Api(kube)
    async with in_process(cluster, with_dynamic(scheduler_name), selector, plugin_registry()):
        await create_pods(
            kube,
            namespace,
            [pod(name, scheduler_name, spec=gate) for name in ("hinted", "misled", "plain")],
        )
        for name, nominated in (("hinted", warm), ("misled", hot)):
            await v1.patch_namespaced_pod_status(
                name,
                namespace,
                {"status": {"nominatedNodeName": nominated}},
                _content_type="application/merge-patch+json",
            )
        for name in ("hinted", "misled", "plain"):
            await v1.patch_namespaced_pod(
                name, namespace, {"spec": {"schedulingGates": None}}, _content_type="application/merge-patch+json"
            )

        async def placed() -> dict[str, str] | None:
            found = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in await pods_json(kube, namespace)}
            return found if all(found.values()) and len(found) == 3 else None

        nodes = await wait_for(placed, timeout=30, what="the three pods bound")
    assert nodes == {"plain": idle, "hinted": warm, "misled": idle}
