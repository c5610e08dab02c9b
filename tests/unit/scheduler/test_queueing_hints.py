"""Per-object queueing hints (kube's ``QueueingHintFn``): the queue asks the rejecting plugins' hints, and each
plugin's hint answers as kube-scheduler 1.35's for the same change."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from crane_scheduler.framework import ClusterChange, ClusterEvent, Handle, QueuedPod, QueueingHint, QueueingHints
from crane_scheduler.internal.cache import Cache
from crane_scheduler.internal.queue import SchedulingQueue
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins import (
    interpodaffinity,
    nodeaffinity,
    nodeports,
    noderesources,
    nodeunschedulable,
    podtopologyspread,
    tainttoleration,
)
from crane_scheduler.podinfo import NodeInfo, PodInfo, parse_node, parse_pod
from tests.support.scheduler import HOST, ZONE, container, labelled, node, pod

Q, S = QueueingHint.QUEUE, QueueingHint.SKIP


def P(name: str = "p", *, node_name: str = "", namespace: str = "ns", spec: Any = None, **labels: str) -> PodInfo:
    return parse_pod(labelled(pod(name, node_name=node_name, spec=spec), namespace, **labels))


def R(name: str = "p", cpu: str | None = "100m", memory: str | None = "100Mi", node_name: str = "") -> PodInfo:
    """A pod with these requests."""
    return parse_pod(labelled(pod(name, cpu, memory, node_name=node_name)))


def N(name: str = "n", **kw: Any) -> NodeInfo:
    return parse_node(node(name, **kw))


def relabel(p: PodInfo, **labels: str) -> PodInfo:
    raw = copy.deepcopy(p.raw)
    raw["metadata"]["labels"] = labels
    return parse_pod(raw)


def required(kind: str, key: str, **selector: str) -> dict[str, Any]:
    term = {"labelSelector": {"matchLabels": selector}, "topologyKey": key}
    return {"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}


def add(obj: PodInfo | NodeInfo) -> ClusterChange:
    return ClusterChange(ClusterEvent.POD_ADD if isinstance(obj, PodInfo) else ClusterEvent.NODE_ADD, None, obj)


def update(old: PodInfo | NodeInfo, new: PodInfo | NodeInfo) -> ClusterChange:
    return ClusterChange(ClusterEvent.POD_UPDATE if isinstance(old, PodInfo) else ClusterEvent.NODE_UPDATE, old, new)


def delete(obj: PodInfo | NodeInfo) -> ClusterChange:
    return ClusterChange(ClusterEvent.POD_DELETE if isinstance(obj, PodInfo) else ClusterEvent.NODE_DELETE, obj)


# ---------------------------------------------------------------------------------------------- the queue


def queue_with(hints: QueueingHints, events: ClusterEvent, **kw: Any) -> tuple[SchedulingQueue, list[tuple[str, str]]]:
    incoming: list[tuple[str, str]] = []
    q = SchedulingQueue(
        lambda qp: (qp.timestamp,),
        events_of=lambda plugin: events,
        hints_of=lambda profile, plugin: hints,
        on_incoming=lambda event, queue: incoming.append((event, queue)),
        **kw,
    )
    return q, incoming


def park(q: SchedulingQueue, p: PodInfo) -> None:
    q.add_unschedulable(QueuedPod(p, 0.0), frozenset({"Plugin"}), 0.0)


def only_db(pod: PodInfo, change: ClusterChange) -> QueueingHint:
    assert isinstance(change.new, PodInfo)
    return Q if change.new.name == "db" else S


def test_a_change_the_hint_skips_leaves_the_pod_and_one_it_queues_moves_it() -> None:
    q, incoming = queue_with({ClusterEvent.POD_ADD: only_db}, ClusterEvent.POD_ADD)
    park(q, P("cache"))
    q.on_event(ClusterEvent.POD_ADD, add(P("other", node_name="a")))
    assert q.pop(100.0) is None and len(q.unschedulable) == 1
    q.on_event(ClusterEvent.POD_ADD, add(P("db", node_name="a")))
    popped = q.pop(100.0)
    assert popped is not None and popped.pod.name == "cache"
    assert incoming == [("POD_ADD", "active")]


def test_events_the_plugin_did_not_register_never_ask_its_hint() -> None:
    def boom(pod: PodInfo, change: ClusterChange) -> QueueingHint:
        raise AssertionError("asked")

    q, _ = queue_with({ClusterEvent.NODE_ADD: boom}, ClusterEvent.POD_ADD)
    park(q, P("cache"))
    q.on_event(ClusterEvent.NODE_ADD, add(N("x")))
    assert q.pop(100.0) is None


def test_a_registered_event_without_a_hint_and_an_event_without_objects_always_queue() -> None:
    q, _ = queue_with({}, ClusterEvent.POD_ADD)
    park(q, P("cache"))
    q.on_event(ClusterEvent.POD_ADD, add(P("other", node_name="a")))
    assert q.pop(100.0) is not None
    q, _ = queue_with({ClusterEvent.POD_ADD: only_db}, ClusterEvent.POD_ADD)
    park(q, P("cache"))
    q.on_event(ClusterEvent.POD_ADD, add(P("other", node_name="a")))
    q.on_event(ClusterEvent.POD_ADD)  # e.g. a PVC change: no objects a hint could judge
    assert q.pop(100.0) is not None


def test_a_hint_that_raises_queues_the_pod_and_is_reported() -> None:
    errors: list[str] = []

    def broken(pod: PodInfo, change: ClusterChange) -> QueueingHint:
        raise KeyError("x")

    q, _ = queue_with({ClusterEvent.POD_ADD: broken}, ClusterEvent.POD_ADD, on_hint_error=lambda p, e: errors.append(p))
    park(q, P("cache"))
    q.on_event(ClusterEvent.POD_ADD, add(P("other", node_name="a")))
    assert q.pop(100.0) is not None
    assert errors == ["Plugin"]


def test_past_the_hint_budget_a_pass_wakes_per_event_kind() -> None:
    calls: list[str] = []

    def counting(pod: PodInfo, change: ClusterChange) -> QueueingHint:
        calls.append(pod.name)
        return S

    q, _ = queue_with({ClusterEvent.POD_ADD: counting}, ClusterEvent.POD_ADD, hint_budget=3)
    for i in range(2):
        park(q, P(f"w{i}"))
    q.on_event(ClusterEvent.POD_ADD, add(P("x", node_name="a")))
    assert q.pop(100.0) is None and len(calls) == 2  # 2 pods x 1 change: within the budget
    q.on_event(ClusterEvent.POD_ADD, add(P("y", node_name="a")))
    q.on_event(ClusterEvent.POD_ADD, add(P("z", node_name="a")))
    assert q.pop(100.0) is not None and len(calls) == 2  # 2 x 2 > 3: no hint asked, everyone moves
    assert q.pop(100.0) is not None


def _affinity_behind_a_cache() -> tuple[interpodaffinity.InterPodAffinity, SchedulingQueue, Cache]:
    """An InterPodAffinity plugin's events and hints in a queue, fed by a cache over a fresh node table."""
    table = NodeTable()
    plugin = interpodaffinity.InterPodAffinity(interpodaffinity.Args(), Handle(table))
    q = SchedulingQueue(
        lambda qp: (qp.timestamp,),
        events_of=lambda name: plugin.events_to_register(),
        hints_of=lambda profile, name: plugin.queueing_hints(),
    )
    return plugin, q, Cache(table, q, {"crane-scheduler"}, clock=lambda: 0.0)


def test_the_cache_hands_the_objects_over_so_an_annotation_update_does_not_wake_an_affinity_pod() -> None:
    plugin, q, cache = _affinity_behind_a_cache()
    cache.on_node(node("a", labels={ZONE: "z1"}))
    q.add_unschedulable(
        QueuedPod(P("cache", spec=required("podAffinity", ZONE, app="db"), app="cache"), 0.0),
        frozenset({plugin.name}),
        0.0,
    )
    annotated = node("a", labels={ZONE: "z1"})
    annotated["metadata"]["annotations"] = {"cpu_usage_avg_5m": "0.3,2026-01-01T00:00:00Z"}
    cache.on_node(annotated)  # a node update the scheduler sees, but no label changed
    cache.on_pod(labelled(pod("web", node_name="a", scheduler="nobody"), app="web"))
    assert q.pop(100.0) is None
    cache.on_pod(labelled(pod("db", node_name="a", scheduler="nobody"), app="db"))
    assert q.pop(100.0) is not None


def test_the_cache_hands_over_the_previous_version_of_a_relabelled_bound_pod() -> None:
    plugin, q, cache = _affinity_behind_a_cache()
    cache.on_node(node("a"))
    bound = labelled(pod("web", node_name="a", scheduler="nobody"), app="web")
    cache.on_pod(bound)
    q.add_unschedulable(
        QueuedPod(P("cache", spec=required("podAffinity", HOST, app="db")), 0.0), frozenset({plugin.name}), 0.0
    )
    same = copy.deepcopy(bound)
    same["status"] = {"phase": "Running"}
    cache.on_pod(same)
    assert q.pop(100.0) is None
    relabelled = copy.deepcopy(same)
    relabelled["metadata"]["labels"] = {"app": "db"}
    cache.on_pod(relabelled)  # the same accounting: the table updates its record in place
    assert q.pop(100.0) is not None


# ---------------------------------------------------------------------------------------------- TaintToleration

NO_SCHEDULE = {"key": "k", "value": "v", "effect": "NoSchedule"}


def test_taint_toleration_hint() -> None:
    hint = tainttoleration.after_node_change
    p = P()
    tolerant = P(spec={"tolerations": [{"key": "k", "operator": "Exists"}]})
    assert hint(p, add(N())) is Q
    assert hint(p, add(N(taints=[NO_SCHEDULE]))) is S
    assert hint(tolerant, add(N(taints=[NO_SCHEDULE]))) is Q
    assert hint(p, update(N(taints=[NO_SCHEDULE]), N())) is Q  # the taint went away
    assert hint(p, update(N(taints=[NO_SCHEDULE]), N(taints=[NO_SCHEDULE], labels={"x": "y"}))) is S
    assert hint(p, update(N(), N(labels={"x": "y"}))) is S  # was tolerated already: nothing new
    prefer = {"key": "k", "value": "v", "effect": "PreferNoSchedule"}
    assert hint(p, update(N(taints=[NO_SCHEDULE]), N(taints=[prefer]))) is Q


# ---------------------------------------------------------------------------------------------- NodePorts


def test_node_ports_hint() -> None:
    hint = nodeports.after_pod_deleted

    def with_port(name: str, port: int, node_name: str = "") -> PodInfo:
        c = container("100m", "100Mi", ports=[{"containerPort": port, "hostPort": port, "protocol": "TCP"}])
        return parse_pod(labelled(pod(name, node_name=node_name, containers=[c])))

    p = with_port("p", 8080)
    assert hint(p, delete(with_port("holder", 8080, node_name="a"))) is Q
    assert hint(p, delete(with_port("other", 9090, node_name="a"))) is S
    assert hint(p, delete(P("plain", node_name="a"))) is S


# ---------------------------------------------------------------------------------------------- NodeUnschedulable


def test_node_unschedulable_hint() -> None:
    hint = nodeunschedulable.after_node_change
    p = P()
    assert hint(p, add(N())) is Q
    assert hint(p, add(N(unschedulable=True))) is S
    assert hint(p, update(N(unschedulable=True), N())) is Q  # uncordoned
    assert hint(p, update(N(), N(labels={"x": "y"}))) is S
    assert hint(p, update(N(unschedulable=True), N(unschedulable=True, labels={"x": "y"}))) is S


# ---------------------------------------------------------------------------------------------- NodeAffinity


def test_node_affinity_hint() -> None:
    hint = nodeaffinity.after_node_change
    selector = P(spec={"nodeSelector": {"disk": "ssd"}})
    assert hint(selector, add(N(labels={"disk": "ssd"}))) is Q
    assert hint(selector, add(N(labels={"disk": "hdd"}))) is S
    assert hint(selector, update(N(labels={"disk": "hdd"}), N(labels={"disk": "ssd"}))) is Q
    assert hint(selector, update(N(labels={"disk": "ssd"}), N(labels={"disk": "ssd", "x": "y"}))) is S
    assert hint(selector, update(N(labels={"disk": "ssd"}), N(labels={}))) is S
    expressions = [
        {"key": "cores", "operator": "Gt", "values": ["8"]},
        {"key": "gpu", "operator": "DoesNotExist"},
        {"key": "zone", "operator": "NotIn", "values": ["bad"]},
    ]
    terms = {"nodeSelectorTerms": [{"matchExpressions": expressions}]}
    affinity = P(spec={"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}})
    assert hint(affinity, add(N(labels={"cores": "16"}))) is Q
    assert hint(affinity, add(N(labels={"cores": "8"}))) is S
    assert hint(affinity, add(N(labels={"cores": "16", "gpu": "1"}))) is S
    assert hint(affinity, add(N(labels={"cores": "16", "zone": "bad"}))) is S
    name_pin = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}
    pinned = P(spec={"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": name_pin}}})
    assert hint(pinned, add(N("b"))) is Q
    assert hint(pinned, add(N("c"))) is S


def test_node_affinity_hint_agrees_with_the_vectorised_filter_mask() -> None:
    from crane_scheduler.plugins.nodeaffinity import node_matches, required_mask

    nodes = [
        node("a", labels={"cores": "16", "disk": "ssd"}),
        node("b", labels={"cores": "4", "disk": "ssd"}),
        node("c", labels={"cores": "x", "gpu": "1"}),
        node("d"),
    ]
    table = NodeTable()
    for n in nodes:
        table.upsert_node(parse_node(n))
    for expr in (
        {"key": "cores", "operator": "Lt", "values": ["8"]},
        {"key": "cores", "operator": "Gt", "values": ["8"]},
        {"key": "gpu", "operator": "Exists"},
        {"key": "disk", "operator": "In", "values": ["ssd", "nvme"]},
        {"key": "disk", "operator": "NotIn", "values": ["ssd"]},
    ):
        terms = {"nodeSelectorTerms": [{"matchExpressions": [expr]}]}
        p = P(spec={"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}})
        mask = required_mask(table, p)
        assert [bool(mask[table.rows[n["metadata"]["name"]]]) for n in nodes] == [
            node_matches(p, parse_node(n)) for n in nodes
        ], expr


# ---------------------------------------------------------------------------------------------- NodeResourcesFit


def test_node_resources_fit_pod_hint() -> None:
    hint = noderesources.after_pod_event
    p = R(cpu="1", memory="1Gi")
    big = R("big", cpu="2", memory="1Gi", node_name="a")
    assert hint(p, delete(big)) is Q
    assert hint(p, update(big, R("big", cpu="1", memory="1Gi", node_name="a"))) is Q
    more_memory = R("big", cpu="2", memory="2Gi", node_name="a")
    assert hint(p, update(more_memory, big)) is Q
    assert hint(p, update(R("big", cpu="2", memory="2Gi"), R("big", cpu="1", memory="1Gi"))) is S  # not placed
    cpu_only = R(cpu="1", memory=None)
    assert hint(cpu_only, update(more_memory, big)) is S  # freed memory the pod does not ask for
    assert hint(p, update(big, relabel(big, app="x"))) is S


def test_node_resources_fit_node_hint() -> None:
    hint = noderesources.after_node_change
    p = R(cpu="2", memory="1Gi")
    assert hint(p, add(N(cpu="4"))) is Q
    assert hint(p, add(N(cpu="1"))) is S  # would not fit even empty
    assert hint(p, add(N(cpu="4", pods=0))) is S
    assert hint(p, update(N(cpu="1"), N(cpu="4"))) is Q
    assert hint(p, update(N(cpu="4"), N(cpu="4", labels={"x": "y"}))) is S  # nothing grew
    assert hint(p, update(N(cpu="4", pods=10), N(cpu="4", pods=20))) is Q
    assert hint(p, update(N(memory="8Gi"), N(memory="16Gi"))) is Q


# ---------------------------------------------------------------------------------------------- InterPodAffinity


@pytest.fixture
def ipa() -> interpodaffinity.InterPodAffinity:
    return interpodaffinity.InterPodAffinity(interpodaffinity.Args(), Handle(NodeTable()))


def test_inter_pod_affinity_pod_hint_for_required_affinity(ipa: interpodaffinity.InterPodAffinity) -> None:
    hint = ipa.after_pod_change
    p = P("cache", spec=required("podAffinity", HOST, app="db"))
    db = P("db", node_name="a", app="db")
    web = P("web", node_name="a", app="web")
    assert hint(p, add(db)) is Q
    assert hint(p, add(web)) is S
    assert hint(p, add(P("db2", app="db"))) is S  # not placed
    assert hint(p, add(P("db3", node_name="a", namespace="other", app="db"))) is S  # other namespace
    assert hint(p, update(web, relabel(web, app="db"))) is Q
    assert hint(p, update(db, relabel(db, app="db", v="2"))) is S  # matched before already
    assert hint(p, delete(db)) is S  # a deletion cannot create a peer


def test_inter_pod_affinity_pod_hint_for_anti_affinity(ipa: interpodaffinity.InterPodAffinity) -> None:
    hint = ipa.after_pod_change
    p = P("web", spec=required("podAntiAffinity", HOST, app="web"), app="web")
    peer = P("web-0", node_name="a", app="web")
    other = P("db", node_name="a", app="db")
    assert hint(p, add(peer)) is S
    assert hint(p, delete(peer)) is Q
    assert hint(p, delete(other)) is S
    assert hint(p, update(peer, relabel(peer, app="old"))) is Q
    assert hint(p, update(other, relabel(other, app="web"))) is S


def test_inter_pod_affinity_deleting_a_pod_whose_anti_affinity_rejected_the_pod_queues_it(
    ipa: interpodaffinity.InterPodAffinity,
) -> None:
    hint = ipa.after_pod_change
    p = P("web", app="web")  # no terms of its own: rejected by an existing pod's anti-affinity
    hater = P("loner", node_name="a", spec=required("podAntiAffinity", HOST, app="web"), app="loner")
    indifferent = P("loner2", node_name="a", spec=required("podAntiAffinity", HOST, app="db"), app="loner")
    assert hint(p, delete(hater)) is Q
    assert hint(p, delete(indifferent)) is S


def test_inter_pod_affinity_node_hint() -> None:
    hint = interpodaffinity.after_node_change
    affinity = P("cache", spec=required("podAffinity", ZONE, app="db"))
    anti = P("web", spec=required("podAntiAffinity", ZONE, app="web"))
    assert hint(affinity, add(N(labels={ZONE: "z1"}))) is Q
    assert hint(affinity, add(N())) is S
    assert hint(affinity, update(N(), N(labels={ZONE: "z1"}))) is Q
    assert hint(affinity, update(N(labels={ZONE: "z1"}), N(labels={ZONE: "z2"}))) is Q
    assert hint(affinity, update(N(labels={ZONE: "z1"}), N(labels={ZONE: "z1", "x": "y"}))) is S
    assert hint(affinity, update(N(labels={ZONE: "z1"}), N())) is S
    assert hint(anti, add(N())) is Q  # any new node may be free of the pods it avoids
    assert hint(anti, update(N(labels={ZONE: "z1"}), N())) is Q
    assert hint(anti, update(N(), N(labels={ZONE: "z1"}))) is S
    assert hint(P("plain"), add(N(labels={ZONE: "z1"}))) is S


# ---------------------------------------------------------------------------------------------- PodTopologySpread


SPREAD = {
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
    ]
}


@pytest.fixture
def pts() -> podtopologyspread.PodTopologySpread:
    return podtopologyspread.PodTopologySpread(podtopologyspread.Args(), Handle(NodeTable()))


def test_pod_topology_spread_pod_hint(pts: podtopologyspread.PodTopologySpread) -> None:
    hint = pts.after_pod_change
    p = P("web-9", spec=SPREAD, app="web")
    web = P("web-0", node_name="a", app="web")
    db = P("db", node_name="a", app="db")
    assert hint(p, add(web)) is Q
    assert hint(p, add(db)) is S
    assert hint(p, add(P("web-1", node_name="a", namespace="other", app="web"))) is S
    assert hint(p, add(P("web-2", app="web"))) is S  # not placed
    assert hint(p, delete(web)) is Q
    assert hint(p, delete(db)) is S
    assert hint(p, update(db, relabel(db, app="web"))) is Q
    assert hint(p, update(web, relabel(web, app="web", v="2"))) is S  # still selected
    assert hint(p, update(web, web)) is S


def test_pod_topology_spread_node_hint(pts: podtopologyspread.PodTopologySpread) -> None:
    hint = pts.after_node_change
    p = P("web-9", spec=SPREAD, app="web")
    assert hint(p, add(N(labels={ZONE: "z1"}))) is Q
    assert hint(p, add(N())) is S
    assert hint(p, delete(N(labels={ZONE: "z1"}))) is Q
    assert hint(p, delete(N())) is S
    assert hint(p, update(N(), N(labels={ZONE: "z1"}))) is Q
    assert hint(p, update(N(labels={ZONE: "z1"}), N(labels={ZONE: "z2"}))) is Q
    assert hint(p, update(N(labels={ZONE: "z1"}), N(labels={ZONE: "z1"}, taints=[NO_SCHEDULE]))) is Q
    assert hint(p, update(N(labels={ZONE: "z1"}), N(labels={ZONE: "z1", "x": "y"}))) is S
    assert hint(p, update(N(), N(labels={"x": "y"}))) is S
