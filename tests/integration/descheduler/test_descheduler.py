"""crane-descheduler against the real servers: the session's API server (evictions through its Eviction API, under
the chart's RBAC with the descheduler's own token) and a real Prometheus scraping the fleet's per-pod series.

Node load is written as the annotator would write it; pods are bound to this test's nodes and marked Running (no
kubelet here), so an eviction leaves them terminating, which is what the tests look for. The budget tests run the
kit's kube-controller-manager with its disruption controller, which computes each PodDisruptionBudget's status."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio import client

from crane_sandbox.cluster import ControllerManager, LocalCluster
from crane_sandbox.fleet import GI, make_fleet
from crane_sandbox.pod_follower import create_nodes
from crane_shared.annotations import encode_usage
from crane_shared.batch import BATCH_CPU, BATCH_CPU_USAGE_KEY
from crane_shared.policy import default_policy, dump_policy
from tests.support.descheduler import (
    FAST_POLICY,
    SELECTOR_KEY,
    Fleet,
    Scene,
    annotate_load,
    pod_terminating,
    run_pod,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


async def test_a_hot_node_is_relieved_through_the_eviction_api_sparing_ineligible_pods(scene: Scene) -> None:
    # the DaemonSet pod and the bare pod use more than the victim: they would go first if they were eligible
    await scene.pods("daemon", usage="cpu=4", owner_kind="DaemonSet", owner="ds")
    await scene.pods("bare", usage="cpu=4", owner_kind=None)
    await scene.pods("victim", usage="cpu=3", owner="web-1")
    proc = await scene.start()
    read = scene.core.read_namespaced_pod
    await eventually(lambda: _terminating(read, "victim", scene.namespace), timeout=60, what="victim evicted")
    assert await proc.counter("skipped_pods", reason="daemonset") >= 1
    assert await proc.counter("skipped_pods", reason="not-recreated") >= 1
    for spared in ("daemon", "bare"):
        assert not pod_terminating(await read(spared, scene.namespace)), spared

    async def explained() -> list[Any]:  # written right after the eviction's answer, as events.k8s.io/v1
        events = await client.EventsV1Api(scene.core.api_client).list_namespaced_event(
            scene.namespace, field_selector="reason=LoadAwareDescheduled"
        )
        return [e for e in events.items if e.regarding.name == "victim"]

    (event,) = await eventually(explained, timeout=30, what="the eviction's Event")

    async def counted() -> float:  # counted once the eviction's request (and the Event's) returned
        return await proc.counter("evictions", reason="cpu_usage_avg_5m", result="evicted")

    assert await eventually(counted, timeout=30, what="the eviction counted") == 1
    assert f"evicted from node {scene.hot}: cpu_usage_avg_5m 0.900 above its threshold 0.65" in event.note
    assert scene.cool in event.note and event.reporting_controller == "crane-descheduler"
    assert event.type == "Normal" and event.action == "Descheduled"
    _, plan = await proc.get("/debug/plan")
    # after an eviction the node's debounce starts over: hot again only after two more hot rounds
    assert plan["classes"][scene.hot] in ("hot", "normal") and plan["classes"][scene.cool] == "idle"
    # the operator's view of the round that evicted it
    cranectl = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cranectl", "plan", "--descheduler", proc.url, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await cranectl.communicate()
    assert cranectl.returncode == 0 and f"idle:    {scene.cool}" in out.decode() and scene.hot in out.decode()


async def test_dry_run_evicts_nothing_and_writes_nothing(scene: Scene) -> None:
    await scene.pods("victim", usage="cpu=3")
    proc = await scene.start("--dry-run")

    async def planned() -> float:
        return await proc.counter("evictions", reason="cpu_usage_avg_5m", result="dry_run")

    await eventually(lambda: _at_least(planned, 2), timeout=60, what="two dry-run rounds planned the eviction")
    assert not pod_terminating(await scene.core.read_namespaced_pod("victim", scene.namespace))
    assert not (await scene.core.list_namespaced_event(scene.namespace)).items


async def test_stale_node_data_is_never_acted_on(scene: Scene, kube: client.ApiClient) -> None:
    await annotate_load(kube, scene.hot, 0.9, datetime.now(UTC) - timedelta(hours=1))
    await scene.pods("victim", usage="cpu=3")
    proc = await scene.start()

    async def unusable() -> float:
        return await proc.counter("unusable_nodes")

    await eventually(lambda: _at_least(unusable, 4), timeout=60, what="four rounds saw the stale node")
    assert await proc.metric("crane_descheduler_nodes", **{"class": "unknown"}) == 1
    assert await proc.counter("evictions", reason="cpu_usage_avg_5m", result="evicted") == 0
    assert not pod_terminating(await scene.core.read_namespaced_pod("victim", scene.namespace))


@pytest_asyncio.fixture
async def disruption_controller(cluster: LocalCluster) -> AsyncIterator[ControllerManager]:
    """kube-controller-manager of the kit running its disruption controller only: it computes every budget's
    status (the session's cluster runs no controllers)."""
    assert cluster.binaries is not None and cluster.pki is not None
    run_dir = cluster.run_dir / f"disruption-{uuid.uuid4().hex[:6]}"
    (run_dir / "logs").mkdir(parents=True)
    kubeconfig = cluster.component_kubeconfig("system:kube-controller-manager")
    manager = ControllerManager(run_dir, cluster.binaries, cluster.pki, kubeconfig, ("disruption-controller",))
    await manager.start()
    try:
        yield manager
    finally:
        await manager.stop()


async def budget(kube: client.ApiClient, namespace: str, min_available: int) -> None:
    body = {
        "metadata": {"name": "victim"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "victim"}}},
    }
    await client.PolicyV1Api(kube).create_namespaced_pod_disruption_budget(namespace, body)


async def computed_budget(kube: client.ApiClient, namespace: str) -> Any:
    """The budget's status once the disruption controller has computed it for its current spec."""

    async def status() -> Any:
        pdb = await client.PolicyV1Api(kube).read_namespaced_pod_disruption_budget("victim", namespace)
        observed = pdb.status.observed_generation if pdb.status else None
        return pdb.status if observed == pdb.metadata.generation and pdb.status.expected_pods == 1 else None

    return await eventually(status, timeout=60, what="the disruption controller's status of the budget")


async def test_a_budget_that_allows_no_disruption_stops_the_eviction_before_it_is_sent(
    scene: Scene, kube: client.ApiClient, disruption_controller: ControllerManager
) -> None:
    """The descheduler's own pre-check alone: the budget's status, computed by the disruption controller, allows
    none, so the pod is skipped and no eviction reaches the API server (no 429 counted)."""
    await scene.pods("victim", usage="cpu=3")
    await budget(kube, scene.namespace, min_available=1)
    status = await computed_budget(kube, scene.namespace)
    assert (status.disruptions_allowed, status.current_healthy, status.desired_healthy) == (0, 1, 1)
    proc = await scene.start()

    async def skipped() -> float:
        return await proc.counter("skipped_pods", reason="pdb")

    await eventually(lambda: _at_least(skipped, 2), timeout=60, what="the pod skipped for its budget twice")
    assert await proc.counter("evictions", reason="cpu_usage_avg_5m", result="pdb") == 0, "an eviction was sent"
    assert await proc.counter("evictions", reason="cpu_usage_avg_5m", result="evicted") == 0
    assert not pod_terminating(await scene.core.read_namespaced_pod("victim", scene.namespace))


async def test_a_budget_whose_status_is_behind_its_spec_stops_the_eviction_as_the_api_server_would(
    scene: Scene, kube: client.ApiClient, disruption_controller: ControllerManager
) -> None:
    """The status the descheduler reads allows one disruption (computed by the controller for ``minAvailable:
    0``), but the spec changed since (``minAvailable: 1``) and no controller has processed it (stopped): the
    Eviction API answers 429 for a budget whose observedGeneration is behind, so the pre-check refuses it as well
    and nothing is sent (the API's 429 itself: ``tests/unit/descheduler/test_shell.py``)."""
    await scene.pods("victim", usage="cpu=3")
    await budget(kube, scene.namespace, min_available=0)
    status = await computed_budget(kube, scene.namespace)
    assert (status.disruptions_allowed, status.current_healthy) == (1, 1)
    await disruption_controller.stop()
    change = {"spec": {"minAvailable": 1}}
    await client.PolicyV1Api(kube).patch_namespaced_pod_disruption_budget("victim", scene.namespace, change)
    proc = await scene.start()

    async def skipped() -> float:
        return await proc.counter("skipped_pods", reason="pdb")

    await eventually(lambda: _at_least(skipped, 2), timeout=60, what="the pod skipped for its stale budget twice")
    assert await proc.counter("evictions", reason="cpu_usage_avg_5m", result="pdb") == 0, "an eviction was sent"
    assert not pod_terminating(await scene.core.read_namespaced_pod("victim", scene.namespace))
    assert await proc.counter("evictions", reason="cpu_usage_avg_5m", result="evicted") == 0


@pytest.mark.parametrize("where", ["down", "garbage"])
async def test_without_per_pod_usage_nothing_is_evicted(scene: Scene, fleet: Fleet, where: str) -> None:
    """Prometheus unreachable, or an endpoint that answers something else (the fleet exporter: 404 on the query
    API): the hot node is still classified, and nothing is evicted."""
    await scene.pods("victim", usage="cpu=3")
    url = "http://127.0.0.1:9" if where == "down" else f"http://{fleet.exporter.targets()[0][0]}"
    proc = await scene.start("--prometheus-url", url, "--prometheus-retries", "0", "--prometheus-timeout", "2s")

    async def rounds() -> float:
        return await proc.counter("rounds", result="no_usage")

    await eventually(lambda: _at_least(rounds, 4), timeout=60, what="four rounds without per-pod usage")
    assert await proc.metric("crane_descheduler_nodes", **{"class": "hot"}) == 1
    assert await proc.counter("evictions", reason="cpu_usage_avg_5m", result="evicted") == 0
    assert not pod_terminating(await scene.core.read_namespaced_pod("victim", scene.namespace))


async def test_a_node_hot_by_regular_usage_sheds_its_batch_pod_before_the_regular_pod_that_covers_it(
    scene: Scene, fleet: Fleet, kube: client.ApiClient
) -> None:
    """Issue 30's contract: 0.9 CPU of which the annotator says 0.2 is batch work, so 0.7 regular (> 0.65). The
    regular pod would cool the node alone (3 cores), the batch pod (1 core) would not: the batch pod goes first.
    One eviction a minute, so the round after it shows the regular pod waiting (``rate-limit``), not evicted."""
    now = datetime.now(UTC)
    notes = {BATCH_CPU_USAGE_KEY: encode_usage(0.2, now)}
    await scene.core.patch_node(scene.hot, {"metadata": {"annotations": notes}})
    reclaimable = {BATCH_CPU: "4000"}  # the cool node's reclaimable capacity, where the batch pod's replacement fits
    await scene.core.patch_node_status(scene.cool, {"status": {"capacity": reclaimable, "allocatable": reclaimable}})
    await scene.pods("regular", usage="cpu=3", owner="web-1")
    await scene.pods("batch", usage="cpu=1", owner="job-1", batch_cpu="500")
    policy = fleet.run_dir / f"policy-{scene.label}-batch.yaml"
    policy.write_text(FAST_POLICY.replace("LABEL", scene.label).replace("maxPerMinute: 30", "maxPerMinute: 1"))
    proc = await scene.start("--descheduler-policy", str(policy))
    read = scene.core.read_namespaced_pod
    await eventually(lambda: _terminating(read, "batch", scene.namespace), timeout=60, what="the batch pod evicted")

    async def waiting() -> float:
        return await proc.counter("skipped_pods", reason="rate-limit")

    await eventually(lambda: _at_least(waiting, 1), timeout=60, what="the regular pod next, held by the rate")
    assert not pod_terminating(await read("regular", scene.namespace))
    assert await proc.counter("evictions", reason="cpu_usage_avg_5m", result="evicted") == 1


async def _terminating(read: Callable[..., Awaitable[Any]], name: str, namespace: str) -> bool:
    return pod_terminating(await read(name, namespace))


async def _at_least(value: Callable[[], Awaitable[float]], floor: float) -> bool:
    return await value() >= floor


async def test_the_drain_empties_an_idle_node_whose_pods_all_have_a_place_and_evicts_nothing_otherwise(
    scene: Scene, fleet: Fleet, kube: client.ApiClient
) -> None:
    """``spec.drain`` with the scheduler policy's ``pack`` score: two idle nodes (10 % CPU, few requests), one
    busier node with room. Every pod of ``idle-a`` has a place on the busier node by crane-scheduler's Filter:
    both are evicted (Eviction API, ``LoadAwareDrained`` Events). On ``idle-b`` one pod may run on ``idle-b``
    only (required node affinity): its node keeps both its pods, though the other one would fit elsewhere."""
    busy, idle_a = scene.hot, scene.cool
    labels = {SELECTOR_KEY: scene.label}
    [extra] = make_fleet(1, cpu_cores=8, memory_bytes=32 * GI, labels=labels, prefix=f"ds-{scene.label}-b-")
    idle_b = extra.name
    fleet.state.add_node(extra)
    await create_nodes(kube, [extra])
    try:
        now = datetime.now(UTC)
        for name, cpu in ((busy, 0.5), (idle_a, 0.1), (idle_b, 0.1)):
            await annotate_load(kube, name, cpu, now)
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [idle_b]}]}
        pinned = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
        for name, node_name, kw in (
            ("a1", idle_a, {}),
            ("a2", idle_a, {}),
            ("b1", idle_b, {}),
            ("b2", idle_b, {"affinity": pinned}),
        ):
            await run_pod(kube, fleet.state, scene.namespace, name, node_name, scene.label, owner=f"web-{name}", **kw)
        policy = yaml.safe_load(scheduler_policy_text())
        policy["spec"]["scoring"] = {"strategy": "pack", "targetUtilization": 0.6}
        scheduler = fleet.run_dir / f"pack-{scene.label}.yaml"
        scheduler.write_text(yaml.safe_dump(policy))
        descheduler = yaml.safe_load(FAST_POLICY.replace("LABEL", scene.label))
        descheduler["spec"]["drain"] = {"consecutiveRounds": 2, "maxNodes": 2}
        descheduler["spec"]["limits"]["maxPerNodePerRound"] = 2
        path = fleet.run_dir / f"drain-{scene.label}.yaml"
        path.write_text(yaml.safe_dump(descheduler))
        proc = await scene.start("--policy", str(scheduler), "--descheduler-policy", str(path))
        read = scene.core.read_namespaced_pod
        for name in ("a1", "a2"):
            await eventually(partial(_terminating, read, name, scene.namespace), timeout=60, what=f"{name} drained")

        async def drained_events() -> list[Any]:
            events = await scene.core.list_namespaced_event(scene.namespace, field_selector="reason=LoadAwareDrained")
            return list(events.items) if len(events.items) == 2 else []

        events = await eventually(drained_events, timeout=30, what="the drain's Events")
        assert all(f"evicted from node {idle_a} to empty it" in e.message and busy in e.message for e in events)

        async def refused() -> float:  # idle-b's two pods passed over, round after round
            count = await proc.counter("skipped_pods", reason="drain-no-target")
            return count if count >= 6 else 0.0

        await eventually(refused, timeout=60, what="idle-b refused in three rounds")
        for name in ("b1", "b2"):
            assert not pod_terminating(await read(name, scene.namespace)), name
        assert await proc.counter("evictions", reason="drain", result="evicted") == 2
        _, plan = await proc.get("/debug/plan")
        assert idle_b not in plan["draining"]
    finally:
        await client.CoreV1Api(kube).delete_node(idle_b)


def scheduler_policy_text() -> str:
    return dump_policy(default_policy())
