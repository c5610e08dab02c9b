"""A pod is evicted only where crane-scheduler's own Filter plugins admit its replacement on another node: node
affinity, inter-pod anti-affinity, topology spread, volumes and the pods planned earlier in the round included."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from crane_descheduler.classify import Detector
from crane_descheduler.pods import pod_view
from crane_descheduler.policy import AnomalyCondition, Limits, default_policy
from crane_descheduler.rounds import RoundResult, run_round
from crane_descheduler.targets import SchedulerSnapshot, SchedulerTargets
from crane_shared.batch import PodUsage
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.loadtaintpolicy import ScoringPolicy
from crane_shared.policy import default_policy as scheduler_default
from tests.support.descheduler import NOW, node, pod, zone_affinity

ARGS = DynamicArgs(scheduler_default())
POLICY = replace(default_policy(scheduler_default()), anomaly=AnomalyCondition(hot_rounds=1, normal_rounds=1))
GIB = 1 << 30
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def zoned(name: str, zone: str, cpu: float, **kwargs: Any) -> dict[str, Any]:
    return node(name, cpu=cpu, labels={HOST: name, ZONE: zone}, **kwargs)


def web(name: str, node_name: str, spec: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    raw = pod(name, node_name, owner="web", **kwargs)
    raw["metadata"]["labels"] = {"app": "web"}
    raw["spec"] |= spec or {}
    return raw


def round_of(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], usage: dict[str, PodUsage]) -> RoundResult:
    detectors: dict[str, Detector] = {}
    return run_round(nodes, pods, usage, POLICY, ARGS, detectors, NOW)


def planned(result: RoundResult) -> list[tuple[str, str | None]]:
    return [(e.pod.name, e.target) for e in result.plan.evictions]


def test_required_node_affinity_is_honoured():
    affinity = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["a"]}]}]
                }
            }
        }
    }
    pods = [web("a", "hot", affinity)]
    usage = {"default/a": PodUsage(3, GIB)}
    elsewhere = round_of([zoned("hot", "a", 0.9), zoned("cool-b", "b", 0.1)], pods, usage)
    assert planned(elsewhere) == [] and elsewhere.plan.skipped == {"no-target": 1}
    fits = round_of([zoned("hot", "a", 0.9), zoned("cool-b", "b", 0.1), zoned("cool-a", "a", 0.2)], pods, usage)
    assert planned(fits) == [("a", "cool-a")]


def test_inter_pod_anti_affinity_is_honoured():
    term = {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": HOST}
    anti = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}
    usage = {"default/a": PodUsage(3, GIB)}
    nodes = [zoned("hot", "a", 0.9), zoned("cool", "a", 0.1)]
    taken = round_of(nodes, [web("a", "hot", anti), web("b", "cool", anti)], usage)
    assert planned(taken) == [] and taken.plan.skipped["no-target"] == 1
    assert planned(round_of(nodes, [web("a", "hot", anti)], usage)) == [("a", "cool")]


def test_topology_spread_is_honoured_without_the_evicted_pod():
    spread = {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}},
            }
        ]
    }
    # zone a holds the evicted pod only, zone b two others: once it is gone, zone b would be 3 against 0
    pods = [web("a", "hot", spread), web("b1", "cool-b", spread), web("b2", "cool-b", spread)]
    usage = {"default/a": PodUsage(3, GIB)}
    only_b = round_of([zoned("hot", "a", 0.9), zoned("cool-b", "b", 0.1)], pods, usage)
    assert planned(only_b) == [] and only_b.plan.skipped["no-target"] == 1
    with_a = round_of([zoned("hot", "a", 0.9), zoned("cool-b", "b", 0.1), zoned("cool-a", "a", 0.3)], pods, usage)
    assert planned(with_a) == [("a", "cool-a")]


def test_a_pod_whose_volumes_the_descheduler_cannot_see_is_not_evicted():
    claim = {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}
    result = round_of(
        [zoned("hot", "a", 0.9), zoned("cool", "a", 0.1)], [web("a", "hot", claim)], {"default/a": PodUsage(3, GIB)}
    )
    assert planned(result) == [] and result.plan.skipped == {"no-target": 1}


def test_pods_planned_earlier_in_the_round_count_on_their_target():
    # room for one 3-CPU pod on the only cool node: the second hot node's pod has nowhere to go
    nodes = [zoned("h1", "a", 0.95), zoned("h2", "a", 0.95), zoned("cool", "a", 0.05, cores=4)]
    pods = [pod("p1", "h1", owner="w1", cpu="3"), pod("p2", "h2", owner="w2", cpu="3")]
    usage = {"default/p1": PodUsage(2.5, GIB), "default/p2": PodUsage(2.5, GIB)}
    wide = Limits(per_node_per_round=5, per_namespace_per_round=5, max_unavailable_per_workload=1, per_minute=10)
    result = run_round(nodes, pods, usage, replace(POLICY, limits=wide), ARGS, {}, NOW)
    assert len(result.plan.evictions) == 1 and result.plan.evictions[0].target == "cool"
    assert result.plan.skipped["no-target"] == 1


def test_the_snapshot_follows_the_cluster_from_round_to_round_and_forgets_each_round_s_plan():
    snapshot = SchedulerSnapshot()
    nodes = [zoned("hot", "a", 0.9), zoned("cool", "a", 0.1, cores=4)]
    pods = [pod("p1", "hot", owner="w1", cpu="3")]
    usage = {"default/p1": PodUsage(2.5, GIB)}

    def again(pods: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
        return planned(run_round(nodes, pods, usage, POLICY, ARGS, {}, NOW, snapshot=snapshot))

    # the replacement planned onto "cool" in the first round is not there in the second
    assert again(pods) == again(pods) == [("p1", "cool")]
    filler = pod("filler", "cool", owner="f", cpu="2")  # 3 + 2 cores requested > 4
    assert again([*pods, filler]) == []
    assert again(pods) == [("p1", "cool")]  # gone again


def test_a_drains_replacement_that_the_scheduler_would_send_to_an_excluded_node_is_not_evicted() -> None:
    """The scheduler ranks every node that passes its Filter, the ones the descheduler sends nothing to too (hot,
    or being emptied): when its best is one of those, the drained pod's replacement would land there."""
    nodes = [
        node("A", cpu=0.1, mem=0.05, labels={"zone": "x"}),
        node("B", cpu=0.3, mem=0.3, labels={"zone": "x"}),
        node("C", cpu=0.45, mem=0.45, labels={"zone": "x"}),
        node("D", cpu=0.5, mem=0.5),
    ]
    a = pod("a", "A", owner="a", affinity=zone_affinity("x"))
    pods = [a, pod("b", "B", cpu="1", owner="b"), pod("c", "C", cpu="6", owner="c")]
    pack = DynamicArgs(replace(scheduler_default(), scoring=ScoringPolicy("pack", 0.6)))
    targets = SchedulerTargets(SchedulerSnapshot(), nodes, pods, pack, NOW.timestamp(), {"B"})
    try:
        assert targets.find(pod_view(a), "A", drain=True) == (None, "would-go-excluded")
        targets.hot = set()
        assert targets.find(pod_view(a), "A", drain=True) == ("B", None)  # B is the scheduler's best
    finally:
        targets.close()
