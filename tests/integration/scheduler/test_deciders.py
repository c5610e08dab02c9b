"""Decider workers as real processes beside the scheduling loop (no API server: binds answer at once and the pod
watch's confirmations are delivered by the test): the race they must never lose, and a worker killed mid-burst."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from typing import Any

from crane_scheduler.deciders import pool as pool_module
from crane_scheduler.deciders.pool import DeciderPool
from crane_scheduler.explain import render
from crane_scheduler.framework import SUCCESS, CycleState, Status
from crane_scheduler.podinfo import PodInfo
from crane_scheduler.reporting import Reporter
from crane_scheduler.scheduler import Scheduler
from crane_scheduler.simulate import Simulator
from tests.support.scheduler import node, pod


class Binds:
    """DefaultBinder answering at once; the test confirms the binds to the cache as the pod watch would."""

    name = "DefaultBinder"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.raw: dict[str, dict[str, Any]] = {}

    async def bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        self.calls.append((pod.uid, node))
        return SUCCESS

    def confirm(self, s: Scheduler, done: int) -> int:
        for uid, name in self.calls[done:]:
            raw = self.raw[uid]
            s.on_pod({**raw, "spec": {**raw["spec"], "nodeName": name}})
        return len(self.calls)


async def _run(
    workers: int, nodes: list[dict[str, Any]], pods: list[dict[str, Any]], until: Any, fault: Any = None
) -> tuple[Scheduler, Binds, DeciderPool, list[int]]:
    binds = Binds()
    sim = Simulator(plugins={"DefaultBinder": lambda args, handle: binds}, out_of_tree=False)
    restarts: list[int] = []
    pool = DeciderPool(workers, None, out_of_tree=False, on_restart=lambda: restarts.append(1))
    s = Scheduler(
        config=sim.config,
        profiles=sim.profiles,
        table=sim.table,
        reporter=Reporter(None, None, "test"),
        deciders=pool,
    )
    for n in nodes:
        s.on_node(n)
    await pool.start()
    assert await pool.wait_ready(60), "the decider workers did not start"
    for p in pods:
        binds.raw[p["metadata"]["uid"]] = p
        s.on_pod(p)
    stopping = asyncio.Event()
    s.synced.set()
    loop = asyncio.create_task(s.run(stopping))
    confirmed, deadline = 0, time.monotonic() + 90
    try:
        while not until(s, binds):
            assert time.monotonic() < deadline, f"{len(binds.calls)} binds; queue {s.queue.active_len}"
            await asyncio.sleep(0.01)
            confirmed = binds.confirm(s, confirmed)
            if fault is not None and fault(s, binds, pool):
                fault = None
    finally:
        stopping.set()
        s._wake()
        await loop
        await pool.close()
    return s, binds, pool, restarts


def _signal_a_worker(sig: signal.Signals, after: int, pids: list[int]) -> Any:
    """A fault for ``_run``: ``sig`` to one worker once ``after`` pods are bound (its pid appended to ``pids``)."""

    def fault(s: Scheduler, b: Binds, pool: DeciderPool) -> bool:
        if len(b.calls) < after or not pool.pids:
            return False
        pids.append(pool.pids[0])
        os.kill(pids[0], sig)
        return True

    return fault


def _results(s: Scheduler) -> dict[str, int]:
    return {
        sample.labels["result"]: int(sample.value)
        for metric in s.metrics.decider_results.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


async def test_three_workers_racing_for_three_nodes_never_overfill_one() -> None:
    """Three 1-CPU nodes hold 30 pods of 100m; 40 arrive and 3 workers decide them at once, each unaware of the
    others' answers: the scheduling process binds exactly 30, at most 10 per node, and refuses the rest."""
    nodes = [node(f"n{i}", cpu="1", memory="64Gi") for i in range(3)]
    pods = [pod(f"p{i:02d}", "100m", "10Mi") for i in range(40)]
    s, binds, _, _ = await _run(3, nodes, pods, lambda s, b: len(b.calls) + len(s.queue.unschedulable) >= 40)
    per_node = Counter(n for _, n in binds.calls)
    assert sum(per_node.values()) == 30 and max(per_node.values()) == 10, per_node
    assert len({uid for uid, _ in binds.calls}) == 30  # none bound twice
    results = _results(s)
    # the race happened: answers that were no longer fresh were filtered again, or refused and decided again
    assert results.get("checked", 0) + results.get("refused", 0) > 0, results
    assert results.get("taken", 0) > 0, results
    uid, bound_to = binds.calls[0]  # and cranectl explain says who decided
    decision = s.decisions.get(f"ns/{binds.raw[uid]['metadata']['name']}")
    assert decision is not None
    result = render(decision)["result"]
    assert result["node"] == bound_to and "decider worker" in result["decidedBy"], result


async def test_a_worker_killed_mid_burst_its_pods_are_decided_anyway_once_and_it_comes_back() -> None:
    nodes = [node(f"n{i}", cpu="4", memory="64Gi") for i in range(10)]
    pods = [pod(f"p{i:03d}", "100m", "10Mi") for i in range(300)]
    killed: list[int] = []
    kill_one = _signal_a_worker(signal.SIGKILL, after=60, pids=killed)
    s, binds, _, restarts = await _run(2, nodes, pods, lambda s, b: len(b.calls) >= 300, kill_one)
    assert killed and len(binds.calls) == 300
    assert len({uid for uid, _ in binds.calls}) == 300  # every pod bound once
    assert max(Counter(n for _, n in binds.calls).values()) <= 40  # 4 CPUs of 100m pods
    assert restarts == [1]
    assert _results(s).get("lost", 0) > 0  # its decisions in flight were decided by the scheduling process


async def test_a_worker_that_stops_answering_is_replaced_and_its_pods_decided_anyway(monkeypatch: Any) -> None:
    """SIGSTOP: alive but silent. The watchdog kills it once its oldest decision is overdue; nothing waits forever."""
    monkeypatch.setattr(pool_module, "ANSWER_TIMEOUT", 1.0)
    nodes = [node(f"n{i}", cpu="4", memory="64Gi") for i in range(10)]
    pods = [pod(f"p{i:03d}", "100m", "10Mi") for i in range(200)]
    stopped: list[int] = []
    stop_one = _signal_a_worker(signal.SIGSTOP, after=40, pids=stopped)
    _, binds, _, restarts = await _run(1, nodes, pods, lambda s, b: len(b.calls) >= 200, stop_one)
    assert stopped and len({uid for uid, _ in binds.calls}) == 200
    assert restarts == [1]


async def test_a_worker_that_never_becomes_ready_is_restarted(monkeypatch: Any) -> None:
    """It reads nothing (stuck before its replica is built): every message sent to it would pile up in the
    scheduling process's pipe buffer. The watchdog restarts it once READY is overdue (it sleeps for ten minutes:
    only the watchdog's kill ends it)."""
    monkeypatch.setattr(pool_module, "READY_TIMEOUT", 1.0)
    restarted = asyncio.Event()
    pool = DeciderPool(1, None, out_of_tree=False, on_restart=restarted.set)
    pool._argv = [sys.executable, "-c", "import time; time.sleep(600)"]  # alive, silent, never ready
    await pool.start()
    try:
        await asyncio.wait_for(restarted.wait(), 30)
        assert pool.ready == 0
    finally:
        await pool.close()
