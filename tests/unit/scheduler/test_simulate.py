"""crane_scheduler.simulate, the public offline scheduler: decisions with their reasons, reserve and undo, and the
incremental sync that must equal the whole one (a decider worker's replica will be fed deltas through it)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crane_scheduler.framework import Diagnosis
from crane_scheduler.simulate import (
    POD_GROUP_LABEL,
    POD_GROUP_RESOURCE,
    Preemption,
    Rejected,
    Simulator,
    parse_pod,
)
from tests.support.dra import DRIVER, claim, device, device_class, exactly, resource_slice
from tests.support.loadaware import NOW, loaded
from tests.support.scheduler import HOST, ZONE, container, labelled, node, pod

TAINT = {"key": "dedicated", "value": "db", "effect": "NoSchedule"}


def cluster(**kw: Any) -> Simulator:
    sim = Simulator(clock=lambda: NOW, **kw)
    sim.sync(
        "Node",
        [
            node("small", cpu="1"),
            node("tainted", cpu="8", taints=[TAINT]),
            node("big", cpu="8"),
        ],
    )
    return sim


def test_place_answers_the_node_or_why_not_with_each_node_s_reason() -> None:
    sim = cluster()
    placed = sim.place(pod("web", cpu="2"))
    assert placed.node == "big" and placed.message == "" and not placed.error
    assert placed.feasible == ["big"] and placed.scores == {}  # one feasible node: chosen unscored
    assert placed.rejected == {
        "small": Rejected("NodeResourcesFit", "Insufficient cpu"),
        "tainted": Rejected("TaintToleration", "node(s) had untolerated taint(s)"),
    }
    assert sim.requested("big") == {}  # placing changes nothing

    pending = sim.place(pod("huge", cpu="16"))
    assert pending.node is None
    fit_error = "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 Insufficient cpu."
    # more than any node's allocatable: unresolvable, so preemption has no node to try (kube's words)
    preemption = "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
    assert pending.message == f"{fit_error} {preemption}"
    assert pending.preemption == Preemption(preemption)
    assert sim.place(pod("huge", cpu="16"), preemption=False).message == fit_error
    assert pending.rejected["big"] == Rejected("NodeResourcesFit", "Insufficient cpu")
    assert pending.explain()["result"] == {"pending": pending.message}  # cranectl explain's words


def test_filter_gives_every_feasible_node_and_score_each_plugin_s_share() -> None:
    sim = cluster()
    sim.add(node("other", cpu="8"), kind="Node")
    sim.add(pod("busy", cpu="4", node_name="other"), kind="Pod")
    found = sim.filter(pod("web", cpu="2"))
    assert found.node is None and sorted(found.feasible) == ["big", "other"]
    scores = sim.score(found)
    assert set(scores) == {"big", "other"}
    fit = {name: s.plugins["NodeResourcesFit"] for name, s in scores.items()}
    assert fit["big"] > fit["other"]  # least allocated: the idle node
    assert scores["big"].total > scores["other"].total
    assert sim.place(pod("web2", cpu="2")).scores == scores  # the decision's own scores, as explain shows them


def test_pods_scheduled_one_after_another_each_see_the_earlier() -> None:
    sim = Simulator(clock=lambda: NOW)
    sim.sync("Node", [node("a", cpu="2"), node("b", cpu="2")])
    first, second = sim.schedule(pod("p1", cpu="1500m")), sim.schedule(pod("p2", cpu="1500m"))
    assert {first.node, second.node} == {"a", "b"}
    third = sim.schedule(pod("p3", cpu="1500m"))
    assert third.node is None and third.message == (
        "0/2 nodes are available: 2 Insufficient cpu. "
        "preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."
    )
    assert sim.requested("a") == sim.requested("b") == {"cpu": 1500, "memory": 100 * 2**20, "pods": 1}
    assert first.reservation is not None
    sim.undo(first.reservation)
    assert sim.schedule(pod("p4", cpu="1500m")).node == first.node


def full() -> Simulator:
    """Two full nodes: on a, one pod of priority 10; on b, one of priority 5 and a small one of priority 1."""
    sim = Simulator(clock=lambda: NOW, out_of_tree=False)
    sim.sync("Node", [node("a", cpu="2"), node("b", cpu="2")])
    sim.sync(
        "Pod",
        [
            pod("low-a", cpu="1500m", priority=10, node_name="a"),
            pod("low-b", cpu="1500m", priority=5, node_name="b"),
            pod("small-b", cpu="200m", priority=1, node_name="b"),
        ],
    )
    return sim


def test_a_pod_that_would_preempt_shows_the_node_and_the_victims_and_nothing_is_evicted() -> None:
    sim = full()
    urgent = pod("urgent", cpu="1500m", priority=100)
    placement = sim.schedule(urgent)
    # kube's choice: the node whose most important victim is the least important (b: 5, a: 10); on b the small
    # pod is reprieved (with it back the pod still fits), so low-b alone is evicted
    assert placement.node is None
    assert placement.preemption == Preemption("", "b", ("ns/low-b",))
    assert placement.preemption.possible
    assert placement.message == "0/2 nodes are available: 2 Insufficient cpu."  # as the scheduler reports it then
    assert sim.requested("b")["cpu"] == 1700 and sim.requested("a")["cpu"] == 1500  # nothing evicted
    assert not sim.table.nominated and placement.reservation is None  # nothing nominated, nothing reserved
    assert sim.place(urgent).preemption == placement.preemption  # again: the same answer

    assert live_post_filter(urgent) == (placement.message, "b")  # what the live scheduler says and nominates


def live_post_filter(raw: dict[str, Any]) -> tuple[str, str | None]:
    """The live scheduler's PostFilter (DefaultPreemption's ``post_filter``, which nominates) for ``raw`` on
    ``full()``: the pod's message and the node it was nominated to."""
    live = full()
    info = parse_pod(raw)
    profile = live.profiles["crane-scheduler"]
    state: dict[str, Any] = {}
    diagnosis = live.algorithm.schedule(profile, info, state)
    assert isinstance(diagnosis, Diagnosis)
    profile.run_post_filter(state, info, diagnosis)
    nominated = live.table.nominated.get(info.uid)
    return diagnosis.message, nominated[1] if nominated else None


def test_a_pod_that_cannot_preempt_gets_kubes_words_for_it() -> None:
    sim = full()
    # only small-b is of lower priority, and without it the pod still does not fit on b
    raw = pod("equal", cpu="1500m", priority=2)
    equal = sim.place(raw)
    assert equal.preemption == Preemption(
        "preemption: 0/2 nodes are available: 1 Insufficient cpu, 1 No preemption victims found for incoming pod."
    )
    assert equal.message == f"0/2 nodes are available: 2 Insufficient cpu. {equal.preemption.message}"
    assert live_post_filter(raw) == (equal.message, None)
    never = pod("never", cpu="1500m", priority=100, spec={"preemptionPolicy": "Never"})
    refused = sim.place(never)
    assert refused.preemption == Preemption("preemption: not eligible due to preemptionPolicy=Never.")
    assert not refused.preemption.possible
    assert live_post_filter(never) == (refused.message, None)


GANG_PROFILE = {
    "profiles": [
        {
            "schedulerName": "crane-scheduler",
            "plugins": {
                "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]},
                "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
            },
        }
    ]
}


def pod_group(name: str, min_member: int) -> dict[str, Any]:
    group, version, _ = POD_GROUP_RESOURCE
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"minMember": min_member},
    }


def gang(name: str, count: int, cpu: str) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        member = pod(f"{name}-{i}", cpu=cpu)
        member["metadata"]["labels"] = {POD_GROUP_LABEL: name}
        out.append(member)
    return out


def test_a_gang_is_kept_whole_or_given_back_at_once_as_the_gang_cycle_does() -> None:
    sim = Simulator(GANG_PROFILE, clock=lambda: NOW)
    sim.load([{**node("n1", cpu="4"), "kind": "Node"}, {**node("n2", cpu="4"), "kind": "Node"}])
    sim.load([pod_group("fits", 2), pod_group("short", 3), pod_group("first-fails", 3)])
    fits = sim.schedule_gang(gang("fits", 2, "2"))
    assert fits.kept and fits.gang == "ns/fits" and fits.quorum == 2 and fits.found == 2
    assert all(p.node and p.reservation and p.reservation.ok for p in fits.placements)
    taken = {n: sim.requested(n) for n in ("n1", "n2")}
    # 4 cores left: 2 of 3 members of 2 cores find a node, the third none: the group is given back at once, so the
    # next pod sees the room it held (the gang cycle undoes before it takes the next pod)
    short = sim.schedule_gang(gang("short", 3, "1500m"))
    assert not short.kept and short.found == 2 and not short.untried
    assert short.placements[2].message.endswith(
        "preemption: not attempted for a member of pod group ns/short (gang preemption is not supported)"
    )
    assert {n: sim.requested(n) for n in ("n1", "n2")} == taken
    # a member that finds no place puts the quorum out of reach: the others are not decided (no search, no tie-break)
    big = gang("first-fails", 3, "1")
    big[0]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "64"
    stopped = sim.schedule_gang(big)
    assert [p.pod.name for p in stopped.placements] == ["first-fails-0"]
    assert [p.name for p in stopped.untried] == ["first-fails-1", "first-fails-2"]
    assert sim.gang_of(big[1]) == "ns/first-fails" and sim.gang_of(pod("alone")) is None
    with pytest.raises(ValueError, match="not a member of ns/fits"):
        sim.schedule_gang([*gang("fits", 1, "1"), *gang("short", 1, "1")])


def test_a_pod_group_and_dra_objects_load_straight_in() -> None:
    """A snapshot's objects of mixed kinds: each goes where the scheduler keeps it (listers, plugin watches)."""
    sim = Simulator(GANG_PROFILE, clock=lambda: NOW)
    member = pod("train-0", cpu="1")
    member["metadata"]["labels"] = {POD_GROUP_LABEL: "train"}
    gpu_pod = pod("cuda", spec={"resourceClaims": [{"name": "g", "resourceClaimName": "gpu"}]})
    sim.load([{**node("n1"), "kind": "Node"}])
    missing = sim.place(member)
    assert missing.node is None and "PodGroup not found" in missing.message
    assert sim.place(gpu_pod).message == (
        '0/1 nodes are available: could not find ResourceClaim "ns/gpu". '
        "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
    )
    sim.load(
        [
            {**node("n1"), "kind": "Node"},
            {**node("n2"), "kind": "Node"},
            pod_group("train", 1),
            device_class("gpu", f'device.driver == "{DRIVER}"'),
            resource_slice("s2", [device("gpu-0")], node="n2"),
            claim("gpu", exactly("g", "gpu"), namespace="ns"),
        ]
    )
    assert sim.place(member).node in {"n1", "n2"}
    assert sim.place(gpu_pod).node == "n2"  # the only node with the device
    with pytest.raises(ValueError, match="kind 'Secret': not an object the scheduler reads"):
        sim.add({"kind": "Secret", "metadata": {"name": "s"}})


def test_take_out_is_a_what_if_without_the_pods() -> None:
    sim = Simulator(clock=lambda: NOW)
    sim.sync("Node", [node("a", cpu="2")])
    sim.sync("Pod", [pod("old", cpu="1500m", node_name="a")])
    uid = next(iter(sim.table.pods))
    assert sim.place(pod("new", cpu="1500m")).node is None
    with sim.without([uid]):
        assert sim.place(pod("new", cpu="1500m")).node == "a"
    assert sim.place(pod("new", cpu="1500m")).node is None


# -- properties -----------------------------------------------------------------------------------------------------

NODES = ["n0", "n1", "n2", "n3"]
APPS = ["x", "y"]


def probe_pods() -> list[dict[str, Any]]:
    """Pods whose decisions read what the syncs and the reservations move: requests, ports, labels of other pods
    (spread, anti-affinity) and load."""
    spread = {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "x"}},
            }
        ]
    }
    anti = {
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": HOST, "labelSelector": {"matchLabels": {"app": "y"}}}
                ]
            }
        }
    }
    port = [container("500m", ports=[{"containerPort": 80, "hostPort": 8080}])]
    return [
        pod("probe-plain", cpu="1"),
        labelled(pod("probe-spread", cpu="100m", spec=spread), app="x"),
        labelled(pod("probe-anti", cpu="100m", spec=anti), app="y"),
        pod("probe-port", containers=port),
    ]


def decisions(sim: Simulator) -> list[Any]:
    """Per probe pod: the feasible nodes, each rejected node's reason and each feasible node's scores."""
    out = []
    for raw in probe_pods():
        found = sim.filter(raw)
        scores = sim.score(found) if len(found.feasible) > 1 else {}
        out.append((sorted(found.feasible), found.rejected, found.message, scores))
    return out


def state(sim: Simulator) -> Any:
    """The table by node name (row numbers differ between histories), and Dynamic's own bindings."""
    t = sim.table
    per_node = {}
    dynamic: Any = sim.plugin("Dynamic")
    for name, row in t.rows.items():
        if t.live[row]:
            per_node[name] = (
                sim.allocatable(name),
                sim.requested(name),
                tuple(int(v) for v in t.nonzero_requested[row]),
                t.nodes[row],
                sorted(r.uid for r in t.pods_on(name)),
                [(b.node, b.cpu, b.memory) for b in dynamic.recent_on(name)],
            )
    ports = {port: sorted(map(str, hosts)) for port, hosts in t.ports.items() if hosts}
    return per_node, sorted(t.pods), ports, sorted(t.nominated)


node_events = st.tuples(
    st.just("Node"),
    st.sampled_from(NODES),
    st.sampled_from(["1", "2", "4"]),
    st.sampled_from(["a", "b"]),
    st.sampled_from([None, 0.2, 0.9]),
    st.booleans(),
)
pod_events = st.tuples(
    st.just("Pod"),
    st.sampled_from([f"p{i}" for i in range(6)]),
    st.sampled_from([None, *NODES]),
    st.sampled_from(["100m", "500m", "1"]),
    st.sampled_from(APPS),
    st.sampled_from(["Running", "Succeeded"]),
)
deletions = st.tuples(st.just("DELETE"), st.sampled_from([*NODES, *(f"p{i}" for i in range(6))]))


def node_object(name: str, cpu: str, zone: str, usage: float | None, tainted: bool) -> dict[str, Any]:
    raw = loaded(name, usage, cpu=cpu, memory="8Gi") if usage is not None else node(name, cpu=cpu)
    raw["metadata"]["labels"][ZONE] = zone
    raw["spec"]["taints"] = [TAINT] if tainted else []
    return raw


def pod_object(name: str, where: str | None, cpu: str, app: str, phase: str) -> dict[str, Any]:
    raw = labelled(pod(name, cpu=cpu, node_name=where or ""), app=app)
    raw["metadata"]["uid"] = f"uid-{name}"
    raw["status"] = {"phase": phase if where else "Pending"}
    if where is None and phase == "Running":  # a pending pod preemption nominated somewhere
        raw["status"]["nominatedNodeName"] = "n0"
    return raw


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(node_events, pod_events, deletions), min_size=1, max_size=25))
def test_an_incremental_sync_equals_a_whole_one(events: list[tuple[Any, ...]]) -> None:
    """The same cluster reached one watch event at a time, or listed whole into a fresh simulator: the same table,
    and the same decisions (feasible nodes, reasons, scores) for pods that read requests, ports, labels and load."""
    incremental = Simulator(clock=lambda: NOW)
    nodes: dict[str, dict[str, Any]] = {}
    pods: dict[str, dict[str, Any]] = {}
    for event in events:
        if event[0] == "Node":
            obj = node_object(*event[1:])
            incremental.apply("MODIFIED" if event[1] in nodes else "ADDED", obj, "Node")
            nodes[event[1]] = obj
        elif event[0] == "Pod":
            obj = pod_object(*event[1:])
            incremental.apply("MODIFIED" if event[1] in pods else "ADDED", obj, "Pod")
            pods[event[1]] = obj
        elif event[1] in nodes:
            incremental.delete(nodes.pop(event[1]), "Node")
        elif event[1] in pods:
            incremental.delete(pods.pop(event[1]), "Pod")
    whole = Simulator(clock=lambda: NOW)
    whole.sync("Node", list(nodes.values()))
    whole.sync("Pod", list(pods.values()))
    assert state(incremental) == state(whole)
    assert decisions(incremental) == decisions(whole)
    incremental.sync("Node", list(nodes.values()))  # a re-list that finds nothing new changes nothing
    incremental.sync("Pod", list(pods.values()))
    assert state(incremental) == state(whole)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.sampled_from(range(len(probe_pods()))), st.integers(0, 99)), min_size=1, max_size=8),
    st.randoms(use_true_random=False),
)
def test_reserve_then_undo_restores_the_table_and_the_plugins_exactly(picks: list[tuple[int, int]], order: Any) -> None:
    """Reservations taken back in any order leave the table, the pod index, Dynamic's recent bindings and every
    later decision as they were."""
    sim = Simulator(clock=lambda: NOW)
    sim.sync("Node", [node_object(n, "4", "ab"[i % 2], 0.2, False) for i, n in enumerate(NODES)])
    sim.sync(
        "Pod", [pod_object("bound-x", "n0", "500m", "x", "Running"), pod_object("bound-y", "n1", "1", "y", "Running")]
    )
    before, decided = state(sim), decisions(sim)
    reservations = []
    for k, (which, salt) in enumerate(picks):
        raw = probe_pods()[which]
        raw["metadata"]["name"] = f"{raw['metadata']['name']}-{k}-{salt}"
        raw["metadata"]["uid"] = f"r-{k}"
        placement = sim.schedule(raw)
        if placement.reservation is not None and placement.reservation.ok:
            reservations.append(placement.reservation)
    if reservations:
        assert state(sim) != before
    order.shuffle(reservations)
    for reservation in reservations:
        sim.undo(reservation)
    assert state(sim) == before
    assert decisions(sim) == decided


def test_a_pod_group_in_a_profile_without_a_gang_plugin_is_refused_as_the_scheduler_refuses_it() -> None:
    member = pod("train-0", cpu="1")
    member["metadata"]["labels"] = {POD_GROUP_LABEL: "train"}
    refused = cluster().place(member)
    assert refused.node is None and "profile crane-scheduler has no gang plugin" in refused.message
    assert cluster(pod_group_without_gang_plugin="place-alone").place(member).node == "big"


def test_reserve_refuses_a_pod_already_in_the_table_and_a_node_that_is_not() -> None:
    """A second reservation of one pod would move it silently (and its undo would drop the first)."""
    sim = cluster()
    web = pod("web", cpu="2")
    assert sim.schedule(web).node == "big"
    with pytest.raises(ValueError, match="pod ns/web: already in the table"):
        sim.schedule(web)
    assert sim.requested("big")["cpu"] == 2000
    with pytest.raises(KeyError, match="node 'ghost'"):
        sim.reserve(sim.place(pod("other", cpu="1")), node="ghost")


def test_a_gated_pod_is_not_placed_and_an_object_without_a_name_is_refused() -> None:
    sim = cluster()
    gated = pod("gated", cpu="1")
    gated["spec"]["schedulingGates"] = [{"name": "quota"}]
    placed = sim.place(gated)
    assert placed.node is None and placed.message.startswith("Scheduling is blocked due to non-empty scheduling gates")
    assert placed.rejectors == {"SchedulingGates"}
    with pytest.raises(ValueError, match=r"a Node without metadata\.name"):
        sim.add({"kind": "Node", "metadata": {}})
    with pytest.raises(ValueError, match=r"a Node without metadata\.name"):
        sim.sync("Node", [node("big", cpu="8"), {"kind": "Node", "metadata": {}}])


def test_pods_sharing_a_claim_all_go_where_it_is_allocated_and_undo_takes_each_back() -> None:
    """Offline nothing runs PreBind: the allocation Reserve chose is taken as written (with the pod in
    ``reservedFor``), so the next pod sharing the claim finds it allocated, not "in the process of being allocated"
    for ever; undo takes back the write with the reservation, last first."""
    sim = Simulator(clock=lambda: NOW)
    sim.load(
        [
            {**node("n1"), "kind": "Node"},
            {**node("n2"), "kind": "Node"},
            device_class("gpu", f'device.driver == "{DRIVER}"'),
            resource_slice("s2", [device("gpu-0")], node="n2"),
            claim("shared", exactly("g", "gpu"), namespace="ns"),
            claim("own", exactly("g", "gpu"), namespace="ns"),
        ]
    )

    def user(name: str, claim_name: str = "shared") -> dict[str, Any]:
        return pod(name, spec={"resourceClaims": [{"name": "g", "resourceClaimName": claim_name}]})

    placed = [sim.schedule(user(f"w{i}")) for i in range(3)]
    assert [p.node for p in placed] == ["n2", "n2", "n2"]
    other = sim.place(user("solo", "own"))  # the one device is the shared claim's
    assert other.node is None and "cannot allocate all claims" in other.message
    for p in reversed(placed):
        assert p.reservation is not None
        sim.undo(p.reservation)
    assert sim.place(user("solo", "own")).node == "n2"  # the device is free again


def test_a_snapshot_loads_straight_in_its_admission_kinds_passed_over() -> None:
    sim = Simulator(clock=lambda: NOW)
    sim.load(
        [
            {**node("n1"), "kind": "Node"},
            {"kind": "PriorityClass", "metadata": {"name": "high"}, "value": 1000},
            {"kind": "ResourceClaimTemplate", "metadata": {"name": "t", "namespace": "ns"}, "spec": {"spec": {}}},
        ]
    )
    assert sim.table.names == ["n1"]
    with pytest.raises(ValueError, match="kind 'PriorityClass': not an object the scheduler reads"):
        sim.add({"kind": "PriorityClass", "metadata": {"name": "high"}, "value": 1000})
