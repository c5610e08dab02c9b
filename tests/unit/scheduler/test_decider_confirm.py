"""The pod watch's confirmation of an assumption, sent to the decider workers as ``CONFIRM`` (what a bind changed)
instead of the bound object: the replica must end exactly where the object itself would have taken it, and the
scheduling process may send it only for the object the workers were given with the assumption."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from crane_scheduler.deciders.pool import DeciderPool
from crane_scheduler.deciders.process import Replica
from crane_scheduler.deciders.protocol import APPLY, CONFIRM, FORGET
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import bound_object, bound_version, parse_node, parse_pod
from tests.support.scheduler import container, node
from tests.support.waiting import eventually


def _pending(name: str = "web-1") -> dict[str, Any]:
    """A pending pod as the API server serves it: no ``nodeName`` key, attempted once (PodScheduled False)."""
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": "100",
            "labels": {"app": "web"},
            "managedFields": [{"manager": "kubectl", "operation": "Update"}],
        },
        "spec": {"schedulerName": "crane-scheduler", "containers": [container("250m", "256Mi")], "priority": 0},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"},
            ],
        },
    }


def _bound(pending: dict[str, Any], node_name: str, rv: str = "107") -> dict[str, Any]:
    """What the API server's binding makes of it: node, PodScheduled True in place, a new resourceVersion, and a
    managedFields entry of its own."""
    raw = copy.deepcopy(pending)
    raw["metadata"]["resourceVersion"] = rv
    raw["metadata"]["managedFields"].append({"manager": "crane-scheduler", "subresource": "binding"})
    raw["spec"]["nodeName"] = node_name
    raw["status"]["conditions"][1] = {
        "type": "PodScheduled",
        "status": "True",
        "lastTransitionTime": "2026-11-29T03:00:00Z",
    }
    return raw


def _readings(pod: Any) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(pod).items() if k != "raw"}


def test_the_rebuilt_object_reads_as_the_bound_one() -> None:
    pending = _pending()
    bound = _bound(pending, "n1")
    cond = bound["status"]["conditions"][1]
    rebuilt = bound_object(pending, "n1", "107", cond)
    assert _readings(parse_pod(rebuilt)) == _readings(parse_pod(bound))
    assert rebuilt["status"]["conditions"] == bound["status"]["conditions"]  # in place, not appended
    held = parse_pod(pending)
    confirmed = bound_version(held, rebuilt)
    assert confirmed is not None and _readings(confirmed) == _readings(parse_pod(bound))
    assert pending["spec"].get("nodeName") is None  # the pending object itself is left as it was


def _replica() -> Replica:
    replica = Replica({"config": None, "out_of_tree": False}, seed=0, first_row=0, base=0)
    replica.apply("Node", "ADDED", node("n1", cpu="4", memory="8Gi"))
    return replica


def test_a_replica_confirmed_ends_as_one_given_the_bound_object() -> None:
    pending = _pending()
    bound = _bound(pending, "n1")
    given, confirmed = _replica(), _replica()
    for replica in (given, confirmed):
        replica.assume(copy.deepcopy(pending), "n1", "crane-scheduler", 1_000.0)
    given.apply("Pod", "MODIFIED", bound)
    confirmed.confirm("uid-web-1", "n1", "107", bound["status"]["conditions"][1])
    assert confirmed.seen == given.seen  # one state step either way
    a, b = given.sim.table.pods["uid-web-1"], confirmed.sim.table.pods["uid-web-1"]
    assert (a.assumed, a.node) == (b.assumed, b.node) == (False, "n1")
    assert a.pod is not None and b.pod is not None and _readings(a.pod) == _readings(b.pod)
    row_a, row_b = given.sim.table.rows["n1"], confirmed.sim.table.rows["n1"]
    assert given.sim.table.requested[row_a].tolist() == confirmed.sim.table.requested[row_b].tolist()


def test_a_replica_asked_to_confirm_what_it_never_assumed_stops_rather_than_drift() -> None:
    with pytest.raises(RuntimeError, match="uid-web-9"):
        _replica().confirm("uid-web-9", "n1", "7", None)


async def _pool_sends(assumed_raw_is_sent: bool) -> list[Any]:
    pool = DeciderPool(1, None, out_of_tree=False)
    sent: list[Any] = []
    pool._send = sent.append  # type: ignore[method-assign,assignment]  # the messages, before packing
    pending = _pending()
    held = parse_pod(pending)
    pool.assumed(held, "n1")
    read_from = pending if assumed_raw_is_sent else copy.deepcopy(pending)
    pool.pod_event("MODIFIED", _bound(pending, "n1"), False, read_from)
    return sent


async def test_the_pool_confirms_only_the_object_it_sent_with_the_assumption() -> None:
    confirm = await _pool_sends(True)
    assert [m[0] for m in confirm] == [CONFIRM] and confirm[0][1:4] == ("uid-web-1", "n1", "107")
    assert confirm[0][4]["status"] == "True"
    assert [m[0] for m in await _pool_sends(False)] == [APPLY]  # read from another version: the object goes whole


async def test_a_pending_update_of_an_assumed_pod_leaves_the_workers_assumption_alone() -> None:
    """The watch may bring a pending version of a pod this process assumed while its bind is on its way (a label, a
    late PodScheduled=False patch): the workers keep counting it on its node, as the scheduling process does (told
    it was deleted, a worker would see the node's room free again and its answer would be taken unfiltered)."""
    pool = DeciderPool(1, None, out_of_tree=False)
    sent: list[Any] = []
    pool._send = sent.append  # type: ignore[method-assign,assignment]  # the messages, before packing
    pending = _pending()
    pool.assumed(parse_pod(pending), "n1")
    step = pool.versions.sent
    updated = copy.deepcopy(pending)
    updated["metadata"]["labels"]["tier"] = "front"
    updated["metadata"]["resourceVersion"] = "101"
    pool.pod_event("MODIFIED", updated)
    assert sent == [] and pool.versions.sent == step  # nothing for the workers, the row unchanged
    pool.pod_event("MODIFIED", _bound(pending, "n1"), False, pending)  # then its bind is confirmed as usual
    assert [m[0] for m in sent] == [CONFIRM]


def _watching_pool() -> tuple[NodeTable, DeciderPool, list[Any]]:
    """A pool following a node table with node n1, and the messages it sends its workers (before packing)."""
    table = NodeTable()
    pool = DeciderPool(1, None, out_of_tree=False)
    pool.watch(table)
    sent: list[Any] = []
    pool._send = sent.append  # type: ignore[method-assign,assignment]
    table.upsert_node(parse_node(node("n1", cpu="4", memory="8Gi")))
    return table, pool, sent


async def test_an_assumption_forgotten_without_unreserve_is_forgotten_so_by_the_workers() -> None:
    """A bind answered "already bound" keeps the plugins' Reserve state in the scheduling process (Dynamic's recent
    binding: the pod is bound, the informer accounts it): the workers' FORGET names no profile, so their replicas
    replay no Unreserve either; a failed bind's FORGET names the profile whose Unreserve they replay."""
    table, _, sent = _watching_pool()
    for name, unreserved in (("kept", False), ("failed", True)):
        pod = parse_pod(_pending(name))
        table.assume(pod, "n1")  # the table's hooks tell the pool
        table.forget(pod.uid, unreserved=unreserved)
    forgets = [m for m in sent if m[0] == FORGET]
    assert forgets == [(FORGET, "uid-kept", "n1", ""), (FORGET, "uid-failed", "n1", "crane-scheduler")]


async def test_the_loop_waiting_for_room_goes_on_when_its_last_worker_is_lost() -> None:
    """Every worker full, then gone (killed, OOM): the loop decides pods itself at once, not after a restart."""
    import asyncio

    from crane_scheduler.deciders.pool import IN_FLIGHT

    pool = DeciderPool(1, None, out_of_tree=False)
    [w] = pool._workers
    w.ready = True
    loop = asyncio.get_running_loop()
    w.pending = {rid: loop.create_future() for rid in range(IN_FLIGHT)}
    waiting = asyncio.create_task(pool.room())
    await asyncio.sleep(0)
    assert not waiting.done()  # full: the loop waits for an answer
    pool._lose(w)
    await asyncio.wait_for(waiting, 1)
    assert pool.ready == 0


async def test_a_nominated_pod_forgotten_keeps_its_nomination_known_until_the_watch_clears_it() -> None:
    """The replicas were sent the preemptor's nomination: when its assumption is undone (a failed bind), the pool
    keeps the pending object, so the watch's clear of the nomination reaches them as the pod's end there."""
    table, pool, sent = _watching_pool()
    nominated = _pending("vip")
    nominated["status"]["nominatedNodeName"] = "n1"
    pool.pod_event("MODIFIED", nominated)  # the replicas learn the nomination
    pod = parse_pod(nominated)
    table.assume(pod, "n1")
    table.forget(pod.uid)
    sent.clear()
    cleared = copy.deepcopy(nominated)
    cleared["status"]["nominatedNodeName"] = None
    pool.pod_event("MODIFIED", cleared)
    assert [(m[0], m[1], m[2]) for m in sent] == [(APPLY, "Pod", "DELETED")]


async def test_a_pod_of_a_deleted_node_leaves_no_row_version_behind() -> None:
    pool = DeciderPool(1, None, out_of_tree=False)
    pool._send = lambda message: None  # type: ignore[method-assign]  # no worker process here
    raw = node("gone", cpu="4", memory="8Gi")
    pool.node_event("ADDED", raw)
    bound = _bound(_pending(), "gone")
    pool.pod_event("ADDED", bound)
    pool.node_event("DELETED", raw)
    pool.pod_event("DELETED", bound)  # the pod garbage collector, after the node
    assert "gone" not in pool.versions._changed


async def test_a_cycle_a_workers_answer_runs_that_raises_stops_the_loop_with_its_error() -> None:
    """The local path's cycle raising ends the loop loudly (the service restarts); the same failure in a cycle
    run from a worker's answer (a callback, outside the loop's task) did only log, the pod lost and its bind
    slot held. Now the loop raises it too, and the worker is told the pod is done."""
    import asyncio

    from crane_scheduler.framework.types import QueuedPod
    from crane_scheduler.reporting import Reporter
    from crane_scheduler.scheduler import Scheduler
    from crane_scheduler.simulate import Simulator

    sim = Simulator(out_of_tree=False)
    s = Scheduler(config=sim.config, profiles=sim.profiles, table=sim.table, reporter=Reporter(None, None, "test"))
    done: list[tuple[str, int]] = []

    class Pool:
        hinted = None

        async def start(self) -> None:
            pass

        async def room(self) -> None:
            pass

        def fresh(self, node: str, seen: int, worker: int) -> bool:
            return True

        def done(self, uid: str, worker: int) -> None:
            done.append((uid, worker))

    s.deciders = Pool()  # type: ignore[assignment]

    def broken(qp: Any, hint: Any = None) -> None:
        raise RuntimeError("a plugin's bug")

    s.schedule_one = broken  # type: ignore[method-assign]
    stopping = asyncio.Event()
    s.synced.set()
    loop = asyncio.create_task(s.run(stopping))
    await eventually(lambda: s._loop_task is not None, 5, "the scheduling loop running")
    pod = parse_pod(_pending())
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    answer.set_result(("n1", 3, 0))
    s._deciding[pod.uid] = answer
    s._decided(QueuedPod(pod, 0.0), pod, answer)
    with pytest.raises(RuntimeError, match="a plugin's bug"):
        await asyncio.wait_for(loop, 5)
    assert done == [(pod.uid, 0)]
