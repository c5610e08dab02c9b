"""``spec.drain``: an idle node (real usage and requests low, K rounds) is emptied only when every pod on it has a
place elsewhere by the scheduler's own Filter, and the scheduler's load score would not bring it back; otherwise
nothing is evicted from it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from crane_descheduler.drain import DrainState
from crane_descheduler.policy import Drain, Limits, default_policy
from crane_descheduler.rounds import RoundResult, run_round
from crane_descheduler.targets import SchedulerSnapshot
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.loadtaintpolicy import ScoringPolicy
from crane_shared.policy import default_policy as scheduler_default
from tests.support.descheduler import NOW, PACKING_PROFILE, node, pod, zone_affinity

PACK = DynamicArgs(replace(scheduler_default(), scoring=ScoringPolicy("pack", 0.6)))
SPREAD = DynamicArgs(scheduler_default())
POLICY = replace(
    default_policy(scheduler_default()),
    drain=Drain(rounds=2),
    limits=Limits(per_node_per_round=5, per_namespace_per_round=5, max_unavailable_per_workload=5, per_minute=30),
)


def rounds(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], *, args: DynamicArgs = PACK, policy=POLICY, times: int = 2
) -> RoundResult:
    state = DrainState()
    result = None
    for _ in range(times):
        result = run_round(nodes, pods, {}, policy, args, {}, NOW, drain=state)
        state = result.drain
    assert result is not None
    return result


def drained(result: RoundResult) -> dict[str, str | None]:
    return {e.pod.name: e.target for e in result.plan.evictions if e.kind == "drain"}


def fleet() -> list[dict[str, Any]]:
    return [node("idle", cpu=0.1, mem=0.05), node("busy", cpu=0.5, mem=0.5), node("warm", cpu=0.4, mem=0.4)]


def test_an_idle_node_is_emptied_after_k_rounds_onto_the_fullest_node_that_passes_the_filter() -> None:
    pods = [pod("a", "idle", owner="a"), pod("b", "idle", owner="b"), pod("agent", "idle", owner_kind="DaemonSet")]
    first = rounds(fleet(), pods, times=1)
    assert drained(first) == {} and first.drain.idle == {"idle": 1}
    second = rounds(fleet(), pods)
    # every pod has a place; pack sends them to the fullest node under its target; the DaemonSet pod stays
    assert drained(second) == {"a": "busy", "b": "busy"}
    assert second.drain.draining == frozenset({"idle"})
    e = second.plan.evictions[0]
    assert (e.node, e.metric, e.threshold) == ("idle", "cpu_usage_avg_5m", 0.35) and e.value == 0.1


def test_nothing_is_evicted_when_one_pod_has_no_place_elsewhere() -> None:
    nodes = [*fleet()[:1], node("busy", cpu=0.45, mem=0.3, cores=4)]
    # "big" fits nowhere else by requests (4 cores, 3 of them taken): so "small", which would fit, stays too
    pods = [pod("small", "idle", owner="s"), pod("big", "idle", cpu="2", owner="b"), pod("x", "busy", cpu="3")]
    result = rounds(nodes, pods)
    assert drained(result) == {}
    assert result.plan.skipped["drain-no-target"] == 2 and result.drain.draining == frozenset()
    # the places tried for "small" were given back: the next idle node's pods still find them
    freed = rounds([*nodes, node("idle2", cpu=0.05, mem=0.05)], [*pods, pod("c", "idle2", cpu="1", owner="c")])
    assert drained(freed) == {"c": "busy"}


def test_with_the_spread_score_the_replacement_would_come_back_so_nothing_is_drained() -> None:
    result = rounds(fleet(), [pod("a", "idle", owner="a")], args=SPREAD)
    assert drained(result) == {} and result.plan.skipped["drain-would-return"] == 1


def test_a_replacement_the_schedulers_whole_score_sends_back_keeps_the_node_out_of_the_drain() -> None:
    """Dynamic's pack ranks the fuller node first, but the profile's other scores (NodeResourcesFit's least
    allocated: 3 of busy's 4 cores are requested) outweigh it: the scheduler would bind the replacement on the
    emptied node again, so nothing is evicted (bench.autoscale saw 20 drain evictions from one node in 6 minutes,
    its usage unchanged, when only Dynamic's score was compared)."""
    pods = [pod("a", "idle", owner="a", cpu="200m", memory="64Mi"), pod("x", "busy", cpu="3", memory="64Mi")]
    back = rounds([node("idle", cpu=0.1, mem=0.05, cores=4), node("busy", cpu=0.3, mem=0.1, cores=4)], pods)
    assert drained(back) == {} and back.plan.skipped["drain-would-return"] == 1
    # nearer the packing target, Dynamic's score outweighs the requests: the replacement goes, the node empties
    away = rounds([node("idle", cpu=0.1, mem=0.05, cores=4), node("busy", cpu=0.5, mem=0.1, cores=4)], pods)
    assert drained(away) == {"a": "busy"}


def test_with_the_schedulers_own_packing_profile_the_same_drain_goes_ahead() -> None:
    """``--scheduler-config``: the drain asks the scheduler's own profile; with kube's MostAllocated beside
    Dynamic's pack (the sandbox's ``--autoscaler`` profile), the fuller node wins and the idle node empties."""
    pods = [pod("a", "idle", owner="a", cpu="200m", memory="64Mi"), pod("x", "busy", cpu="3", memory="64Mi")]
    nodes = [node("idle", cpu=0.1, mem=0.05, cores=4), node("busy", cpu=0.3, mem=0.1, cores=4)]
    state = DrainState()
    result = None
    snapshot = SchedulerSnapshot(PACKING_PROFILE)
    for _ in range(2):
        result = run_round(nodes, pods, {}, POLICY, PACK, {}, NOW, drain=state, snapshot=snapshot)
        state = result.drain
    assert result is not None and drained(result) == {"a": "busy"}


def test_a_pod_no_controller_recreates_keeps_its_node_out_of_the_drain() -> None:
    pods = [pod("a", "idle", owner="a"), pod("bare", "idle", owner_kind=None)]
    result = rounds(fleet(), pods)
    assert drained(result) == {} and result.plan.skipped["drain-blocked"] == 1


def test_a_node_whose_requests_are_high_is_not_idle_however_low_its_usage() -> None:
    pods = [pod("a", "idle", cpu="5", owner="a")]  # 5 of 8 cores requested: above requestsBelow 0.5
    result = rounds(fleet(), pods)
    assert drained(result) == {} and result.drain.idle == {}


def test_one_node_at_a_time_the_emptiest_first_and_budgets_pace_the_evictions() -> None:
    nodes = [*fleet(), node("idle2", cpu=0.1, mem=0.1)]
    pods = [pod("a", "idle", owner="a"), pod("b", "idle", owner="b"), pod("c", "idle2", cpu="2", owner="c")]
    paced = replace(POLICY, limits=replace(POLICY.limits, per_node_per_round=1))
    result = rounds(nodes, pods, policy=paced)
    assert list(drained(result)) == ["a"] and result.drain.draining == frozenset({"idle"})
    assert result.plan.skipped["drain-node-budget"] == 1


def test_daemonset_and_static_pods_of_an_excluded_namespace_stay_and_do_not_block_the_drain() -> None:
    """kube-proxy, a CNI agent, a static pod: every node runs some in kube-system (excluded from evictions); what a
    pod is decides before what holds it back, so they stay on the node being removed as any DaemonSet pod does."""
    daemon = pod("kube-proxy-x", "idle", namespace="kube-system", owner_kind="DaemonSet", owner="kube-proxy")
    mirror = {"kubernetes.io/config.mirror": "x", "kubernetes.io/config.source": "file"}
    static = pod("etcd-idle", "idle", namespace="kube-system", owner_kind="Node", owner="idle", annotations=mirror)
    result = rounds(fleet(), [pod("a", "idle", owner="a"), daemon, static])
    assert drained(result) == {"a": "busy"} and result.drain.draining == frozenset({"idle"})


def test_a_pod_not_running_yet_that_can_never_be_evicted_blocks_its_node_at_once() -> None:
    """Waiting for it to run would empty the node of every other pod first, then find it blocks the node for good;
    a DaemonSet pod not running yet stays, as a running one does."""
    for stuck in (
        pod("bare", "idle", owner_kind=None, phase="Pending"),
        pod("sys", "idle", owner="s", namespace="kube-system", phase="Pending"),
    ):
        result = rounds(fleet(), [pod("a", "idle", owner="a"), stuck])
        assert drained(result) == {} and result.plan.skipped["drain-blocked"] == 1, stuck["metadata"]["name"]
    starting = pod("agent", "idle", owner_kind="DaemonSet", phase="Pending")
    assert drained(rounds(fleet(), [pod("a", "idle", owner="a"), starting])) == {"a": "busy"}


def test_a_node_a_replacement_is_planned_onto_is_not_drained_in_the_same_round() -> None:
    """Two idle nodes, two drains a round: A's pod may only go to zone x, and the scheduler's packing profile
    sends it to B, so B is not emptied in that round (its new pod would have to move again)."""
    nodes = [
        node("A", cpu=0.1, mem=0.05, labels={"zone": "x"}),
        node("B", cpu=0.3, mem=0.3, labels={"zone": "x"}),
        node("C", cpu=0.5, mem=0.5),
    ]
    pods = [pod("a", "A", owner="a", affinity=zone_affinity("x")), pod("b", "B", cpu="1", owner="b")]
    policy = replace(POLICY, drain=Drain(rounds=2, max_nodes=2))
    state, snapshot, result = DrainState(), SchedulerSnapshot(PACKING_PROFILE), None
    for _ in range(2):
        result = run_round(nodes, pods, {}, policy, PACK, {}, NOW, drain=state, snapshot=snapshot)
        state = result.drain
    assert result is not None and drained(result) == {"a": "B"}
    assert result.plan.skipped["drain-is-target"] == 1 and result.drain.draining == frozenset({"A"})


def test_a_round_without_the_pods_usage_drains_nothing_and_keeps_the_drains_state() -> None:
    """Prometheus failed: the round evicts nothing (README), the drain included, and the next round goes on."""
    pods = [pod("a", "idle", owner="a")]
    first = run_round(fleet(), pods, {}, POLICY, PACK, {}, NOW, drain=DrainState())
    blind = run_round(fleet(), pods, {}, POLICY, PACK, {}, NOW, drain=first.drain, usage_known=False)
    assert drained(blind) == {} and blind.drain == first.drain
    assert drained(run_round(fleet(), pods, {}, POLICY, PACK, {}, NOW, drain=blind.drain)) == {"a": "busy"}


def test_a_disruption_budget_allowing_one_lets_one_of_its_pods_go_per_round() -> None:
    """Both replicas are planned only if the budget allowed two: the second eviction would answer 429 and spend a
    slot of the round's budgets for nothing; it goes in a later round."""
    pods = [pod("web-1", "idle", owner="w"), pod("web-2", "idle", owner="w")]
    for p in pods:
        p["metadata"]["labels"] = {"app": "web"}
    pdb = {
        "metadata": {"namespace": "default", "name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": 1},
    }
    state = DrainState()
    for _ in range(2):
        result = run_round(fleet(), pods, {}, POLICY, PACK, {}, NOW, (), [pdb], drain=state)
        state = result.drain
    assert list(drained(result)) == ["web-1"] and result.plan.skipped["drain-pdb"] == 1


def test_a_drain_that_evicts_nothing_for_k_rounds_lets_another_idle_node_go_first() -> None:
    """A pod that never starts (a bad image) keeps its node under way for ever: after ``consecutiveRounds`` rounds
    without an eviction, a fresh idle node takes the one drain slot; the stalled one waits behind it."""
    nodes = [*fleet(), node("idle2", cpu=0.1, mem=0.1, cores=16)]
    pods = [pod("stuck", "idle", owner="s", phase="Pending", ready=False), pod("c", "idle2", cpu="2", owner="c")]
    snapshot, state = SchedulerSnapshot(PACKING_PROFILE), DrainState()
    seen: list[tuple[frozenset[str], dict[str, str | None]]] = []
    for _ in range(5):
        result = run_round(nodes, pods, {}, POLICY, PACK, {}, NOW, drain=state, snapshot=snapshot)
        state = result.drain
        seen.append((state.draining, drained(result)))
    assert seen[1] == (frozenset({"idle"}), {})  # under way: its pod waits to run
    assert (frozenset({"idle2"}), {"c": "warm"}) in seen[2:]  # the slot went on


def test_a_node_a_waiting_pod_was_given_a_place_on_is_not_drained_in_that_round() -> None:
    """A's pod is placed on B but not evicted yet (it is still starting); B, idle too, is not emptied in the same
    round: A's pod would lose its place there, and A be left half drained."""
    nodes = [
        node("A", cpu=0.1, mem=0.05, labels={"zone": "x"}),
        node("B", cpu=0.3, mem=0.3, labels={"zone": "x"}),
        node("C", cpu=0.5, mem=0.5),
    ]
    starting = pod("a", "A", owner="a", affinity=zone_affinity("x"), phase="Pending", ready=False)
    pods = [starting, pod("b", "B", cpu="1", owner="b")]
    policy = replace(POLICY, drain=Drain(rounds=2, max_nodes=2))
    state, snapshot, result = DrainState(), SchedulerSnapshot(PACKING_PROFILE), None
    for _ in range(2):
        result = run_round(nodes, pods, {}, policy, PACK, {}, NOW, drain=state, snapshot=snapshot)
        state = result.drain
    assert result is not None and drained(result) == {}
    assert result.plan.skipped["drain-is-target"] == 1 and result.drain.draining == frozenset({"A"})


def test_a_hot_nodes_pod_the_scheduler_would_send_to_the_node_being_drained_stays() -> None:
    """The hot node's pod passes the Filter on T and on D (being drained); the scheduler's whole score prefers D
    (its preferred anti-affinity to its sibling on T): evicted, it would land on the node being emptied, and be
    evicted again by the drain. It stays (``would-go-excluded``); D's own pod still goes to T."""
    from crane_descheduler.policy import AnomalyCondition
    from crane_shared.batch import PodUsage

    host = "kubernetes.io/hostname"
    nodes = [node(n, cpu=c, mem=0.2, cores=4, labels={host: n}) for n, c in (("H", 0.9), ("D", 0.1), ("T", 0.45))]
    term = {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": host}}

    def web(name: str, on: str) -> dict[str, Any]:
        anti = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}
        raw = pod(name, on, owner="web", cpu="200m", memory="64Mi", affinity=anti)
        raw["metadata"]["labels"] = {"app": "web"}
        return raw

    pods = [
        web("p", "H"),
        web("w2", "T"),
        pod("x", "T", cpu="1", memory="64Mi", owner="x"),
        pod("d", "D", cpu="200m", memory="64Mi", owner="d"),
    ]
    policy = replace(POLICY, drain=Drain(rounds=1), anomaly=AnomalyCondition(hot_rounds=1, normal_rounds=1))
    usage = {"default/p": PodUsage(1.0, 1 << 28)}
    under_way = DrainState({"D": 1}, frozenset({"D"}))  # D's drain began a round ago
    result = run_round(
        nodes, pods, usage, policy, PACK, {}, NOW, drain=under_way, snapshot=SchedulerSnapshot(PACKING_PROFILE)
    )
    assert [(e.kind, e.pod.name, e.target) for e in result.plan.evictions] == [("drain", "d", "T")]
    assert result.plan.skipped["would-go-excluded"] == 1


def test_a_replacement_not_bound_yet_keeps_its_room_on_its_target_in_the_next_round() -> None:
    """Last round ``a`` went from A towards T; it is still terminating, and its replacement (a StatefulSet's is
    only created once it is gone) is nowhere yet: T's room for it is still planned for, so this round does not
    send both of A's and C's next pods into what is left there."""
    from crane_descheduler.plan import Evicted
    from crane_descheduler.targets import replacement
    from crane_shared.batch import PodUsage

    policy = replace(
        POLICY,
        drain=Drain(rounds=1, max_nodes=2),
        limits=replace(POLICY.limits, per_node_per_round=1),
    )
    nodes = [node("A", cpu=0.1, mem=0.05), node("C", cpu=0.1, mem=0.05), node("T", cpu=0.3, mem=0.3, cores=8)]
    a = pod("a", "A", cpu="1", owner="a")
    gone = {**a, "metadata": {**a["metadata"], "deletionTimestamp": "2026-01-01T12:00:30Z"}}
    pods = [gone, pod("b", "A", cpu="1", owner="b"), pod("c", "C", cpu="1", owner="c"), pod("x", "T", cpu="6")]
    owner = a["metadata"]["ownerReferences"][0]["uid"]
    earlier = Evicted("A", NOW.timestamp() - 30, PodUsage(0.1, 1 << 20), "T", replacement(a), owner)
    state = DrainState({"A": 1, "C": 1}, frozenset({"A"}))
    planned = run_round(
        nodes, pods, {}, policy, PACK, {}, NOW, (earlier,), drain=state, snapshot=SchedulerSnapshot(PACKING_PROFILE)
    )
    into_t = [e.pod.name for e in planned.plan.evictions if e.target == "T"]
    assert len(into_t) <= 1, into_t  # 2 of T's 8 cores were free, one of them the replacement's


def test_a_replacement_is_held_only_until_a_new_pod_of_its_owner_is_seen_bound() -> None:
    from crane_descheduler.plan import Evicted
    from crane_descheduler.pods import pod_view
    from crane_descheduler.rounds import in_flight
    from crane_descheduler.targets import replacement
    from crane_shared.batch import PodUsage

    a = pod("a", "A", cpu="1", owner="a")
    owner = a["metadata"]["ownerReferences"][0]["uid"]
    earlier = Evicted("A", NOW.timestamp() - 30, PodUsage(0.1, 1 << 20), "T", replacement(a), owner)
    assert in_flight([earlier], []) == [(earlier.replacement, "T")]
    new = pod("a-2", "T", cpu="1", owner="a")
    new["metadata"]["creationTimestamp"] = NOW.isoformat()
    assert in_flight([earlier], [(pod_view(new), new)]) == []
    old = pod("a-0", "T", cpu="1", owner="a")
    old["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z"  # a sibling from before: not the replacement
    assert in_flight([earlier], [(pod_view(old), old)]) == [(earlier.replacement, "T")]
