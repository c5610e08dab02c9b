"""crane-scheduler with decider workers against the real API server: the race for the same capacity, and the
fault rows of a worker, and of the leader with its workers, killed mid-burst (0 lost, 0 doubled)."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

from tests.support.faults import FaultReport
from tests.support.scheduler_cluster import create_pods, events, pod, pods_json, wait_for
from tests.support.scheduler_faults import LEASE_DURATION, Replica, Stage

WORKERS = "2"


def decider_pids(replica: Replica) -> list[int]:
    """The replica's decider worker processes (``python -m crane_scheduler.deciders <its pid> ...``)."""
    parent = str(replica.proc.pid)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"crane_scheduler.deciders" in argv and parent.encode() in argv:
            found.append(int(entry.name))
    return found


async def workers_ready(replica: Replica, count: int) -> bool:
    return await replica.metric("crane_scheduler_decider_workers_ready") >= count


async def all_ready(*replicas: Replica) -> None:
    for replica in replicas:

        async def ready(r: Replica = replica) -> bool:
            return await workers_ready(r, int(WORKERS))

        await wait_for(ready, timeout=60, what=f"{replica.name}'s decider workers")


async def test_three_workers_racing_for_three_tight_nodes_never_overfill_one(stage: Stage) -> None:
    """Three 1-CPU nodes hold 30 pods of 100m; 40 arrive at once and three workers decide them, each unaware of the
    others' answers: exactly 30 are bound, at most 10 per node, and the other 10 are reported unschedulable."""
    pair = await stage.pair(nodes=3, cpu="1")
    a = pair.add("a", "--decision-workers", "3")
    try:
        await pair.start()
        await wait_for(lambda: workers_ready(a, 3), timeout=60, what="3 decider workers ready")
        await create_pods(stage.kube, stage.namespace, [pod(f"p-{i:02d}", stage.scheduler_name) for i in range(40)])

        async def settled() -> bool:
            failed = {e["regarding"]["uid"] for e in await events(stage.kube, stage.namespace, "FailedScheduling")}
            bound = [p for p in await pods_json(stage.kube, stage.namespace) if p["spec"].get("nodeName")]
            return len(bound) >= 30 and len(failed) >= 10

        await wait_for(settled, timeout=60, what="30 pods bound and 10 refused")
        results = {r: await a.metric("crane_scheduler_decider_results_total", result=r) for r in ("taken", "checked")}
        results["refused"] = await a.metric("crane_scheduler_decider_results_total", result="refused")
    finally:
        await pair.stop()
    per_node = Counter(
        p["spec"]["nodeName"] for p in await pods_json(stage.kube, stage.namespace) if p["spec"].get("nodeName")
    )
    assert sum(per_node.values()) == 30 and max(per_node.values()) == 10, per_node
    assert results["taken"] > 0, results  # the workers decided
    assert results["checked"] + results["refused"] > 0, results  # and raced: stale answers checked again


async def test_a_decider_worker_killed_mid_burst_every_pod_bound_once(stage: Stage, fault_report: FaultReport) -> None:
    row = fault_report.row(f"scheduler: kill -9 of one of the leader's {WORKERS} decider workers mid-burst")
    pair = await stage.pair()
    a = pair.add("a", "--decision-workers", WORKERS)
    pair.add("b", "--decision-workers", WORKERS)
    killed: list[int] = []

    async def kill_a_worker() -> None:
        killed.extend(decider_pids(a)[:1])
        assert killed, "no decider worker to kill"
        os.kill(killed[0], signal.SIGKILL)

    try:
        await stage.burst_with_fault(pair, row, kill_a_worker, started=lambda: all_ready(a))
        restarts = await a.metric("crane_scheduler_decider_restarts_total")
        lost = await a.metric("crane_scheduler_decider_results_total", result="lost")
        row.note = f"worker restarted {restarts:.0f}x; {lost:.0f} decisions it held were made by the scheduling process"
    finally:
        await pair.stop()
    assert row.doubled == 0 and row.lost == 0
    assert restarts == 1


async def test_the_leader_killed_with_its_workers_mid_burst_the_standby_binds_the_rest_once(
    stage: Stage, fault_report: FaultReport
) -> None:
    row = fault_report.row(f"scheduler: kill -9 of the leader and its {WORKERS} decider workers mid-burst")
    pair = await stage.pair()
    a = pair.add("a", "--decision-workers", WORKERS, "--kube-api-qps", "30", "--kube-api-burst", "30")
    b = pair.add("b", "--decision-workers", WORKERS)
    try:
        await stage.burst_with_fault(pair, row, a.proc.kill, started=lambda: all_ready(a, b))
        took_over = (b.leading_since() or float("inf")) - pair.fault_at
        assert took_over <= LEASE_DURATION + 3.0, f"the standby took {took_over:.2f}s to lead"
        taken = await b.metric("crane_scheduler_decider_results_total", result="taken")
        row.note = f"standby led {took_over:.2f}s after the kill; its workers' answers taken: {taken:.0f}"
    finally:
        await pair.stop()
    assert row.doubled == 0 and row.lost == 0
    assert taken > 0  # the standby's workers decided the rest
