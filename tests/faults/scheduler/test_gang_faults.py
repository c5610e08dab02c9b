"""Gangs under faults: the leader killed mid-gang leaves no group partially bound (the standby completes it)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from kubernetes_asyncio import client

from tests.support.faults import FaultReport
from tests.support.gangs import COSCHEDULING, create_group, members
from tests.support.scheduler_cluster import create_pods, pods_json, wait_for
from tests.support.scheduler_faults import Stage, at_least_bound, audit

GROUPS, SIZE = 60, 5


@pytest.mark.slow_fault
async def test_leader_killed_mid_gang_leaves_no_group_partially_bound(stage: Stage, fault_report: FaultReport) -> None:
    row = fault_report.row("scheduler: kill -9 of the leader mid-gang (Coscheduling, 60 gangs of 5)")
    kube, namespace = stage.kube, stage.namespace
    pair = await stage.pair()
    pair.cfg["profiles"][0].update(COSCHEDULING)
    a = pair.add("a", "--kube-api-qps", "30", "--kube-api-burst", "30")  # binds spread out: the kill lands mid-gang
    pair.add("b")
    await asyncio.gather(*(create_group(kube, namespace, f"g{i:02d}", SIZE) for i in range(GROUPS)))
    try:
        await pair.start()
        pods = [p for i in range(GROUPS) for p in members(f"g{i:02d}", stage.scheduler_name, SIZE, cpu="100m")]
        await create_pods(kube, namespace, pods)
        await wait_for(lambda: at_least_bound(kube, namespace, 60), timeout=60, what="60 members bound")
        at_kill = await bound_per_group(kube, namespace)
        await a.proc.kill()
        assert sum(at_kill.values()) < GROUPS * SIZE - 50, "the gangs were nearly all bound: nothing was tested"
        await audit(kube, namespace, GROUPS * SIZE, row)
        after = await bound_per_group(kube, namespace)
        partial = sorted(g for g, n in at_kill.items() if 0 < n < SIZE)
        row.note = f"groups partly bound at the kill: {len(partial)}; all whole after the standby took over"
    finally:
        await pair.stop()
    assert row.doubled == 0 and row.lost == 0
    assert after == {f"g{i:02d}": SIZE for i in range(GROUPS)}


async def bound_per_group(kube: client.ApiClient, namespace: str) -> Counter[str]:
    pods = await pods_json(kube, namespace)
    return Counter(p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] for p in pods if p["spec"].get("nodeName"))
