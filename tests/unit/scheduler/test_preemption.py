"""DefaultPreemption against kube-scheduler 1.35: candidates, minimal victims (reprieve), PDBs, tie-breaking,
messages, nomination, and the API calls of the eviction."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.framework import ArgsError, Diagnosis, Handle
from crane_scheduler.framework.runtime import Profile
from crane_scheduler.listers import Listers
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins import defaultpreemption
from crane_scheduler.plugins.defaultpreemption.evaluator import VictimOrders, dry_run, more_important
from crane_scheduler.plugins.defaultpreemption.plugin import DefaultPreemption
from crane_scheduler.podinfo import PodInfo, parse_pod
from crane_scheduler.writer import Reply
from crane_scheduler.writer.protocol import JSON, STRATEGIC_MERGE_PATCH, UNSENT
from tests.support.scheduler import FakeWriter, node, pod, table
from tests.support.volumes import decide, listers, profile, pv, pvc, storage_class
from tests.support.waiting import eventually


def preempt(t: NodeTable, ls: Listers, p: dict[str, Any], prof: Profile | None = None) -> tuple[Diagnosis, PodInfo]:
    prof = prof or profile(t, ls)
    info = parse_pod(p)
    state: dict[str, Any] = {}
    result = decide(t, ls, info, state, prof)
    assert isinstance(result, Diagnosis), result
    prof.run_post_filter(state, info, result)
    return result, info


def _calls_done(plugin: DefaultPreemption, uid: str) -> None:
    """The preemption's API calls "ran" (their task was not started)."""
    plugin.preempting.discard(uid)
    plugin._nominating.discard(uid)


def victims_of(prof: Profile) -> DefaultPreemption:
    plugin = prof.plugins["DefaultPreemption"]
    assert isinstance(plugin, DefaultPreemption)
    return plugin


@dataclasses.dataclass
class OneVictim:
    """One full node ``a`` running ``low`` (priority 1), and ``vip`` (priority 100) just preempted it."""

    t: NodeTable
    ls: Listers
    prof: Profile
    plugin: DefaultPreemption
    info: PodInfo
    activated: list[str]
    events: list[tuple[Any, ...]]


def preempt_one_victim(writer: FakeWriter, activate: Callable[[str], None] | None = None) -> OneVictim:
    t = table(node("a", cpu="1"), bound=[pod("low", cpu="1", priority=1, node_name="a")])
    ls = listers()
    prof = profile(t, ls, writer=writer)
    assert prof.handle is not None
    activated: list[str] = []
    events: list[tuple[Any, ...]] = []
    prof.handle.activate = activate or activated.append
    prof.handle.record_event = lambda *event: events.append(event)
    _, info = preempt(t, ls, pod("vip", cpu="1", priority=100), prof)
    return OneVictim(t, ls, prof, victims_of(prof), info, activated, events)


def test_high_priority_pod_is_nominated_where_the_least_important_victim_runs() -> None:
    t = table(
        node("a", cpu="1"),
        node("b", cpu="1"),
        bound=[pod("mid", cpu="1", priority=10, node_name="a"), pod("low", cpu="1", priority=5, node_name="b")],
    )
    ls = listers()
    d, info = preempt(t, ls, pod("vip", cpu="1", priority=100))
    assert t.nominated[info.uid][1] == "b"
    assert d.message == "0/2 nodes are available: 2 Insufficient cpu."  # success adds no PostFilter message
    # The nomination reserves b for the preemptor: a lower-priority pod does not get it meanwhile.
    small = decide(t, ls, pod("other", cpu="1", priority=100))
    assert isinstance(small, Diagnosis)


def test_reprieve_keeps_the_more_important_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    t = table(
        node("a", cpu="1"),
        bound=[
            pod("p2", cpu="500m", priority=2, node_name="a"),
            pod("p1", cpu="500m", priority=1, node_name="a"),
        ],
    )
    ls = listers()
    prof = profile(t, ls)
    captured: list[Any] = []
    plugin = victims_of(prof)
    original = plugin._nominate

    def spy(p: PodInfo, best: Any, message: str) -> None:
        captured.append(best)
        original(p, best, message)

    monkeypatch.setattr(plugin, "_nominate", spy)
    preempt(t, ls, pod("vip", cpu="500m", priority=100), prof)
    assert [v.name for v in captured[0].victims] == ["p1"]
    assert len(list(t.pods_on("a"))) == 2  # the dry run left the table as it was


def test_pdb_steers_the_victim_choice() -> None:
    guarded = pod("guarded", cpu="1", priority=1, node_name="a")
    guarded["metadata"]["labels"] = {"app": "db"}
    t = table(node("a", cpu="1"), node("b", cpu="1"), bound=[guarded, pod("free", cpu="1", priority=1, node_name="b")])
    pdb = {
        "metadata": {"name": "db", "namespace": "ns"},
        "spec": {"selector": {"matchLabels": {"app": "db"}}},
        "status": {"disruptionsAllowed": 0},
    }
    ls = listers(pdbs=[pdb])
    for _ in range(5):  # whatever the random offset
        t.nominated.clear()
        _, info = preempt(t, ls, pod("vip", cpu="1", priority=100))
        assert t.nominated[info.uid][1] == "b"


def test_preemption_policy_never_is_honoured() -> None:
    t = table(node("a", cpu="1"), bound=[pod("low", cpu="1", priority=1, node_name="a")])
    d, info = preempt(t, listers(), pod("vip", cpu="1", priority=100, spec={"preemptionPolicy": "Never"}))
    assert d.message == (
        "0/1 nodes are available: 1 Insufficient cpu. preemption: not eligible due to preemptionPolicy=Never."
    )
    assert info.uid not in t.nominated


def test_no_lower_priority_pods_means_no_victims() -> None:
    t = table(
        node("a", cpu="1"),
        node("b", cpu="1", taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}]),
        bound=[pod("high", cpu="1", priority=1000, node_name="a")],
    )
    d, _ = preempt(t, listers(), pod("vip", cpu="1", priority=100))
    assert d.message == (
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint(s). "
        "preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, "
        "1 Preemption is not helpful for scheduling."
    )


def test_tie_breaking_prefers_fewer_victims() -> None:
    t = table(
        node("a", cpu="1"),
        node("b", cpu="1"),
        bound=[
            pod("a1", cpu="500m", priority=1, node_name="a"),
            pod("a2", cpu="500m", priority=1, node_name="a"),
            pod("b1", cpu="1", priority=1, node_name="b"),
        ],
    )
    for _ in range(5):
        t.nominated.clear()
        _, info = preempt(t, listers(), pod("vip", cpu="1", priority=100))
        assert t.nominated[info.uid][1] == "b"


def test_nominated_pods_count_for_equal_or_lower_priority_only() -> None:
    t = table(node("a", cpu="1"), node("b", cpu="1"), bound=[pod("busy", cpu="1", priority=0, node_name="b")])
    nominee = parse_pod(pod("nominee", cpu="1", priority=50))
    t.nominated[nominee.uid] = (nominee, "a")
    ls = listers()
    lower = decide(t, ls, pod("lower", cpu="1", priority=50))
    assert isinstance(lower, Diagnosis) and lower.message == "0/2 nodes are available: 2 Insufficient cpu."
    higher = decide(t, ls, pod("higher", cpu="1", priority=51))
    assert isinstance(higher, ScheduleResult) and higher.node == "a"


def test_args() -> None:
    with pytest.raises(ArgsError, match="cannot be zero"):
        defaultpreemption.new({"minCandidateNodesPercentage": 0, "minCandidateNodesAbsolute": 0}, Handle(table()))
    with pytest.raises(ArgsError, match="minCandidateNodesPercentage"):
        defaultpreemption.new({"minCandidateNodesPercentage": 101}, Handle(table()))


class _Writer(FakeWriter):
    """Records the content type and term of each write too."""

    def __init__(self, answers: list[int] | None = None) -> None:
        super().__init__(answers)
        self.term = object()
        self.kinds: list[tuple[str, Any]] = []

    async def write(
        self,
        method: str,
        path: str,
        body: Any,
        term: Any,
        content_type: str = JSON,
        *,
        urgent: bool = False,
        wanted: Callable[[], bool] | None = None,
    ) -> Reply:
        self.kinds.append((content_type, term))
        body = json.loads(json.dumps(body))
        return await super().write(method, path, body, term, content_type, urgent=urgent, wanted=wanted)


async def test_victims_get_the_disruption_condition_and_are_deleted() -> None:
    writer = _Writer()
    scene = preempt_one_victim(writer)
    t, ls, prof, plugin, info, events = scene.t, scene.ls, scene.prof, scene.plugin, scene.info, scene.events
    assert info.uid in plugin.preempting
    preempt(t, ls, pod("vip-again", cpu="1", priority=100), prof)
    await plugin.drain()
    assert info.uid not in plugin.preempting
    assert writer.writes[:2] == [
        "PATCH /api/v1/namespaces/ns/pods/vip/status",
        "EVICT /api/v1/namespaces/ns/pods/low",  # the condition, then the delete (the writer process's EVICT)
    ]
    assert [kind for kind, _ in writer.kinds[:1]] == [STRATEGIC_MERGE_PATCH]
    assert all(term is writer.term for _, term in writer.kinds)  # refused by the writer once the term ended
    assert all(writer.urgent)  # on the binds' connections, not behind the reports of failed attempts
    # the nomination and the attempt's PodScheduled=False in one patch (kube's updatePod)
    nominated = writer.bodies[0]["status"]
    assert nominated["nominatedNodeName"] == "a"
    [scheduled] = nominated["conditions"]
    assert (scheduled["type"], scheduled["status"], scheduled["reason"]) == ("PodScheduled", "False", "Unschedulable")
    assert scheduled["message"].startswith("0/") and "Insufficient cpu" in scheduled["message"]
    cond = writer.bodies[1]["condition"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("DisruptionTarget", "True", "PreemptionByScheduler")
    assert cond["message"] == "crane-scheduler: preempting to accommodate a higher priority pod"
    victim_uid = t.pods[next(iter(t.pods))].uid
    assert writer.bodies[1]["uid"] == victim_uid  # the delete's UID precondition: a recreated pod is not deleted
    assert events == [
        (
            {"namespace": "ns", "name": "low", "uid": victim_uid},
            {"namespace": "ns", "name": "vip", "uid": info.uid},
            "Normal",
            "Preempted",
            "Preempting",
            f"Preempted by pod {info.uid} on node a",
        )
    ]


async def test_a_lower_pod_already_assumed_on_the_node_keeps_its_nomination() -> None:
    """kube's nominator holds no assumed pod (assume deletes its entry): a lower pod whose bind is on its way to the
    chosen node, nominated there for an autoscaler's sake, is not one of the nominations the preemptor clears."""
    binding = pod("binding", cpu="1", priority=5)
    t = table(node("a", cpu="2"), bound=[pod("low", cpu="1", priority=1, node_name="a")])
    info = parse_pod(binding)
    t.assume(info, "a")
    t.nominated[info.uid] = (info, "a")
    writer = _Writer()
    ls = listers()
    prof = profile(t, ls, writer=writer)
    _, vip = preempt(t, ls, pod("vip", cpu="1", priority=100), prof)
    await victims_of(prof).drain()
    assert t.nominated[vip.uid][1] == "a" and t.nominated[info.uid][1] == "a"
    assert "PATCH /api/v1/namespaces/ns/pods/binding/status" not in writer.writes


async def test_a_lower_preemptors_nomination_still_on_its_way_is_cleared_only_after_it_lands() -> None:
    """``mid`` preempts on ``a``, its nomination write held; ``vip`` then preempts there and clears the lower
    nomination: sent before ``mid``'s own lands, the clear would be overwritten and ``mid`` nominated again."""
    release = asyncio.Event()
    order: list[str] = []

    vip_evicting = asyncio.Event()

    class Held(_Writer):
        async def evict(self, namespace: str, name: str, uid: str, condition: dict[str, Any]) -> Reply:
            if name == "low1":  # vip's preemption: its calls have all started
                vip_evicting.set()
            return await super().evict(namespace, name, uid, condition)

        async def write(self, method: str, path: str, body: Any, term: Any, *args: Any, **kwargs: Any) -> Reply:
            status = body.get("status", {}) if isinstance(body, dict) else {}
            if path.endswith("/pods/mid/status"):
                if status.get("nominatedNodeName"):
                    await release.wait()
                    order.append("mid nominated")
                else:
                    order.append("mid cleared")
            return await super().write(method, path, body, term, *args, **kwargs)

    writer = Held()
    t = table(
        node("a", cpu="2"),
        bound=[pod("low1", cpu="1", priority=1, node_name="a"), pod("low2", cpu="1", priority=1, node_name="a")],
    )
    ls = listers()
    prof = profile(t, ls, writer=writer)
    plugin = victims_of(prof)
    preempt(t, ls, pod("mid", cpu="1", priority=50), prof)
    await writer.evicting.wait()  # mid's preemption runs, its nomination held
    _calls_done(plugin, next(uid for uid, (p, _) in t.nominated.items() if p.name == "mid"))
    for record in list(t.pods.values()):  # its victim went
        if record.pod is not None and record.uid in plugin._victims:
            t.remove_pod(record.uid)
    preempt(t, ls, pod("vip", cpu="2", priority=100), prof)
    assert "mid" not in {p.name for p, _ in t.nominated.values()}  # vip cleared it in memory at once
    await vip_evicting.wait()
    release.set()
    await plugin.drain()
    assert order == ["mid nominated", "mid cleared"]


async def test_a_failed_eviction_retries_the_preemptor_at_once() -> None:
    """The eviction answers 500: no Preempted event, and the preemptor is activated (kube's Activate after an API
    error) instead of waiting for a victim that is not going."""
    writer = _Writer(answers=[200, 500])
    with capture_logs() as logs:
        scene = preempt_one_victim(writer)
        await scene.plugin.drain()
    [failed] = [e for e in logs if e["event"] == "preemption failed"]
    assert (failed["pod"], failed["verb"], failed["object"], failed["status"]) == ("ns/vip", "evict", "pod ns/low", 500)
    assert writer.writes == [
        "PATCH /api/v1/namespaces/ns/pods/vip/status",
        "EVICT /api/v1/namespaces/ns/pods/low",
    ]
    assert scene.events == []
    assert scene.activated == [scene.info.uid]
    assert not scene.plugin.pre_enqueue(scene.info)


async def test_a_preemption_that_fails_after_one_eviction_went_holds_back_what_that_victim_blocks() -> None:
    """``vip`` evicts both pods of ``a``: ``low1``'s deletion is accepted, ``low2``'s answers 500. ``vip`` is retried,
    and the pods ``low2`` kept from preempting again are released (it is not going); those ``low1`` keeps back
    wait until it has left the cache (it still goes: released at once, they would preempt a second pod for room
    about to be free)."""

    class SecondFails(_Writer):
        async def evict(self, namespace: str, name: str, uid: str, condition: dict[str, Any]) -> Reply:
            if name == "low2":
                return Reply(500)
            return await super().evict(namespace, name, uid, condition)

    t = table(
        node("a", cpu="2"),
        bound=[pod("low1", cpu="1", priority=1, node_name="a"), pod("low2", cpu="1", priority=1, node_name="a")],
    )
    ls = listers()
    prof = profile(t, ls, writer=SecondFails())
    assert prof.handle is not None
    activated: list[str] = []
    prof.handle.activate = activated.append
    plugin = victims_of(prof)
    _, vip = preempt(t, ls, pod("vip", cpu="2", priority=100), prof)
    uid = {r.name: r.uid for r in t.pods.values()}
    for victim, waiter in (("low1", "on-low1"), ("low2", "on-low2")):  # as ``eligible`` records a blocked pod
        plugin._blocked[uid[victim]] = {waiter}
        plugin._blocked_by[waiter] = {uid[victim]}
    await plugin.drain()
    assert sorted(activated) == sorted([vip.uid, "on-low2"])
    t.remove_pod(uid["low1"])  # the watch shows the accepted eviction
    assert activated[-1] == "on-low1" and not plugin._victims


class _SlowEvictions(_Writer):
    """Answers every write at once except an eviction, whose reply waits for ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def evict(self, namespace: str, name: str, uid: str, condition: dict[str, Any]) -> Reply:
        reply = await super().evict(namespace, name, uid, condition)  # sent
        await self.release.wait()  # its reply is not back yet
        return reply


async def test_the_preemptor_is_retried_once_its_victims_left_the_cache_before_the_delete_replies() -> None:
    """As kube's ``IsPodRunningPreemption`` (the last victim looked up in the lister): once its nomination is
    written and the watch showed its victim gone, the preemptor is activated, though the reply to the eviction
    (through the writer process) is not back yet; a retry meanwhile does not preempt a second time."""
    writer = _SlowEvictions()
    scene = preempt_one_victim(writer)
    t, ls, prof, plugin, info, activated = scene.t, scene.ls, scene.prof, scene.plugin, scene.info, scene.activated
    await asyncio.wait_for(writer.evicting.wait(), 10)
    await eventually(lambda: info.uid not in plugin._nominating, 10, "the nomination's reply handled")
    assert writer.writes == ["PATCH /api/v1/namespaces/ns/pods/vip/status", "EVICT /api/v1/namespaces/ns/pods/low"]
    assert scene.events == []  # the eviction's reply is not back
    assert info.uid in plugin.preempting and plugin.pre_enqueue(info)  # the victim is still there
    victim = next(r for r in t.pods.values() if r.name == "low")
    t.remove_pod(victim.uid)  # the informer saw it deleted
    assert not plugin.pre_enqueue(info)
    assert activated == [info.uid]
    result = decide(t, ls, info, {}, prof)
    assert isinstance(result, ScheduleResult) and result.node == "a"
    writer.release.set()
    await plugin.drain()
    assert info.uid not in plugin.preempting


async def test_a_retry_while_the_calls_run_does_not_preempt_again() -> None:
    writer = _SlowEvictions()
    scene = preempt_one_victim(writer)
    await asyncio.wait_for(writer.evicting.wait(), 10)
    result, _ = preempt(scene.t, scene.ls, scene.info.raw, scene.prof)
    assert "waiting for the preemption for this pod to be finished" in result.message
    assert scene.plugin.victims_metric._value.get() == 1
    writer.release.set()
    await scene.plugin.drain()


async def test_writes_that_were_not_sent_retry_the_preemptor_after_a_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer process is restarting (UNSENT): no eviction, and the preemptor is not retried at once, which
    would spin it through PostFilter while nothing can be written, but after ``NOT_SENT_RETRY``."""
    monkeypatch.setattr("crane_scheduler.plugins.defaultpreemption.plugin.NOT_SENT_RETRY", 0.01)
    writer = _Writer(answers=[UNSENT, UNSENT])
    activated: list[str] = []
    retried = asyncio.Event()

    def activate(uid: str) -> None:
        activated.append(uid)
        retried.set()

    scene = preempt_one_victim(writer, activate)
    await scene.plugin.drain()
    assert activated == [] and scene.events == []  # nothing evicted
    await asyncio.wait_for(retried.wait(), 5)
    assert activated == [scene.info.uid]


async def test_a_victim_already_gone_is_not_an_error() -> None:
    scene = preempt_one_victim(_Writer(answers=[200, 404]))
    await scene.plugin.drain()
    assert scene.plugin.pre_enqueue(scene.info)  # still waits for the cache to see the victim go
    assert scene.activated == []


def test_simulated_removal_and_return_leave_the_table_exactly_as_it_was() -> None:
    ports = [{"containerPort": 80, "hostPort": 8080}]
    from tests.support.scheduler import container

    bound = [
        pod("web", node_name="a", containers=[container("250m", "1Gi", ports=ports, extra={"example.com/gpu": "1"})]),
        pod("db", cpu="1", memory="2Gi", node_name="a"),
        pod("b1", cpu="500m", node_name="b"),
    ]
    t = table(node("a", extra={"example.com/gpu": "2"}), node("b"), bound=bound)
    before = (
        t.requested.copy(),
        t.nonzero_requested.copy(),
        t.pod_count.copy(),
        {k: list(v) for k, v in t.ports.items()},
        set(t.pods),
    )
    gone = t.simulate_remove(list(t.pods))
    assert not t.requested.any() and not t.pod_count.any() and not t.ports
    t.simulate_add(gone)
    after = (t.requested, t.nonzero_requested, t.pod_count, t.ports, set(t.pods))
    assert (before[0] == after[0]).all() and (before[1] == after[1]).all() and (before[2] == after[2]).all()
    assert before[3] == after[3] and before[4] == after[4]


# ---------------------------------------------------------------------------------------------- cross-node filters
# kube's SelectVictimsOnNode tells InterPodAffinity and PodTopologySpread of every removal and reprieve
# (PreFilterExtensions RemovePod/AddPod), one node at a time. These pods are only placeable by evicting a pod the
# incoming pod's (anti-)affinity or spread constraint counts.

ZONE = "topology.kubernetes.io/zone"


def labelled(p: dict[str, Any], **labels: str) -> dict[str, Any]:
    p["metadata"]["labels"] = labels
    return p


def anti_web(name: str, priority: int) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": ZONE}
    spec = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}
    return pod(name, priority=priority, spec=spec)


def spread_web(name: str, priority: int, max_skew: int) -> dict[str, Any]:
    constraint = {
        "maxSkew": max_skew,
        "topologyKey": ZONE,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": {"app": "web"}},
    }
    return labelled(pod(name, priority=priority, spec={"topologySpreadConstraints": [constraint]}), app="web")


def nominated_victims(monkeypatch: pytest.MonkeyPatch, prof: Profile) -> list[Any]:
    captured: list[Any] = []
    plugin = victims_of(prof)
    original = plugin._nominate

    def spy(p: PodInfo, best: Any, message: str) -> None:
        captured.append(best)
        original(p, best, message)

    monkeypatch.setattr(plugin, "_nominate", spy)
    return captured


def test_evicting_the_pod_an_anti_affinity_term_counts_frees_its_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    t = table(
        node("a", labels={ZONE: "z1"}),
        node("b", labels={ZONE: "z2"}),
        bound=[
            labelled(pod("low-web", priority=1, node_name="a"), app="web"),
            labelled(pod("high-web", priority=1000, node_name="b"), app="web"),
        ],
    )
    ls = listers()
    prof = profile(t, ls)
    captured = nominated_victims(monkeypatch, prof)
    d, info = preempt(t, ls, anti_web("vip", 100), prof)
    assert d.message == "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."
    assert t.nominated[info.uid][1] == "a"
    assert [v.name for v in captured[0].victims] == ["low-web"]
    # The dry run left the pod index as it was: the zone still holds both web pods.
    again = decide(t, ls, anti_web("other", 0))
    assert isinstance(again, Diagnosis)
    assert again.message == "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules."


def test_a_victim_elsewhere_in_the_zone_does_not_count_for_this_node() -> None:
    """Both nodes of zone z1 hold a low-priority web pod: evicting either alone leaves the other in the zone, so
    no node is a candidate (kube dry-runs each node alone; evicting both at once is not a candidate)."""
    t = table(
        node("a1", labels={ZONE: "z1"}),
        node("a2", labels={ZONE: "z1"}),
        node("b", labels={ZONE: "z2"}),
        bound=[
            labelled(pod("web-1", priority=1, node_name="a1"), app="web"),
            labelled(pod("web-2", priority=1, node_name="a2"), app="web"),
            labelled(pod("web-3", priority=1000, node_name="b"), app="web"),
        ],
    )
    d, info = preempt(t, listers(), anti_web("vip", 100))
    assert info.uid not in t.nominated
    assert d.post_filter_msg == (
        "preemption: 0/3 nodes are available: 1 No preemption victims found for "
        "incoming pod, 2 node(s) didn't match pod anti-affinity rules."
    )


def test_existing_pods_anti_affinity_is_lifted_by_evicting_them(monkeypatch: pytest.MonkeyPatch) -> None:
    term = {"labelSelector": {"matchLabels": {"app": "vip"}}, "topologyKey": "kubernetes.io/hostname"}
    spec = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}
    t = table(
        node("a"),
        node("b", cpu="100m"),
        bound=[pod("shy", priority=1, node_name="a", spec=spec), pod("full", cpu="100m", priority=1, node_name="b")],
    )
    ls = listers()
    prof = profile(t, ls)
    captured = nominated_victims(monkeypatch, prof)
    _, info = preempt(t, ls, labelled(pod("vip", cpu="200m", priority=100), app="vip"), prof)
    assert t.nominated[info.uid][1] == "a"
    assert [v.name for v in captured[0].victims] == ["shy"]


def test_spread_reprieve_puts_the_more_important_pod_back_into_the_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """maxSkew 2: zone z1 holds two web pods, z2 none (its node is full with a more important pod). Evicting
    both fits, reprieving the more important one still fits (1 + 1 - 0 = 2), the other must go."""
    t = table(
        node("a", labels={ZONE: "z1"}),
        node("b", cpu="1", labels={ZONE: "z2"}),
        bound=[
            labelled(pod("web-keep", priority=5, node_name="a"), app="web"),
            labelled(pod("web-go", priority=1, node_name="a"), app="web"),
            pod("hog", cpu="1", priority=1000, node_name="b"),
        ],
    )
    ls = listers()
    prof = profile(t, ls)
    captured = nominated_victims(monkeypatch, prof)
    d, info = preempt(t, ls, spread_web("vip", 100, max_skew=2), prof)
    assert d.message == (
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match pod topology spread constraints."
    )
    assert t.nominated[info.uid][1] == "a"
    assert [v.name for v in captured[0].victims] == ["web-go"]


def test_exact_ties_keep_the_nodes_pod_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal priority and start time: kube sorts its NodeInfo's pods (in the order they were added), so the first
    added is reprieved first and the later one is the victim, however often the dry run has run before."""
    started = {"startTime": "2026-01-01T00:00:00Z"}
    first = pod("first", cpu="500m", priority=0, node_name="a")
    second = pod("second", cpu="500m", priority=0, node_name="a")
    first["status"] = second["status"] = started
    t = table(node("a", cpu="1"), bound=[first, second])
    ls = listers()
    prof = profile(t, ls)
    captured = nominated_victims(monkeypatch, prof)
    for i in range(4):
        t.nominated.clear()  # each attempt alone (a nominated preemptor would count against the next)
        preempt(t, ls, pod(f"vip-{i}", cpu="500m", priority=5), prof)
        assert [v.name for v in captured[-1].victims] == ["second"]


def test_nominated_pods_count_for_inter_pod_anti_affinity() -> None:
    """kube's RunFilterPluginsWithNominatedPods adds a nominated pod of at least the pod's priority through
    AddPod, so InterPodAffinity counts it in its zone: the zone is refused while the nomination stands."""
    t = table(node("a", labels={ZONE: "z1"}), node("c", cpu="50m", labels={ZONE: "z2"}))
    nominee = parse_pod(labelled(pod("nominee", priority=100), app="web"))
    t.nominated[nominee.uid] = (nominee, "a")
    ls = listers()
    refused = decide(t, ls, anti_web("incoming", 50))
    assert isinstance(refused, Diagnosis)
    assert refused.message == (
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match pod anti-affinity rules."
    )
    lower = parse_pod(labelled(pod("lower", priority=10), app="web"))
    t.nominated.clear()
    t.nominated[lower.uid] = (lower, "a")  # a nominee of lower priority does not count
    placed = decide(t, ls, anti_web("incoming", 50))
    assert isinstance(placed, ScheduleResult) and placed.node == "a"


def test_read_write_once_pod_claim_is_freed_only_by_evicting_its_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """VolumeRestrictions counts a ReadWriteOncePod claim's users across nodes (kube's PreFilter state with
    RemovePod): evicting the user on node a frees the claim there; evicting b's pods does not."""
    claim = pvc("data", volume="pv-data", bound=True, modes=("ReadWriteOncePod",))
    volume = pv("pv-data", claim="data", phase="Bound", modes=("ReadWriteOncePod",))
    volumes = [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]
    t = table(
        node("a"),
        node("b"),
        bound=[
            pod("user", priority=1, node_name="a", spec={"volumes": volumes}),
            pod("bystander", priority=1, node_name="b"),
        ],
    )
    ls = listers(pvcs=[claim], pvs=[volume], storageclasses=[storage_class("local")])
    prof = profile(t, ls)
    captured = nominated_victims(monkeypatch, prof)
    for i in range(4):  # whatever the random offset
        t.nominated.clear()
        _, info = preempt(t, ls, pod(f"vip-{i}", priority=100, spec={"volumes": volumes}), prof)
        assert t.nominated[info.uid][1] == "a"
        assert [v.name for v in captured[-1].victims] == ["user"]


def _dry_runs(seed: int) -> tuple[Any, Any]:
    """One random cluster, the dry run done both ways: the reprieve as arithmetic and as filter rounds."""
    rng = random.Random(seed)
    nodes = [
        node(f"n{i}", cpu=f"{rng.choice([1, 2, 4])}", memory=f"{rng.choice([1, 2, 4])}Gi", pods=rng.choice([3, 5, 110]))
        for i in range(rng.randint(1, 8))
    ]
    bound = []
    for i in range(rng.randint(0, 24)):
        p = pod(
            f"v{i}",
            cpu=f"{rng.choice([100, 300, 500, 900])}m",
            memory=f"{rng.choice([100, 300, 600])}Mi",
            priority=rng.choice([1, 2, 5, 500]),
            node_name=f"n{rng.randrange(len(nodes))}",
        )
        if rng.random() < 0.3:
            p["metadata"]["labels"] = {"app": "db"}
        if rng.random() < 0.3:
            p["status"] = {"startTime": f"2026-01-01T00:00:{rng.randrange(60):02d}Z"}
        bound.append(p)
    t = table(*nodes, bound=bound)
    preemptor = parse_pod(pod("vip", cpu=f"{rng.choice([300, 900, 1500])}m", memory="200Mi", priority=100))
    for i in range(rng.randint(0, 3)):  # nominated pods, of higher and lower priority than the preemptor
        other = parse_pod(pod(f"nom{i}", cpu="300m", memory="100Mi", priority=rng.choice([50, 100, 200])))
        t.nominated[other.uid] = (other, f"n{rng.randrange(len(nodes))}")
    pdbs = [
        {
            "metadata": {"namespace": "ns", "name": "db"},
            "spec": {"selector": {"matchLabels": {"app": "db"}}},
            "status": {"disruptionsAllowed": rng.choice([0, 1])},
        }
    ]
    ls = listers()
    prof = profile(t, ls)
    plugin = victims_of(prof)
    per_node, reprieve = plugin._dry_run_mode(prof, preemptor)
    assert not per_node and reprieve is not None  # resources only: the arithmetic applies

    def run(st: dict[str, Any], p: PodInfo, alive: Any, /, *, with_nominated: bool = True) -> Any:
        return prof.run_prefilter_and_filter(st, p, t, alive, with_nominated=with_nominated)

    offset, wanted = rng.randrange(len(nodes)), rng.choice([1, 2, 100])
    results = []
    for mode in (reprieve, None):
        before = {uid: (r.node, r.uid) for uid, r in t.pods.items()}
        got = dry_run(t, preemptor, t.live.copy(), run, pdbs, offset, wanted, 0.0, reprieve=mode)
        assert {uid: (r.node, r.uid) for uid, r in t.pods.items()} == before  # the what-if was undone
        results.append(
            ([(c.node, [v.name for v in c.victims], c.pdb_violations) for c in got.candidates], dict(got.statuses))
        )
    return results[0], results[1]


@pytest.mark.parametrize("seed", range(200))
def test_arithmetic_reprieve_finds_what_the_filter_rounds_find(seed: int) -> None:
    arithmetic, rounds = _dry_runs(seed)
    assert arithmetic == rounds


def test_the_arithmetic_is_used_only_when_no_other_plugin_reading_pods_has_a_say() -> None:
    t = table(node("a", cpu="1"), bound=[pod("low", cpu="1", priority=1, node_name="a")])
    prof = profile(t, listers())
    plugin = victims_of(prof)
    plain = parse_pod(pod("vip", cpu="1", priority=100))
    assert plugin._dry_run_mode(prof, plain)[1] is not None
    ported = parse_pod(
        pod("vip2", priority=100, containers=[{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}]}])
    )
    assert plugin._dry_run_mode(prof, ported) == (False, None)  # NodePorts reads the node's pods
    anti = labelled(anti_web("vip3", 100), app="web")
    assert plugin._dry_run_mode(prof, parse_pod(anti)) == (True, None)  # InterPodAffinity: node by node


def test_a_preemptor_is_gated_until_its_victims_left_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    t = table(node("a", cpu="1"), bound=[pod("low", cpu="1", priority=1, node_name="a")])
    ls = listers()
    prof = profile(t, ls, writer=FakeWriter())
    plugin = victims_of(prof)
    activated: list[str] = []
    assert prof.handle is not None
    prof.handle.activate = activated.append
    monkeypatch.setattr(plugin, "_spawn", lambda coro: coro.close())  # the API calls "ran": not preempting
    _, info = preempt(t, ls, pod("vip", cpu="1", priority=100), prof)
    _calls_done(plugin, info.uid)
    assert plugin.pre_enqueue(info)  # the victim is still in the cache, not terminating
    assert activated == []
    victim = next(r for r in t.pods.values() if r.name == "low")
    t.remove_pod(victim.uid)  # the informer saw it deleted
    assert not plugin.pre_enqueue(info)
    assert activated == [info.uid]


@dataclasses.dataclass
class TwoLow:
    """Node ``a`` (2 CPUs) full with ``low1`` and ``low2`` (1 CPU, priority 1); the preemption's API calls do not
    run (``_spawn`` closes them), activations are recorded."""

    t: NodeTable
    ls: Listers
    prof: Profile
    plugin: DefaultPreemption
    activated: list[str]


def two_low(monkeypatch: pytest.MonkeyPatch) -> TwoLow:
    t = table(
        node("a", cpu="2"),
        bound=[pod("low1", cpu="1", priority=1, node_name="a"), pod("low2", cpu="1", priority=1, node_name="a")],
    )
    ls = listers()
    prof = profile(t, ls, writer=FakeWriter())
    plugin = victims_of(prof)
    assert prof.handle is not None
    activated: list[str] = []
    prof.handle.activate = activated.append
    monkeypatch.setattr(plugin, "_spawn", lambda coro: coro.close())  # the API calls "ran"
    return TwoLow(t, ls, prof, plugin, activated)


def test_a_victim_two_preemptors_chose_lets_both_go_once_it_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """``mid`` evicts one pod of ``a``; before it is gone, ``vip`` (higher, needing the whole node, ``mid``'s
    nomination not counting for it) picks both: once ``mid``'s victim left the cache, ``mid`` is retried too."""
    scene = two_low(monkeypatch)
    t, ls, prof, plugin, activated = scene.t, scene.ls, scene.prof, scene.plugin, scene.activated
    _, mid = preempt(t, ls, pod("mid", cpu="1", priority=50), prof)
    _calls_done(plugin, mid.uid)
    [shared] = plugin._waiting[mid.uid]
    _, vip = preempt(t, ls, pod("vip", cpu="2", priority=100), prof)
    _calls_done(plugin, vip.uid)
    assert shared in plugin._waiting[vip.uid]
    t.remove_pod(shared)
    assert activated == [mid.uid]  # vip still waits for its other victim
    t.remove_pod(next(iter(plugin._waiting[vip.uid])))
    assert activated == [mid.uid, vip.uid]


def test_a_victim_being_preempted_on_the_nominated_node_counts_as_terminating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two preemptors nominated to one node, the second's victim not gone yet: the first, retried, waits for it
    (kube's "terminating pod on the nominated node") instead of evicting a second pod, held back until that
    victim's deletion has started, and is retried once the victim has left the cache."""
    scene = two_low(monkeypatch)
    t, ls, prof, plugin, activated = scene.t, scene.ls, scene.prof, scene.plugin, scene.activated
    _, first = preempt(t, ls, pod("first", cpu="1", priority=100), prof)
    _calls_done(plugin, first.uid)
    gone = next(uid for uid in plugin._waiting[first.uid])
    t.remove_pod(gone)  # the first's victim is gone: it is activated
    assert activated == [first.uid]
    _, second = preempt(t, ls, pod("second", cpu="1", priority=100), prof)
    _calls_done(plugin, second.uid)
    assert t.nominated[second.uid][1] == "a"
    retried = parse_pod(pod("first", cpu="1", priority=100))
    retried = dataclasses.replace(
        retried, uid=first.uid, raw={**retried.raw, "metadata": {**retried.raw["metadata"], "uid": first.uid}}
    )
    result = decide(t, ls, retried, {}, prof)
    assert isinstance(result, Diagnosis)  # the second's nomination holds the room its victim still fills
    victims_before = dict(plugin._victims)
    choice = plugin.select(retried, result)
    assert choice.best is None and "terminating pod on the nominated node" in choice.message
    assert plugin._victims == victims_before  # nobody else evicted
    # Held back (PreEnqueue) while that victim's deletion has not started: other victims leaving would retry
    # it in vain; once the victim is terminating, kube's queue rules again; once it is gone, it is retried.
    assert plugin.pre_enqueue(retried)
    blocking = next(uid for uid in plugin._waiting[second.uid])
    raw = t.pods[blocking].pod.raw  # type: ignore[union-attr]
    t.add_pod(parse_pod({**raw, "metadata": {**raw["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}))
    assert not plugin.pre_enqueue(retried)
    t.remove_pod(blocking)
    assert first.uid in activated[1:]
    assert not plugin.pre_enqueue(retried) and first.uid not in plugin._blocked_by


def test_a_nominated_pod_is_tried_on_its_nominated_node_alone_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """kube's evaluateNominatedNode: only the pods nominated to that node are added for Filter's second pass
    (not every preemptor's, node by node); when the node no longer fits, every node is evaluated."""
    t = table(node("a", cpu="1"), node("b", cpu="1"), node("c", cpu="1"))
    ls = listers()
    others = [parse_pod(pod(f"other-{n}", cpu="1", priority=100)) for n in ("b", "c")]
    for other, n in zip(others, ("b", "c"), strict=True):
        t.nominated[other.uid] = (other, n)
    me = parse_pod(pod("me", cpu="1", priority=100))
    t.nominated[me.uid] = (me, "a")
    added: list[list[str]] = []
    real = t.simulate_add

    def spy(records: Any, *, notify: bool = False) -> Any:
        added.append([r.name for r in records])
        return real(records, notify=notify)

    monkeypatch.setattr(t, "simulate_add", spy)
    result = decide(t, ls, me)
    assert isinstance(result, ScheduleResult) and result.node == "a"
    assert added == []  # nobody else nominated to a
    t.add_pod(parse_pod(pod("filler", cpu="1", node_name="a")))
    result = decide(t, ls, me)
    assert isinstance(result, Diagnosis)  # b and c are held for the pods nominated there
    assert sorted(added[-1]) == ["other-b", "other-c"]


@pytest.mark.parametrize("seed", range(60))
def test_the_kept_victim_order_is_the_fresh_sort(seed: int) -> None:
    """``VictimOrders`` (each node's pods sorted, kept across dry runs) gives what sorting the node's pods afresh gives,
    for any preemptor priority and ``now``, as pods come and go, are updated, or leave and return in a what-if."""
    rng = random.Random(seed)
    started = rng.choice(["all", "none", "mixed"])

    def bound(i: int) -> dict[str, Any]:
        p = pod(f"v{i}", cpu="100m", priority=rng.choice([1, 2, 5, 500]), node_name=f"n{rng.randrange(3)}")
        if started == "all" or (started == "mixed" and rng.random() < 0.5):
            p["status"] = {"startTime": f"2026-01-01T00:00:{rng.randrange(4):02d}Z"}
        return p

    t = table(*(node(f"n{i}", cpu="100") for i in range(3)), bound=[bound(i) for i in range(rng.randint(0, 15))])
    n = 100
    orders = VictimOrders(t)
    for _ in range(12):
        name, priority = f"n{rng.randrange(3)}", rng.choice([1, 2, 3, 100, 1000])
        now = rng.choice([0.0, 1.8e9, 1.7672256e9 + 2])
        fresh = [r for r in t.pods_on(name) if r.pod is not None and r.pod.priority < priority]
        fresh.sort(key=more_important(now))
        assert [r.uid for r in orders.lower(name, priority, now)] == [r.uid for r in fresh]
        change = rng.randrange(4)
        if change == 0 and t.pods:
            t.remove_pod(rng.choice(sorted(t.pods)))
        elif change == 1:
            t.add_pod(parse_pod(bound(n)))
            n += 1
        elif change == 2 and t.pods:  # the same pod, now of another priority
            uid = rng.choice(sorted(t.pods))
            record = t.pods[uid]
            assert record.pod is not None
            raw = json.loads(json.dumps(record.pod.raw))
            raw["spec"]["priority"] = rng.choice([1, 2, 5, 500])
            t.add_pod(parse_pod(raw))
        elif change == 3:  # a what-if that takes pods out and puts them back
            t.simulate_add(t.simulate_remove([r.uid for r in t.pods_on(name)]))


async def test_a_failed_eviction_releases_the_preemptor_only_once_its_other_evictions_returned() -> None:
    """One victim's eviction fails while the other's is still on its way: the preemptor stays held back (its
    victims still its own) until that call returned too, as kube activates it after its preemption finished;
    released at once, its retry preempted on the other full node as well (three victims for one pod)."""

    class OneFailsOneWaits(FakeWriter):
        def __init__(self) -> None:
            super().__init__()
            self.term = object()
            self.release, self.holding = asyncio.Event(), asyncio.Event()

        async def evict(self, namespace: str, name: str, uid: str, condition: dict[str, Any]) -> Reply:
            self.writes.append(f"EVICT {name}")
            if sum(w.startswith("EVICT") for w in self.writes) == 1:
                return Reply(500)
            self.holding.set()
            await self.release.wait()
            return Reply(200)

    halves = [pod(f"low{i}", cpu="500m", priority=1, node_name=n) for i, n in enumerate("aabb", start=1)]
    t = table(node("a", cpu="1"), node("b", cpu="1"), bound=halves)
    ls, writer = listers(), OneFailsOneWaits()
    prof = profile(t, ls, writer=writer)
    assert prof.handle is not None
    activated: list[str] = []
    prof.handle.activate = activated.append
    prof.handle.record_event = lambda *event: None
    plugin = victims_of(prof)
    _, info = preempt(t, ls, pod("vip", cpu="1", priority=100), prof)
    await asyncio.wait_for(writer.holding.wait(), 10)  # one eviction failed (500), the other is on its way
    for _ in range(10):  # the failure's handling would run in these turns
        await asyncio.sleep(0)
    assert info.uid not in activated and plugin.pre_enqueue(info)  # still held back
    writer.release.set()
    await plugin.drain()
    assert info.uid in activated  # retried once every call returned
