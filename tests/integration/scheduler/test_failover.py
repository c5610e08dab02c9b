"""Crashes and failover with the real ``crane-scheduler`` process: no pod bound twice, no event lost or doubled."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.rbac import ServiceIdentity, install_identities
from tests.support.scheduler_cluster import (
    child_process,
    config_for,
    create_nodes,
    create_pods,
    events,
    node,
    pod,
    pods_json,
    wait_for,
)


async def _account(cluster: LocalCluster, kube: client.ApiClient, namespace: str) -> ServiceIdentity:
    """The chart's scheduler ServiceAccount for this test: its own Lease (the chart grants only that one)."""
    return (await install_identities(cluster, kube, namespace))["scheduler"]


def _lease_config(scheduler_name: str, account: ServiceIdentity) -> dict[str, Any]:
    cfg = config_for(scheduler_name)
    cfg["leaderElection"] = {
        "leaderElect": True,
        "resourceNamespace": account.namespace,
        "resourceName": account.lease_name,
        "leaseDuration": "4s",
        "renewDeadline": "3s",
        "retryPeriod": "500ms",
    }
    return cfg


async def _bound(kube: client.ApiClient, namespace: str) -> dict[str, str]:
    return {
        p["metadata"]["uid"]: p["spec"]["nodeName"]
        for p in await pods_json(kube, namespace)
        if p["spec"].get("nodeName")
    }


async def _readyz(port: int) -> dict[str, Any]:
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/readyz") as r:
            body: dict[str, Any] = json.loads(await r.text())
            return body
    except aiohttp.ClientError:
        return {}


async def test_kill_9_mid_burst_then_restart_binds_every_pod_exactly_once(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
) -> None:
    await create_nodes(kube, [node(f"{group}-{i}", group, cpu="16") for i in range(10)])
    account = await _account(cluster, kube, namespace)
    cfg = _lease_config(scheduler_name, account)
    proc, port = child_process(
        cluster,
        cfg,
        selector,
        f"{namespace}-a",
        cluster.run_dir,
        "--kube-api-qps",
        "100",
        "--kube-api-burst",
        "100",
        kubeconfig=account.kubeconfig,
    )
    await proc.start()
    try:
        await proc.wait_ready(lambda: _is_leader(port), timeout=30)
        creating = asyncio.create_task(
            create_pods(kube, namespace, [pod(f"p-{i:03d}", scheduler_name) for i in range(500)])
        )
        await wait_for(lambda: _count_at_least(kube, namespace, 100), timeout=60, what="100 pods bound")
        await proc.kill()
        killed_at = len(await _bound(kube, namespace))
        await creating
        assert killed_at < 500, "the burst was over before the kill; nothing was tested"

        await proc.start()  # same identity: it takes its own lease back at once
        await wait_for(lambda: _count_at_least(kube, namespace, 500), timeout=120, what="all 500 pods bound")
        bound = await _bound(kube, namespace)

        async def all_events() -> list[dict[str, Any]] | None:
            evs = await events(kube, namespace, "Scheduled")
            return evs if len({e["regarding"]["uid"] for e in evs}) >= 500 else None

        scheduled = await wait_for(all_events, timeout=60, what="a Scheduled event for every pod")
    finally:
        await proc.stop()
    per_uid = Counter(e["regarding"]["uid"] for e in scheduled)
    assert set(per_uid) == set(bound) and len(bound) == 500
    assert max(per_uid.values()) == 1, [uid for uid, n in per_uid.items() if n > 1][:5]
    for e in scheduled:  # each event names the node the pod really got
        assert e["note"].endswith(f" to {bound[e['regarding']['uid']]}")


async def _is_leader(port: int) -> bool:
    return (await _readyz(port)).get("leadership") == "leader"


async def _count_at_least(kube: client.ApiClient, namespace: str, n: int) -> bool:
    return len(await _bound(kube, namespace)) >= n


async def test_two_replicas_one_leads_and_the_other_takes_over_when_it_is_killed(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
) -> None:
    await create_nodes(kube, [node(f"{group}-{i}", group) for i in range(3)])
    account = await _account(cluster, kube, namespace)
    cfg = _lease_config(scheduler_name, account)
    replicas = {
        name: child_process(cluster, cfg, selector, name, cluster.run_dir, kubeconfig=account.kubeconfig)
        for name in (f"{namespace}-a", f"{namespace}-b")
    }
    for proc, _ in replicas.values():
        await proc.start()
    try:

        async def leaders() -> list[str] | None:
            states = {name: (await _readyz(port)).get("leadership") for name, (_, port) in replicas.items()}
            if sorted(str(s) for s in states.values()) == ["leader", "standby"]:
                return [name for name, s in states.items() if s == "leader"]
            return None

        (leader,) = await wait_for(leaders, timeout=30, what="one leader and one standby")
        (standby,) = set(replicas) - {leader}
        await create_pods(kube, namespace, [pod(f"first-{i}", scheduler_name) for i in range(10)])
        await wait_for(lambda: _count_at_least(kube, namespace, 10), what="the leader to bind the first pods")
        first = await wait_for(lambda: _events_at_least(kube, namespace, 10), what="events of the first pods")
        assert {e["reportingInstance"] for e in first} == {leader}

        await replicas[leader][0].kill()
        await create_pods(kube, namespace, [pod(f"second-{i}", scheduler_name) for i in range(10)])
        await wait_for(lambda: _count_at_least(kube, namespace, 20), timeout=30, what="the standby to take over")
        lease = await client.CoordinationV1Api(kube).read_namespaced_lease(account.lease_name, account.namespace)
        assert lease.spec.holder_identity == standby
        assert (await _readyz(replicas[standby][1])).get("leadership") == "leader"
        evs = await wait_for(lambda: _events_at_least(kube, namespace, 20), what="events of the second pods")
        assert {e["reportingInstance"] for e in evs if e["regarding"]["name"].startswith("second-")} == {standby}
    finally:
        for proc, _ in replicas.values():
            await proc.stop()


async def _events_at_least(kube: client.ApiClient, namespace: str, n: int) -> list[dict[str, Any]] | None:
    evs = await events(kube, namespace, "Scheduled")
    return evs if len(evs) >= n else None
