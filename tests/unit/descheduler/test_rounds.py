"""A round from node and pod JSON to the evictions it plans: classes, debounce, victims, budgets, targets."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from crane_descheduler.classify import Detector
from crane_descheduler.plan import Evicted, workload_allowance
from crane_descheduler.pods import eviction_blocker
from crane_descheduler.policy import AnomalyCondition, DeschedulerPolicy, Evictable, Limits, default_policy
from crane_descheduler.rounds import RoundResult, run_round
from crane_shared.annotations import annotation_key
from crane_shared.batch import PodUsage
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.policy import default_policy as scheduler_default
from tests.support.descheduler import NOW, node, pod

ARGS = DynamicArgs(scheduler_default())
POLICY = replace(default_policy(scheduler_default()), anomaly=AnomalyCondition(hot_rounds=2, normal_rounds=2))
GIB = 1 << 30


def rounds(nodes, pods, usage, *, policy: DeschedulerPolicy = POLICY, times: int = 2, recent=()) -> RoundResult:
    detectors: dict[str, Detector] = {}
    result = None
    for _ in range(times):
        result = run_round(nodes, pods, usage, policy, ARGS, detectors, NOW, recent)
        detectors = result.detectors
    assert result is not None
    return result


def evicted(result: RoundResult) -> list[str]:
    return [e.pod.name for e in result.plan.evictions]


def test_a_node_is_hot_only_after_consecutive_hot_rounds_and_cools_after_consecutive_normal_ones():
    nodes = [node("hot", cpu=0.9), node("cool", cpu=0.2)]
    usage = {"default/a": PodUsage(2.0, GIB)}
    pods = [pod("a", "hot")]
    first = run_round(nodes, pods, usage, POLICY, ARGS, {}, NOW)
    assert first.classes == {"hot": "normal", "cool": "idle"} and evicted(first) == []
    second = run_round(nodes, pods, usage, POLICY, ARGS, first.detectors, NOW)
    assert second.classes["hot"] == "hot" and evicted(second) == ["a"]
    e = second.plan.evictions[0]
    assert (e.node, e.target, e.metric, e.value, e.threshold) == ("hot", "cool", "cpu_usage_avg_5m", 0.9, 0.65)
    # one normal round: still confirmed hot, but not hot now, so nothing is evicted; the second cools it
    calm = [node("hot", cpu=0.5), node("cool", cpu=0.2)]
    third = run_round(calm, pods, usage, POLICY, ARGS, second.detectors, NOW)
    assert third.classes["hot"] == "hot" and evicted(third) == []
    fourth = run_round(calm, pods, usage, POLICY, ARGS, third.detectors, NOW)
    assert fourth.classes["hot"] == "normal"


@pytest.mark.parametrize(
    ("hot_node", "problem"),
    [
        (node("hot", cpu=0.9, at=NOW - timedelta(minutes=30)), "cpu_usage_avg_5m is stale"),
        (node("hot", cpu=0.9, annotations={annotation_key("mem_usage_avg_5m"): "garbage"}), "is malformed"),
        (node("hot", cpu=0.9, mem=None), "mem_usage_avg_5m is missing"),
    ],
)
def test_stale_or_malformed_data_is_never_acted_on_and_restarts_the_debounce(hot_node, problem):
    result = rounds([hot_node, node("cool", cpu=0.2)], [pod("a", "hot")], {"default/a": PodUsage(2, GIB)}, times=3)
    assert result.classes["hot"] == "unknown" and problem in result.unknown["hot"]
    assert evicted(result) == [] and result.detectors["hot"] == Detector()


def test_victims_lower_priority_first_then_qos_then_the_pod_that_best_covers_the_excess():
    nodes = [node("hot", cpu=0.9), node("cool", cpu=0.1)]
    # excess = (0.9 - 0.65) * 8 cores = 2 cores
    pods = [
        pod("important", "hot", priority=100, qos="BestEffort", owner="o1"),
        pod("guaranteed", "hot", qos="Guaranteed", owner="o2"),
        pod("small", "hot", owner="o3"),
        pod("covers", "hot", owner="o4"),
        pod("huge", "hot", owner="o5"),
    ]
    usage = {
        "default/important": PodUsage(5, GIB),
        "default/guaranteed": PodUsage(3, GIB),
        "default/small": PodUsage(0.5, GIB),
        "default/covers": PodUsage(2.5, GIB),
        "default/huge": PodUsage(4, GIB),
    }
    limits = replace(POLICY.limits, per_node_per_round=5, per_namespace_per_round=5, per_minute=10)
    result = rounds(nodes, pods, usage, policy=replace(POLICY, limits=limits))
    # the smallest pod covering the 2-core excess, then the node is under its threshold: stop
    assert evicted(result) == ["covers"]
    usage["default/covers"] = PodUsage(1.0, GIB)
    result = rounds(nodes, pods, usage, policy=replace(POLICY, limits=limits))
    # none of the lowest class covers it: the biggest of them (huge) does, at once
    assert evicted(result) == ["huge"]
    usage["default/huge"] = PodUsage(0.6, GIB)
    result = rounds(nodes, pods, usage, policy=replace(POLICY, limits=limits))
    # none covers: biggest first among the Burstable priority-0 pods until projected usage is under 0.65
    assert evicted(result) == ["covers", "huge", "small"]


def test_only_pods_a_controller_recreates_are_eligible():
    ev = Evictable()
    old = {
        "recreated": pod("a", "n"),
        "job": pod("b", "n", owner_kind="Job"),
        "sts": pod("c", "n", owner_kind="StatefulSet"),
    }
    for p in old.values():
        assert eviction_blocker(p, NOW, ev) is None
    cases = {
        "daemonset": pod("d", "n", owner_kind="DaemonSet"),
        "not-recreated": pod("e", "n", owner_kind=None),
        "static": pod("f", "n", annotations={"kubernetes.io/config.mirror": "x"}),
        "system-critical": pod("g", "n", priority_class="system-node-critical"),
        "young": pod("h", "n", created=NOW.isoformat()),
        "local-storage": pod("i", "n", volumes=[{"name": "s", "emptyDir": {}}]),
        "prefer-no-eviction": pod("j", "n", annotations={"descheduler.alpha.kubernetes.io/prefer-no-eviction": ""}),
        "not-running": pod("k", "n", phase="Pending"),
        "namespace-excluded": pod("l", "n", namespace="kube-system"),
    }
    assert {reason: eviction_blocker(p, NOW, ev) for reason, p in cases.items()} == {r: r for r in cases}
    clone = pod("m", "n", owner_kind="CloneSet")
    assert eviction_blocker(clone, NOW, ev) == "not-recreated"
    assert eviction_blocker(clone, NOW, replace(ev, owner_kinds=ev.owner_kinds | {"CloneSet"})) is None
    assert eviction_blocker(cases["local-storage"], NOW, replace(ev, evict_local_storage=True)) is None


def test_ineligible_pods_are_spared_and_counted():
    nodes = [node("hot", cpu=0.9), node("cool", cpu=0.1)]
    pods = [pod("ds", "hot", owner_kind="DaemonSet"), pod("bare", "hot", owner_kind=None)]
    usage = {"default/ds": PodUsage(3, GIB), "default/bare": PodUsage(3, GIB)}
    result = rounds(nodes, pods, usage)
    assert evicted(result) == [] and result.plan.skipped == {"daemonset": 1, "not-recreated": 1}


def test_nothing_is_evicted_when_no_other_node_could_take_the_pod():
    pods = [pod("a", "hot")]
    usage = {"default/a": PodUsage(3, GIB)}
    every_node_hot = rounds([node("hot", cpu=0.9), node("also", cpu=0.9)], pods, usage)
    assert evicted(every_node_hot) == [] and every_node_hot.plan.skipped == {"no-target": 1}
    # the other node is cool but would go over the threshold with the pod's estimate (0.6 * 4 cores / 8 = 0.3)
    big = [pod("a", "hot", cpu="4")]
    no_headroom = rounds([node("hot", cpu=0.9), node("warm", cpu=0.5)], big, usage)
    assert no_headroom.plan.skipped == {"no-target": 1}
    # a cool node whose data is stale does not count as a target (fail-closed)
    stale = rounds([node("hot", cpu=0.9), node("cool", cpu=0.1, at=NOW - timedelta(hours=1))], pods, usage)
    assert stale.plan.skipped == {"no-target": 1}
    # cordoned, tainted or full nodes neither
    full = node("cool", cpu=0.1, cores=1)
    tainted = node("cool", cpu=0.1, taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}])
    for other in (node("cool", cpu=0.1, unschedulable=True), tainted, full):
        assert (
            rounds([node("hot", cpu=0.9), other], [*pods, pod("x", "cool", cpu="900m", owner="x")], usage).plan.skipped[
                "no-target"
            ]
            == 1
        )
    assert evicted(rounds([node("hot", cpu=0.9), node("cool", cpu=0.1)], pods, usage)) == ["a"]


def test_a_pod_is_not_evicted_when_the_scheduler_would_put_it_back():
    # the pool calls 0.5 hot, but the scheduler's Dynamic filter admits up to 0.65: the replacement could return
    pool = replace(POLICY.pools[0], high={"cpu_usage_avg_5m": 0.5}, low={"cpu_usage_avg_5m": 0.2})
    policy = replace(POLICY, pools=(pool,))
    result = rounds(
        [node("hot", cpu=0.55), node("cool", cpu=0.1)],
        [pod("a", "hot", cpu="100m")],
        {"default/a": PodUsage(2, GIB)},
        policy=policy,
    )
    assert evicted(result) == [] and result.plan.skipped == {"would-return": 1}


def test_budgets_per_node_namespace_workload_and_rate():
    nodes = [node("h1", cpu=0.95), node("h2", cpu=0.95), node("cool1", cpu=0.05), node("cool2", cpu=0.05, cores=64)]
    pods = [pod(f"p{i}", f"h{1 + i % 2}", owner=f"w{i}", cpu="100m") for i in range(6)]
    usage = {f"default/p{i}": PodUsage(0.5, GIB) for i in range(6)}
    wide = Limits(per_node_per_round=10, per_namespace_per_round=10, max_unavailable_per_workload=1, per_minute=10)
    assert len(evicted(rounds(nodes, pods, usage, policy=replace(POLICY, limits=wide)))) == 6
    per_node = rounds(nodes, pods, usage, policy=replace(POLICY, limits=replace(wide, per_node_per_round=1)))
    assert sorted(e.node for e in per_node.plan.evictions) == ["h1", "h2"]
    per_ns = rounds(nodes, pods, usage, policy=replace(POLICY, limits=replace(wide, per_namespace_per_round=3)))
    assert len(per_ns.plan.evictions) == 3 and per_ns.plan.skipped["namespace-budget"] == 3
    elsewhere = Evicted("other", NOW.timestamp() - 10, PodUsage(0, 0))
    rate = rounds(nodes, pods, usage, policy=replace(POLICY, limits=replace(wide, per_minute=4)), recent=[elsewhere])
    assert len(rate.plan.evictions) == 3
    # one workload of 6 pods, one of them not Ready: maxUnavailable 2 leaves room for one eviction, 50% for two
    same = [pod(f"p{i}", f"h{1 + i % 2}", owner="w", cpu="100m", ready=i != 5) for i in range(6)]
    two = rounds(nodes, same, usage, policy=replace(POLICY, limits=replace(wide, max_unavailable_per_workload=2)))
    assert len(two.plan.evictions) == 1 and two.plan.skipped["workload-budget"] >= 1
    half = rounds(nodes, same, usage, policy=replace(POLICY, limits=replace(wide, max_unavailable_per_workload="50%")))
    assert len(half.plan.evictions) == 2
    assert workload_allowance("25%", 7) == 1 and workload_allowance(3, 7) == 3


def test_a_pod_that_would_cool_the_node_but_waits_for_its_budget_is_not_replaced_by_one_that_would_not():
    """bench.rebalance run A: two hot nodes, each cooled by one pod of the same workload. With one of them
    evicted, the workload's budget holds the other back; evicting a small pod of that node instead spends an
    eviction that cools nothing. It waits for the next round."""
    nodes = [node("h1", cpu=0.9), node("h2", cpu=0.9), node("cool1", cpu=0.1), node("cool2", cpu=0.1)]
    pods = [pod(f"big{i}", f"h{i}", owner="api", cpu="4") for i in (1, 2)]
    pods += [pod(f"small{i}", f"h{i}", owner=f"s{i}", cpu="1") for i in (1, 2)]
    usage = {f"default/big{i}": PodUsage(3.5, GIB) for i in (1, 2)}
    usage |= {f"default/small{i}": PodUsage(0.8, GIB) for i in (1, 2)}
    limits = Limits(per_node_per_round=1, per_namespace_per_round=10, max_unavailable_per_workload=1, per_minute=10)
    result = rounds(nodes, pods, usage, policy=replace(POLICY, limits=limits))
    assert evicted(result) == ["big1"]
    assert result.plan.skipped["workload-budget"] == 1 and result.plan.skipped["waits-for-budget"] == 1


def test_node_pools_apply_their_own_thresholds_and_unselected_nodes_are_left_alone():
    gpu = replace(POLICY.pools[0], name="gpu", selector={"pool": "gpu"}, high={"cpu_usage_avg_5m": 0.95})
    policy = replace(POLICY, pools=(gpu,))
    nodes = [node("g", cpu=0.9, labels={"pool": "gpu"}), node("other", cpu=0.9), node("cool", cpu=0.1)]
    result = rounds(
        nodes,
        [pod("a", "g"), pod("b", "other", owner="o")],
        {"default/a": PodUsage(3, GIB), "default/b": PodUsage(3, GIB)},
        policy=policy,
    )
    assert result.classes == {"g": "normal"} and evicted(result) == []


def test_a_pod_whose_budget_allows_no_disruption_now_is_passed_over_for_the_next():
    nodes = [node("hot", cpu=0.9), node("cool", cpu=0.1)]
    guarded, free = pod("guarded", "hot", owner="g"), pod("free", "hot", owner="f")
    guarded["metadata"]["labels"] = {"app": "db"}
    usage = {"default/guarded": PodUsage(2.5, GIB), "default/free": PodUsage(3, GIB)}
    pdb: dict[str, Any] = {
        "metadata": {"namespace": "default", "name": "db"},
        "spec": {"selector": {"matchLabels": {"app": "db"}}},
        "status": {"disruptionsAllowed": 0},
    }
    detectors: dict[str, Detector] = {}
    for _ in range(2):
        result = run_round(nodes, [guarded, free], usage, POLICY, ARGS, detectors, NOW, (), [pdb])
        detectors = result.detectors
    assert evicted(result) == ["free"] and result.plan.skipped == {"pdb": 1}
    pdb["status"]["disruptionsAllowed"] = 1
    assert evicted(run_round(nodes, [guarded, free], usage, POLICY, ARGS, detectors, NOW, (), [pdb])) == ["guarded"]


def test_a_budget_allowing_one_disruption_lets_one_of_its_pods_go_in_a_round():
    """Two pods of one PodDisruptionBudget allowing one, both needed to cool the node: the second would answer
    429 and spend the round's budgets for nothing; a pod of no budget goes in its place."""
    nodes = [node("hot", cpu=0.95), node("cool", cpu=0.1)]
    first, second, other = pod("db-1", "hot", owner="d1"), pod("db-2", "hot", owner="d2"), pod("web", "hot", owner="w")
    for p in (first, second):
        p["metadata"]["labels"] = {"app": "db"}
    usage = {"default/db-1": PodUsage(0.5, GIB), "default/db-2": PodUsage(0.5, GIB), "default/web": PodUsage(0.4, GIB)}
    pdb: dict[str, Any] = {
        "metadata": {"namespace": "default", "name": "db"},
        "spec": {"selector": {"matchLabels": {"app": "db"}}},
        "status": {"disruptionsAllowed": 1},
    }
    limits = Limits(per_node_per_round=3, per_namespace_per_round=10, max_unavailable_per_workload=1, per_minute=10)
    policy = replace(POLICY, limits=limits)
    detectors: dict[str, Detector] = {}
    for _ in range(2):
        result = run_round(nodes, [first, second, other], usage, policy, ARGS, detectors, NOW, (), [pdb])
        detectors = result.detectors
    assert sorted(evicted(result)) == ["db-1", "web"] and result.plan.skipped["pdb"] == 1


def test_a_pod_two_budgets_select_is_passed_over_as_the_eviction_api_would_refuse_it():
    nodes = [node("hot", cpu=0.9), node("cool", cpu=0.1)]
    both, free = pod("both", "hot", owner="b"), pod("free", "hot", owner="f")
    both["metadata"]["labels"] = {"app": "db", "tier": "data"}
    usage = {"default/both": PodUsage(3, GIB), "default/free": PodUsage(2.5, GIB)}
    pdbs: list[dict[str, Any]] = [
        {
            "metadata": {"namespace": "default", "name": name},
            "spec": {"selector": {"matchLabels": labels}},
            "status": {"disruptionsAllowed": 1},
        }
        for name, labels in (("db", {"app": "db"}), ("data", {"tier": "data"}))
    ]
    detectors: dict[str, Detector] = {}
    for _ in range(2):
        result = run_round(nodes, [both, free], usage, POLICY, ARGS, detectors, NOW, (), pdbs)
        detectors = result.detectors
    assert evicted(result) == ["free"] and result.plan.skipped == {"pdb-multiple": 1}


def test_a_relieved_node_is_not_relieved_again_while_its_average_still_carries_the_evicted_pod():
    nodes = [node("hot", cpu=0.9), node("cool", cpu=0.1)]
    pods = [pod("next", "hot")]
    usage = {"default/next": PodUsage(3, GIB)}
    assert evicted(rounds(nodes, pods, usage)) == ["next"]
    # 60 s before the annotation's timestamp, a 3-core pod left: the 5-minute average still carries 80 % of it,
    # 3 * 0.8 / 8 cores = 0.3, so the node is really at 0.6, under its threshold
    gone = Evicted("hot", NOW.timestamp() - 60, PodUsage(3, GIB))
    assert evicted(rounds(nodes, pods, usage, recent=[gone])) == []
    # a 2-core one: 0.2 of the 0.9 is gone, 0.7 is still over 0.65, so the next pod goes
    smaller = Evicted("hot", NOW.timestamp() - 60, PodUsage(2, GIB))
    assert evicted(rounds(nodes, pods, usage, recent=[smaller])) == ["next"]
    # one that left a whole window ago is fully out of the average already
    long_ago = Evicted("hot", NOW.timestamp() - 600, PodUsage(3, GIB))
    assert evicted(rounds(nodes, pods, usage, recent=[long_ago])) == ["next"]


def test_pods_are_read_again_only_when_their_resource_version_changes():
    nodes = [node("hot", cpu=0.9), node("cool", cpu=0.1)]
    a, b = pod("a", "hot"), pod("b", "hot", owner="o")
    for p, version in ((a, "1"), (b, "1")):
        p["metadata"]["resourceVersion"] = version
    cache: dict[str, Any] = {}
    usage = {"default/a": PodUsage(3, GIB), "default/b": PodUsage(3, GIB)}
    run_round(nodes, [a, b], usage, POLICY, ARGS, {}, NOW, (), (), cache)
    assert set(cache) == {"uid-a", "uid-b"}
    a["metadata"]["annotations"]["descheduler.alpha.kubernetes.io/prefer-no-eviction"] = ""
    a["spec"]["priority"] = 7  # a new version: read again
    a["metadata"]["resourceVersion"] = "2"
    run_round(nodes, [a], usage, POLICY, ARGS, {}, NOW, (), (), cache)
    assert set(cache) == {"uid-a"} and cache["uid-a"][1].priority == 7


def test_the_workload_budget_counts_a_deployment_across_its_replicasets():
    """During a rollout a Deployment's pods belong to two ReplicaSets: maxUnavailable 1 is the Deployment's."""
    nodes = [node("h1", cpu=0.9), node("h2", cpu=0.9), node("cool1", cpu=0.1), node("cool2", cpu=0.1)]
    pods = [pod("old", "h1", owner="web-old", cpu="100m"), pod("new", "h2", owner="web-new", cpu="100m")]
    usage = {"default/old": PodUsage(3, GIB), "default/new": PodUsage(3, GIB)}

    def replicaset(name: str, deployment: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
        if deployment:
            ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment, "uid": "uid-web"}
            meta["ownerReferences"] = [ref | {"controller": True}]
        return {"metadata": meta}

    limits = Limits(per_node_per_round=1, per_namespace_per_round=10, max_unavailable_per_workload=1, per_minute=10)
    policy = replace(POLICY, limits=limits)

    def plan_with(replicasets: list[dict[str, Any]]) -> RoundResult:
        detectors: dict[str, Detector] = {}
        for _ in range(2):
            result = run_round(nodes, pods, usage, policy, ARGS, detectors, NOW, (), (), None, replicasets)
            detectors = result.detectors
        return result

    one_deployment = plan_with([replicaset("web-old", "web"), replicaset("web-new", "web")])
    assert len(one_deployment.plan.evictions) == 1 and one_deployment.plan.skipped["workload-budget"] == 1
    # bare ReplicaSets (no Deployment): two workloads, one eviction each
    assert len(plan_with([replicaset("web-old", None), replicaset("web-new", None)]).plan.evictions) == 2
