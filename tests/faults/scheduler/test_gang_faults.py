"""Gangs under faults: the leader killed mid-gang leaves no group partially bound (the standby completes it).

Capacity is tight: the nodes hold 62 of the 100 gangs and 2 pods more, so a scheduler that placed members one at a
time (no Coscheduling), or a standby that filled the room a split gang's missing members need, would leave a
group partly bound for good; the test audits the groups from the API server."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from kubernetes_asyncio import client

from tests.support.faults import FaultReport
from tests.support.gangs import COSCHEDULING, create_group, members
from tests.support.scheduler_cluster import create_pods, pods_json, wait_for
from tests.support.scheduler_faults import Stage, at_least_bound, audit

GROUPS, SIZE = 100, 4
NODES, CORES = 10, 25  # 250 one-core slots: 62 whole gangs (248 pods) and 2 slots no gang can use
FIT = NODES * CORES // SIZE


@pytest.mark.slow_fault
async def test_leader_killed_mid_gang_leaves_no_group_partially_bound(stage: Stage, fault_report: FaultReport) -> None:
    row = fault_report.row(f"scheduler: kill -9 of the leader mid-gang (Coscheduling, {GROUPS} gangs of {SIZE}, "
                           f"room for {FIT})")  # fmt: skip
    kube, namespace = stage.kube, stage.namespace
    pair = await stage.pair(nodes=NODES, cpu=str(CORES))
    pair.cfg["profiles"][0].update(COSCHEDULING)
    a = pair.add("a", "--kube-api-qps", "20", "--kube-api-burst", "20")  # binds spread out: the kill lands mid-gang
    pair.add("b")
    await asyncio.gather(*(create_group(kube, namespace, f"g{i:02d}", SIZE) for i in range(GROUPS)))
    try:
        await pair.start()
        pods = [p for i in range(GROUPS) for p in members(f"g{i:02d}", stage.scheduler_name, SIZE, cpu="1")]
        await create_pods(kube, namespace, pods)
        await wait_for(lambda: at_least_bound(kube, namespace, 40), timeout=60, what="40 members bound")
        at_kill = await bound_per_group(kube, namespace)
        await a.proc.kill()
        assert sum(at_kill.values()) < FIT * SIZE - 50, "the room was nearly full at the kill: nothing was tested"
        # every slot a whole gang can use is taken (then no gang fits in what is left), each pod bound once
        await wait_for(lambda: at_least_bound(kube, namespace, FIT * SIZE), timeout=120, what="the room filled")
        # a Scheduled event the killed leader did not write is written by the standby's recovery: when its term
        # starts, and once more RECOVERY_SETTLE (35 s) later for a binding its cache had not seen yet
        await audit(kube, namespace, FIT * SIZE, row)
        after = await bound_per_group(kube, namespace)
        split = sorted(g for g, n in at_kill.items() if 0 < n < SIZE)
        whole = sum(1 for n in after.values() if n == SIZE)
        said = [f"groups partly bound at the kill: {len(split)}", f"{whole} whole after the standby took over"]
        row.note = "; ".join([*said, row.note] if row.note else said)
    finally:
        await pair.stop()
    partial = {g: n for g, n in sorted(after.items()) if n != SIZE}
    assert not partial, f"groups left partly bound (of {SIZE}): {partial}"
    assert len(after) == FIT, f"{len(after)} whole groups bound where {FIT} fit"
    assert row.doubled == 0 and row.lost == 0


async def bound_per_group(kube: client.ApiClient, namespace: str) -> Counter[str]:
    pods = await pods_json(kube, namespace)
    return Counter(p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] for p in pods if p["spec"].get("nodeName"))
