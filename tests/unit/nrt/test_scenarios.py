"""The reference page's 14 scenarios (crane-nrt.md §6): upstream's outcome, or the documented better one.

Fixture F (upstream's tests): NRT Static/SingleNUMANodePodLevel, zones node1 alloc 2.5 cpu/4Gi, node2 3.9 cpu/4Gi.
"Used a/b" = CPUs other pods' results hold on node1/node2, given by their annotation or only assumed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.framework import Diagnosis
from crane_scheduler.plugins.noderesourcetopology.model import ANNOTATION_RESULT, ZoneResult, encode_result
from crane_scheduler.plugins.noderesourcetopology.plugin import (
    FAILED_TO_GET_NRT,
    INSUFFICIENT_ACROSS,
    INSUFFICIENT_NUMA,
    NAME,
)
from crane_scheduler.podinfo import parse_pod
from tests.support.nrt import F_ZONES, NOW, Setup, cpus, decide, guaranteed, nrt


def used(setup: Setup, node: str, *results: list[tuple[str, dict[str, int]]], assumed: bool = False) -> None:
    """Other pods on ``node`` holding ``results``: bound with the annotation, or only assumed by this scheduler."""
    for i, result in enumerate(results):
        if assumed:
            info = parse_pod(guaranteed("1", name=f"assumed{i}"))
            setup.table.assume(info, node)
            setup.plugin.usage.assume(info.uid, node, tuple(ZoneResult(z, c) for z, c in result), NOW)
            setup.plugin._usage_changed({node})
        else:
            setup.bind(guaranteed("1", name=f"bound{i}", result=result), node)


def fixture_f(**kw: str) -> Setup:
    s = Setup("n1")
    s.topology(nrt("n1", F_ZONES, **kw))
    return s


@pytest.mark.parametrize("assumed", [False, True], ids=["annotation", "assumed-cache"])
def test_1_aware_pod_goes_to_the_zone_with_most_free_cpu(assumed: bool) -> None:
    s = fixture_f()
    used(s, "n1", [("node1", cpus(1))], [("node2", cpus(1))], assumed=assumed)
    pod = guaranteed("1", aware="true")
    state, rejected = s.filter(pod)
    assert rejected == {}
    assert s.score(state, pod, "n1") == [100]
    assert s.reserve(state, pod, "n1").success
    assert s.result(state) == [("node2", {"cpu": 1000})]


@pytest.mark.parametrize("assumed", [False, True], ids=["annotation", "assumed-cache"])
def test_2_aware_pod_no_zone_left(assumed: bool) -> None:
    s = fixture_f()
    used(s, "n1", [("node1", cpus(2))], [("node2", cpus(4))], assumed=assumed)
    _, rejected = s.filter(guaranteed("1", aware="true"))
    assert rejected == {"n1": INSUFFICIENT_NUMA}


@pytest.mark.parametrize("assumed", [False, True], ids=["annotation", "assumed-cache"])
def test_3_node_default_awareness_rejects_2_cpus(assumed: bool) -> None:
    s = fixture_f()
    used(s, "n1", [("node1", cpus(1))], [("node2", cpus(3))], assumed=assumed)
    _, rejected = s.filter(guaranteed("2"))
    assert rejected == {"n1": INSUFFICIENT_NUMA}


def test_4_memory_aware_rejects_when_zone_memory_is_used() -> None:
    s = Setup("n1", resources=["cpu", "memory"])
    s.topology(nrt("n1", F_ZONES))
    gi = 1024**3
    used(s, "n1", [("node1", {"cpu": 1000, "memory": 3 * gi})], [("node2", {"cpu": 1000, "memory": 3 * gi})])
    _, rejected = s.filter(guaranteed("2", "2Gi", aware="true"))
    assert rejected == {"n1": INSUFFICIENT_NUMA}
    _, rejected = s.filter(guaranteed("1", "1Gi", aware="true"))
    assert rejected == {}, "1Gi still fits next to 3Gi of 4Gi"


async def test_5_kubelet_managed_node_passes_without_result_or_patch() -> None:
    s = fixture_f(cpu_policy="None")
    used(s, "n1", [("node1", cpus(2))], [("node2", cpus(4))])
    pod = guaranteed("2")
    state, rejected = s.filter(pod)
    assert rejected == {}
    assert s.score(state, pod, "n1") == [0]
    assert s.reserve(state, pod, "n1").success
    assert s.result(state) is None
    # PreBind with nothing to write makes no API call (there is no API client here: a call would be an error)
    assert (await s.plugin.pre_bind(state, parse_pod(pod), "n1")).success


def test_6_not_aware_pod_short_of_cpus_is_rejected_instead_of_a_partial_result() -> None:
    """Upstream: pass with [node1 cpu 1] (the agent pins 1 CPU for a 2-CPU limit). Better: reject."""
    s = fixture_f(topology_policy="None")
    used(s, "n1", [("node1", cpus(1))], [("node2", cpus(3))])
    _, rejected = s.filter(guaranteed("2"))
    assert rejected == {"n1": INSUFFICIENT_ACROSS}


def test_7_cross_zone_pods_count_on_every_zone_they_name() -> None:
    s = fixture_f()
    used(s, "n1", [("node1", cpus(1))], [("node1", cpus(1)), ("node2", cpus(1))])
    pod = guaranteed("2")
    state, rejected = s.filter(pod)
    assert rejected == {}
    assert s.reserve(state, pod, "n1").success
    assert s.result(state) == [("node2", {"cpu": 2000})]

    s = fixture_f()
    used(s, "n1", [("node1", cpus(1))], [("node1", cpus(1)), ("node2", cpus(2))])
    _, rejected = s.filter(guaranteed("2"))
    assert rejected == {"n1": INSUFFICIENT_NUMA}


def test_8_not_aware_pod_spans_zones_and_scores_50() -> None:
    s = fixture_f(topology_policy="None")
    used(s, "n1", [("node1", cpus(1)), ("node2", cpus(1))], [("node2", cpus(1))])
    pod = guaranteed("2")
    state, rejected = s.filter(pod)
    assert rejected == {}
    assert s.score(state, pod, "n1") == [50]
    assert s.reserve(state, pod, "n1").success
    assert s.result(state) == [("node1", cpus(1)), ("node2", cpus(1))]


def test_9_spread_floors_zones_to_whole_cores_and_sorts_entries_by_name() -> None:
    s = Setup("n1")
    s.topology(nrt("n1", [("node0", "3.5"), ("node1", "2")], topology_policy="None"))
    pod = guaranteed("5")
    state, rejected = s.filter(pod)
    assert rejected == {}
    assert s.score(state, pod, "n1") == [50]
    assert s.reserve(state, pod, "n1").success
    assert s.result(state) == [("node0", cpus(3)), ("node1", cpus(2))]

    s = Setup("n1")
    s.topology(nrt("n1", [("node2", "2"), ("node10", "3")], topology_policy="None"))
    pod = guaranteed("4")
    state, _ = s.filter(pod)
    assert s.reserve(state, pod, "n1").success
    assert s.result(state) == [("node10", cpus(3)), ("node2", cpus(1))]  # string order, as upstream writes it


def test_10_node_without_nrt_rejects_target_pods() -> None:
    s = Setup("n1")
    _, rejected = s.filter(guaranteed("2"))
    assert rejected == {"n1": FAILED_TO_GET_NRT}


@pytest.mark.parametrize(
    "pod",
    [
        guaranteed("2", cpu_policy="none"),
        guaranteed("1500m"),
        guaranteed("2", owner="DaemonSet"),
        {
            "metadata": {"name": "limit-only", "namespace": "ns", "uid": "u-limit"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "2"}}}]},
        },
        {
            "metadata": {"name": "burstable", "namespace": "ns", "uid": "u-b"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}}]},
        },
    ],
    ids=["cpu-policy-none", "fractional", "daemonset", "limit-only", "request-below-limit"],
)
def test_10_pods_without_targets_pass_without_result(pod: dict[str, Any]) -> None:
    s = Setup("n1")  # no NRT at all: a non-target pod does not care
    state, rejected = s.filter(pod)
    assert rejected == {}
    assert s.score(state, pod, "n1") == [0]
    assert s.reserve(state, pod, "n1").success
    assert s.result(state) is None


def test_10_cpu_missing_from_aware_resources_makes_the_plugin_inert() -> None:
    s = Setup("n1", resources=["memory"])
    state, rejected = s.filter(guaranteed("2", "1Gi"))
    assert rejected == {}
    assert s.result(state) is None


def test_11_pod_annotation_overrides_the_node_policy() -> None:
    s = Setup("n1")
    s.topology(nrt("n1", [("node0", "2"), ("node1", "2")], topology_policy="None"))
    _, rejected = s.filter(guaranteed("3", aware="TRUE"))
    assert rejected == {"n1": INSUFFICIENT_NUMA}
    _, rejected = s.filter(guaranteed("3"))  # the node's default (None) lets it span both zones
    assert rejected == {}
    _, rejected = s.filter(guaranteed("2", aware="TRUE"))
    assert rejected == {}


def test_11_aware_pod_and_zero_zones() -> None:
    s = Setup("n1")
    s.topology(nrt("n1", []))
    _, rejected = s.filter(guaranteed("1"))
    assert rejected == {"n1": INSUFFICIENT_NUMA}


def test_12_not_aware_pod_on_full_zones_is_rejected_not_crashing_score_or_reserve() -> None:
    """Upstream: Filter passes with an empty result; Score divides by zero (>= 2 nodes) or Reserve errors."""
    s = Setup("n1", "n2", "n3")
    for n in ("n1", "n2"):
        s.topology(nrt(n, [("node0", "1")], topology_policy="None"))
        used(s, n, [("node0", cpus(1))])
    s.topology(nrt("n3", [], topology_policy="None"))
    pod = guaranteed("2")
    state, rejected = s.filter(pod)
    assert rejected == {"n1": INSUFFICIENT_ACROSS, "n2": INSUFFICIENT_ACROSS, "n3": INSUFFICIENT_ACROSS}
    assert s.score(state, pod, "n1", "n2", "n3") == [0, 0, 0]  # never a division by zero
    result, _ = decide(s, pod)
    assert isinstance(result, Diagnosis)
    assert result.message == "0/3 nodes are available: 3 node(s) had insufficient resource across NUMA nodes."


@pytest.mark.parametrize("zones", [2, 8])
def test_13_tie_goes_to_the_first_zone_in_nrt_order(zones: int) -> None:
    """Upstream's Go sort kept NRT order only for up to 6 zones; here for any number."""
    s = Setup("n1")
    s.topology(nrt("n1", [(f"node{i}", "4") for i in range(zones)]))
    pod = guaranteed("2")
    state, _ = s.filter(pod)
    assert s.reserve(state, pod, "n1").success
    assert s.result(state) == [("node0", cpus(2))]


def test_14_memory_is_recorded_in_bytes_with_upstream_keys() -> None:
    """Upstream wrote "memory":"2000" (the CPU's number) for 2 CPUs/4Gi."""
    s = Setup("n1", resources=["cpu", "memory"])
    s.topology(nrt("n1", [("node0", "4", "8Gi")]))
    pod = guaranteed("2", "4Gi")
    state, _ = s.filter(pod)
    assert s.reserve(state, pod, "n1").success
    chosen = state["NodeResourceTopologyMatch.result"][1]
    assert encode_result(chosen) == (
        '[{"name":"node0","type":"Node","resources":{"capacity":{"cpu":"2","memory":"4Gi"}}}]'
    )
    # the bound pod carries it (replacing the assumed entry) and is counted in bytes: 4Gi more fit, 5Gi do not
    pod["metadata"]["annotations"] = {ANNOTATION_RESULT: encode_result(chosen)}
    s.bind(pod, "n1")
    assert not s.plugin.usage.is_assumed(pod["metadata"]["uid"])
    _, rejected = s.filter(guaranteed("1", "4Gi", name="b"))
    assert rejected == {}
    _, rejected = s.filter(guaranteed("1", "5Gi", name="c"))
    assert rejected == {"n1": INSUFFICIENT_NUMA}


@pytest.mark.parametrize("aware", ["true", "false"])
def test_14_scalars_are_ordinary_zone_resources_and_never_panic(aware: str) -> None:
    """Upstream panicked (nil map) when a non-aware target pod requested an aware scalar."""
    s = Setup("n1", resources=["cpu", "hugepages-1Gi", "example.com/gpu"])
    s.topology(
        nrt(
            "n1",
            [
                ("node0", {"cpu": "4", "hugepages-1Gi": "2Gi", "example.com/gpu": "1"}),
                ("node1", {"cpu": "4", "hugepages-1Gi": "2Gi", "example.com/gpu": "1"}),
            ],
        )
    )
    pod = guaranteed("2", aware=aware, extra={"hugepages-1Gi": "1Gi", "example.com/gpu": "1"})
    state, rejected = s.filter(pod)
    assert rejected == {}
    assert s.reserve(state, pod, "n1").success
    assert s.result(state) == [("node0", {"cpu": 2000, "hugepages-1Gi": 1024**3, "example.com/gpu": 1})]
    assert json.loads(encode_result(state["NodeResourceTopologyMatch.result"][1]))[0]["resources"]["capacity"] == {
        "cpu": "2",
        "example.com/gpu": "1",
        "hugepages-1Gi": "1Gi",
    }
    # a third GPU pod finds no zone with a GPU left
    s.bind(guaranteed("1", name="g1", extra={"example.com/gpu": "1"}, result=[("node1", {"example.com/gpu": 1})]), "n1")
    s.bind(guaranteed("1", name="g0", extra={"example.com/gpu": "1"}, result=[("node0", {"example.com/gpu": 1})]), "n1")
    _, rejected = s.filter(guaranteed("1", aware=aware, extra={"example.com/gpu": "1"}))
    assert rejected == {"n1": INSUFFICIENT_NUMA if aware == "true" else INSUFFICIENT_ACROSS}


def test_fit_error_groups_reasons_as_kube_scheduler() -> None:
    s = Setup("a", "b", "c", "d")
    s.topology(nrt("b", [("node0", "2")]))
    s.topology(nrt("c", [("node0", "2")]))
    s.topology(nrt("d", [("node0", "4")], cpu_policy="None"))
    result, _ = decide(s, guaranteed("4"))
    assert isinstance(result, ScheduleResult) and result.node == "d"
    s.topology(nrt("d", [("node0", "2")]))
    result, _ = decide(s, guaranteed("4"))
    assert isinstance(result, Diagnosis)
    assert result.message == (
        "0/4 nodes are available: 1 node(s) failed to get NRT, 3 node(s) had insufficient resource of NUMA node."
    )
    assert result.rejectors == {"NodeResourceTopologyMatch"}


def test_score_prefers_one_zone_over_two() -> None:
    s = Setup("one", "two")
    s.topology(nrt("one", [("node0", "4"), ("node1", "4")], topology_policy="None"))
    s.topology(nrt("two", [("node0", "2"), ("node1", "2")], topology_policy="None"))
    result, state = decide(s, guaranteed("3"))
    assert isinstance(result, ScheduleResult) and result.node == "one"
    rows, per_plugin = state["explain.scores"]
    scores = dict(zip((s.table.names[r] for r in rows), next(x for n, _, x in per_plugin if n == NAME), strict=True))
    assert scores == {"one": 100, "two": 50}


def test_upstreams_shipped_configuration_loads() -> None:
    """Upstream's deploy: the plugin at all five points, Score weight 2, args with apiVersion/kind."""
    from crane_scheduler.simulate import Simulator

    points: dict[str, Any] = {p: {"enabled": [{"name": NAME}]} for p in ("preFilter", "filter", "reserve", "preBind")}
    points["score"] = {"enabled": [{"name": NAME, "weight": 2}]}
    config = {
        "profiles": [
            {
                "schedulerName": "default-scheduler",
                "plugins": points,
                "pluginConfig": [
                    {
                        "name": NAME,
                        "args": {
                            "apiVersion": "kubescheduler.config.k8s.io/v1beta2",
                            "kind": "NodeResourceTopologyMatchArgs",
                            "topologyAwareResources": ["cpu"],
                        },
                    }
                ],
            }
        ]
    }
    profile = Simulator(config, out_of_tree=False).profiles["default-scheduler"]
    assert [w for p, w in profile.score if p.name == NAME] == [2]
    for point in ("pre_filter", "filter", "reserve", "pre_bind"):
        assert NAME in [p.name for p in getattr(profile, point)], point


def test_preemption_frees_a_victims_numa_zone_in_its_what_if() -> None:
    """One 4-CPU zone held by a lower-priority pod: a 4-CPU pod of higher priority preempts it (upstream's Filter
    counts the node's pods, so the victims' zones are free in the dry run), as without NUMA."""
    from crane_scheduler.simulate import Simulator
    from tests.support.nrt import nrt as nrt_object
    from tests.support.scheduler import node

    points: dict[str, Any] = {p: {"enabled": [{"name": NAME}]} for p in ("preFilter", "filter", "reserve", "preBind")}
    config = {
        "profiles": [
            {
                "schedulerName": "default-scheduler",
                "plugins": points,
                "pluginConfig": [{"name": NAME, "args": {"topologyAwareResources": ["cpu"]}}],
            }
        ]
    }
    sim = Simulator(config, out_of_tree=False)
    sim.add({**node("n1", cpu="8", memory="32Gi"), "kind": "Node"})
    sim.plugin(NAME).set_topology(nrt_object("n1", [("node0", "4")]))  # type: ignore[attr-defined]
    low = guaranteed("4", name="low", result=[("node0", cpus(4))])
    low["spec"]["nodeName"] = "n1"
    sim.add({**low, "kind": "Pod"})
    vip = guaranteed("4", name="vip")
    vip["spec"]["priority"] = 1000
    placed = sim.place(vip)
    assert placed.node is None and placed.preemption is not None
    assert (placed.preemption.node, placed.preemption.victims) == ("n1", ("ns/low",))
    assert sim.place(guaranteed("4", name="other")).node is None  # the what-if was undone
